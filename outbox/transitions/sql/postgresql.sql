-- Every statement that writes a delivery's status on PostgreSQL, as rendered from
-- outbox/transitions/table.py. Generated: do not edit. After a change to the table,
-- run `python -m outbox.transitions --write` (tests/transitions/test_sql.py fails until then).
-- %(name)s is a parameter the caller passes by name.

-- == The worker's, run as these statements (outbox.transitions.hotpath) ==

-- MARK ("mark"), hotpath.mark: the mark of one row (step 2)
UPDATE outbox_delivery SET
    status = CASE WHEN expires_at <= now() THEN 'cancelled' ELSE 'processing' END,
    last_error = CASE WHEN expires_at <= now() THEN %(expired)s ELSE last_error END,
    worker_id = %(worker)s,
    claim_token = %(token)s,
    processing_started_at = %(now)s,
    updated_at = %(now)s,
    attempts = CASE WHEN expires_at <= now() THEN attempts ELSE attempts + 1 END
WHERE id = %(claim_id)s
    AND (status IN ('queued')) IS TRUE
    AND not_before <= now()
RETURNING email_id, recipient, priority, attempts, max_attempts, message_id, status;

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
    AND not_before <= now()
    AND (expires_at IS NULL OR expires_at > now())
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

-- == PostgreSQL: SENT then MARK in one call (statements.postgresql) ==

-- hotpath.step_function: outbox_step: the success of one email (if any) and the claim of the next.
CREATE OR REPLACE FUNCTION outbox_step(
    p_settle_id bigint, p_settle_token uuid,
    p_claim_id bigint, p_worker varchar, p_token uuid,
    p_now timestamptz, p_known bigint, p_expired_error text,
    OUT settled integer,
    OUT email_id bigint,
    OUT recipient varchar,
    OUT priority varchar,
    OUT attempts integer,
    OUT max_attempts integer,
    OUT message_id varchar,
    OUT subject text,
    OUT body text,
    OUT html_message text,
    OUT from_email varchar,
    OUT reply_to jsonb,
    OUT headers jsonb,
    OUT mailer varchar,
    OUT has_attachments boolean,
    OUT claimed_status varchar,
    OUT structure jsonb
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    settled := 0;
    IF p_settle_id IS NOT NULL THEN
        UPDATE outbox_delivery SET
            status = 'sent',
            sent_at = p_now,
            updated_at = p_now,
            last_error = ''
        WHERE id = p_settle_id
            AND (status IN ('processing')) IS TRUE
            AND claim_token = p_settle_token;
        GET DIAGNOSTICS settled = ROW_COUNT;
    END IF;
    IF p_claim_id IS NULL THEN
        RETURN;
    END IF;
    UPDATE outbox_delivery SET
        status = CASE WHEN expires_at <= now() THEN 'cancelled' ELSE 'processing' END,
        last_error = CASE WHEN expires_at <= now() THEN p_expired_error ELSE last_error END,
        worker_id = p_worker,
        claim_token = p_token,
        processing_started_at = p_now,
        updated_at = p_now,
        attempts = CASE WHEN expires_at <= now() THEN attempts ELSE attempts + 1 END
    WHERE id = p_claim_id
        AND (status IN ('queued')) IS TRUE
        AND not_before <= now()
    RETURNING email_id, recipient, priority, attempts, max_attempts, message_id, status
    INTO email_id, recipient, priority, attempts, max_attempts, message_id, claimed_status;
    IF NOT FOUND OR claimed_status <> 'processing' OR email_id = p_known THEN
        RETURN;
    END IF;
    SELECT e.subject, e.body, e.html_message, e.from_email, e.reply_to, e.headers, e.mailer,
        EXISTS (SELECT 1 FROM outbox_attachment a WHERE a.email_id = e.id), e.structure
    INTO subject, body, html_message, from_email, reply_to, headers, mailer, has_attachments,
        structure
    FROM outbox_email e WHERE e.id = email_id;
END
$$;

-- hotpath.steps_function: outbox_steps: several threads' steps as two set-based UPDATEs, one row per step.
CREATE OR REPLACE FUNCTION outbox_steps(
    p_settle_ids bigint[], p_settle_tokens uuid[],
    p_claim_ids bigint[], p_workers varchar[], p_tokens uuid[],
    p_nows timestamptz[], p_knowns bigint[], p_expired_error text
) RETURNS TABLE (
    settled integer,
    email_id bigint,
    recipient varchar,
    priority varchar,
    attempts integer,
    max_attempts integer,
    message_id varchar,
    subject text,
    body text,
    html_message text,
    from_email varchar,
    reply_to jsonb,
    headers jsonb,
    mailer varchar,
    has_attachments boolean,
    claimed_status varchar,
    structure jsonb
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH x AS (
        SELECT * FROM unnest(p_settle_ids, p_settle_tokens, p_claim_ids, p_workers, p_tokens,
            p_nows, p_knowns)
            WITH ORDINALITY AS r(settle_id, settle_token, claim_id, worker, token, now, known, n)
    ), done AS (
        UPDATE outbox_delivery SET
            status = 'sent',
            sent_at = x.now,
            updated_at = x.now,
            last_error = ''
        FROM x
        WHERE id = x.settle_id
            AND (status IN ('processing')) IS TRUE
            AND claim_token = x.settle_token
        RETURNING x.n
    ), claimed AS (
        UPDATE outbox_delivery SET
            status = CASE WHEN expires_at <= now() THEN 'cancelled' ELSE 'processing' END,
            last_error = CASE WHEN expires_at <= now() THEN p_expired_error ELSE last_error END,
            worker_id = x.worker,
            claim_token = x.token,
            processing_started_at = x.now,
            updated_at = x.now,
            attempts = CASE WHEN expires_at <= now() THEN attempts ELSE attempts + 1 END
        FROM x
        WHERE id = x.claim_id
            AND (status IN ('queued')) IS TRUE
            AND not_before <= now()
        RETURNING id, claim_token, email_id, recipient, priority, attempts, max_attempts, message_id, status
    )
    SELECT (SELECT count(*) FROM done WHERE done.n = x.n)::integer, c.email_id, c.recipient,
        c.priority, c.attempts, c.max_attempts, c.message_id, e.subject, e.body, e.html_message,
        e.from_email, e.reply_to, e.headers, e.mailer,
        EXISTS (SELECT 1 FROM outbox_attachment a WHERE a.email_id = e.id), c.status,
        e.structure
    FROM x
    LEFT JOIN claimed c ON c.id = x.claim_id AND c.claim_token = x.token
    LEFT JOIN outbox_email e ON e.id = c.email_id AND c.status = 'processing'
        AND e.id <> x.known
    ORDER BY x.n;
END
$$;

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
    updated_at = now(),
    not_before = GREATEST(not_before, now()),
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
    updated_at = now(),
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
    updated_at = now(),
    not_before = %(now)s
WHERE id = %(id)s
    AND (status IN ('processing')) IS TRUE;

-- REQUEUE_NOT_SENT ("requeue not sent")
UPDATE outbox_delivery SET
    status = 'queued',
    claim_token = NULL,
    worker_id = '',
    updated_at = now(),
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
