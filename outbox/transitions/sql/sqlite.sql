-- Every statement that writes a delivery's status on SQLite, as rendered from
-- outbox/transitions/table.py. Generated: do not edit. After a change to the table,
-- run `python -m outbox.transitions --write` (tests/transitions/test_sql.py fails until then).
-- %(name)s is a parameter the caller passes by name.

-- == The worker's, run as these statements (outbox.transitions.hotpath) ==

-- MARK ("mark"), hotpath.mark: the mark of one row (step 2)
UPDATE outbox_delivery SET
    status = CASE WHEN expires_at <= %(now_instant)s THEN 'cancelled' ELSE 'processing' END,
    last_error = CASE WHEN expires_at <= %(now_instant)s THEN %(expired)s ELSE last_error END,
    worker_id = %(worker)s,
    claim_token = %(token)s,
    processing_started_at = %(now)s,
    updated_at = %(now)s,
    attempts = CASE WHEN expires_at <= %(now_instant)s THEN attempts ELSE attempts + 1 END
WHERE id = %(claim_id)s
    AND (status IN ('queued')) IS TRUE
    AND not_before <= %(now_instant)s
RETURNING email_id, recipient, priority, attempts, max_attempts, message_id, status,
    CASE WHEN email_id = %(known)s THEN NULL ELSE (
        SELECT json_object('subject', e.subject, 'body', e.body,
            'html_message', e.html_message, 'from_email', e.from_email,
            'reply_to', json(e.reply_to), 'headers', json(e.headers), 'mailer', e.mailer,
            'has_attachments', EXISTS (SELECT 1 FROM outbox_attachment a WHERE a.email_id = e.id),
            'structure', json(e.structure))
        FROM outbox_email e WHERE e.id = email_id
    ) END AS content;

-- SENT ("sent"), hotpath.sent: the success of one row (step 4)
UPDATE outbox_delivery SET
    status = 'sent',
    sent_at = %(now)s,
    updated_at = %(now)s,
    last_error = ''
WHERE id = %(settle_id)s
    AND (status IN ('processing')) IS TRUE
    AND claim_token = %(settle_token)s;

-- MARK_COMPANIONS ("mark companions"), hotpath.companions: a drop-in message's other rows, to an ESP
UPDATE outbox_delivery SET
    status = 'processing',
    worker_id = %(worker)s,
    claim_token = %(token)s,
    processing_started_at = %(now)s,
    updated_at = %(now)s,
    attempts = attempts + 1
WHERE email_id = %(email)s
    AND id <> %(id)s
    AND (status IN ('queued')) IS TRUE
    AND not_before <= %(now_instant)s
    AND (expires_at IS NULL OR expires_at > %(now_instant)s)
RETURNING id, email_id, recipient, priority, attempts, max_attempts, message_id;

-- RELEASE_COMPANIONS ("release companions"), hotpath.release_companions: those rows back, unsent
UPDATE outbox_delivery SET
    status = 'queued',
    attempts = attempts - 1,
    not_before = %(not_before)s,
    claim_token = NULL,
    worker_id = '',
    updated_at = %(now)s
WHERE email_id = %(email)s
    AND id <> %(id)s
    AND (status IN ('processing')) IS TRUE
    AND claim_token = %(token)s;

-- == Through the ORM's QuerySet.update() ==
-- Transition.apply on one row, outbox.operations.transition on many (with the caller's own
-- conditions): the same SET and WHERE as the statement shown, which tests/transitions/test_table.py
-- runs beside the ORM's update to compare the rows they write.

-- FAILED ("failed")
UPDATE outbox_delivery SET
    status = 'failed',
    last_error = %(error)s,
    updated_at = %(now)s
WHERE id = %(id)s
    AND (status IN ('processing')) IS TRUE
    AND claim_token = %(token)s;

-- IN_DOUBT ("in doubt")
UPDATE outbox_delivery SET
    status = 'abandoned',
    last_error = %(error)s,
    updated_at = %(now)s
WHERE id = %(id)s
    AND (status IN ('processing')) IS TRUE
    AND claim_token = %(token)s;

-- DROPPED ("dropped")
UPDATE outbox_delivery SET
    status = 'cancelled',
    attempts = attempts - 1,
    last_error = %(error)s,
    updated_at = %(now)s
WHERE id = %(id)s
    AND (status IN ('processing')) IS TRUE
    AND claim_token = %(token)s;

-- RETRY ("retry")
UPDATE outbox_delivery SET
    status = 'queued',
    not_before = %(retry_at)s,
    last_error = %(error)s,
    claim_token = NULL,
    worker_id = '',
    updated_at = %(now)s
WHERE id = %(id)s
    AND (status IN ('processing')) IS TRUE
    AND claim_token = %(token)s;

-- RELEASE ("release")
UPDATE outbox_delivery SET
    status = 'queued',
    attempts = attempts - 1,
    not_before = %(not_before)s,
    claim_token = NULL,
    worker_id = '',
    updated_at = %(now)s
WHERE id = %(id)s
    AND (status IN ('processing')) IS TRUE
    AND claim_token = %(token)s;

-- NOTE_SERVER ("note server")
UPDATE outbox_delivery SET
    status = 'processing',
    server_host = %(host)s,
    server_address = %(address)s
WHERE id = %(id)s
    AND (status IN ('processing')) IS TRUE
    AND claim_token = %(token)s;

-- REQUEUE ("requeue")
UPDATE outbox_delivery SET
    status = 'queued',
    claim_token = NULL,
    worker_id = '',
    updated_at = %(now)s,
    not_before = MAX(not_before, %(now_instant)s),
    attempts = 0,
    sent_at = NULL
WHERE id = %(id)s
    AND (status IN ('abandoned', 'failed', 'cancelled')) IS TRUE
    AND email_id IN (SELECT id FROM outbox_email WHERE content_cleared_at IS NULL);

-- REQUEUE_NOW ("requeue now")
UPDATE outbox_delivery SET
    status = 'queued',
    claim_token = NULL,
    worker_id = '',
    updated_at = %(now)s,
    not_before = %(now)s,
    attempts = 0,
    sent_at = NULL
WHERE id = %(id)s
    AND (status IN ('abandoned', 'failed', 'cancelled')) IS TRUE
    AND email_id IN (SELECT id FROM outbox_email WHERE content_cleared_at IS NULL);

-- REQUEUE_DEAD ("requeue dead")
UPDATE outbox_delivery SET
    status = 'queued',
    claim_token = NULL,
    worker_id = '',
    updated_at = %(now)s,
    not_before = %(now)s
WHERE id = %(id)s
    AND (status IN ('processing')) IS TRUE;

-- REQUEUE_NOT_SENT ("requeue not sent")
UPDATE outbox_delivery SET
    status = 'queued',
    claim_token = NULL,
    worker_id = '',
    updated_at = %(now)s,
    not_before = %(now)s
WHERE id = %(id)s
    AND (status IN ('abandoned')) IS TRUE;

-- ABANDON ("abandon")
UPDATE outbox_delivery SET
    status = 'abandoned',
    last_error = %(error)s,
    updated_at = %(now)s
WHERE id = %(id)s
    AND (status IN ('processing')) IS TRUE;

-- FAIL_DEAD ("fail dead")
UPDATE outbox_delivery SET
    status = 'failed',
    last_error = %(error)s,
    updated_at = %(now)s
WHERE id = %(id)s
    AND (status IN ('processing')) IS TRUE;

-- MARK_SENT ("mark sent")
UPDATE outbox_delivery SET
    status = 'sent',
    sent_at = %(now)s,
    last_error = '',
    updated_at = %(now)s
WHERE id = %(id)s
    AND (status IN ('abandoned')) IS TRUE;

-- MARK_FAILED ("mark failed")
UPDATE outbox_delivery SET
    status = 'failed',
    last_error = %(error)s,
    updated_at = %(now)s
WHERE id = %(id)s
    AND (status IN ('abandoned')) IS TRUE;

-- CANCEL ("cancel")
UPDATE outbox_delivery SET
    status = 'cancelled',
    updated_at = %(now)s
WHERE id = %(id)s
    AND (status IN ('queued', 'abandoned')) IS TRUE;

-- EXPIRE ("expire")
UPDATE outbox_delivery SET
    status = 'cancelled',
    last_error = %(error)s,
    updated_at = %(now)s
WHERE id = %(id)s
    AND (status IN ('queued')) IS TRUE;
