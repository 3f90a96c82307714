"""The PL/pgSQL functions of PostgreSQL's hot path, created by this migration alone.

On PostgreSQL the worker's step and ``enqueue_email``'s insert always call
these functions (:mod:`outbox.statements.postgresql` says why, and
``tests/benchmark/results/paths-postgres.md`` has the measurement). Earlier
migrations created earlier versions of them, only while a setting allowed it
(retired with the plain statements); their function operations are gone, so
this one drops every signature any earlier version had and creates the
current four, whatever the database had before: none (migrated with the
setting off), or older versions. Elsewhere than on PostgreSQL it does nothing.

The DDL is text in this file, never imported: a migration runs as it shipped.
The role that migrates needs the CREATE privilege on the schema, as for the
tables.

``outbox_enqueue`` and ``outbox_enqueue_one`` take the email's ``structure``
(a message of the drop-in backend) as a last parameter, a new signature. The
previous release's enqueue functions (without it) are kept beside them: its web
processes call them between this migration and their restart, and must go on
enqueueing; a later release's migration drops them. Its workers keep working
too: ``outbox_step`` and ``outbox_steps`` keep their signatures and columns.
"""

from django.db import migrations

# Every signature an earlier version had, and the current ones (so that the
# forward operation may run again).
DROP_STEP = (
    "DROP FUNCTION IF EXISTS outbox_step("
    "bigint, uuid, bigint, varchar, uuid, timestamptz, bigint, text)"
)
DROP_STEPS = (
    "DROP FUNCTION IF EXISTS outbox_steps("
    "bigint[], uuid[], bigint[], varchar[], uuid[], timestamptz[], bigint[], text)"
)
DROP_ENQUEUE = (
    "DROP FUNCTION IF EXISTS outbox_enqueue(text, text, text, varchar, jsonb, jsonb, "
    "timestamptz, varchar, integer, timestamptz, timestamptz, text[], text[], text[], varchar, "
    "jsonb)"
)
DROP_ENQUEUE_ONE = (
    "DROP FUNCTION IF EXISTS outbox_enqueue_one(text, text, text, varchar, jsonb, jsonb, "
    "timestamptz, varchar, integer, timestamptz, timestamptz, text, text, text, varchar, jsonb)"
)

# The worker's step: the success of the message in hand (step 4) and the mark
# of the next one (step 2) with its content. Both functions are as
# outbox.transitions.hotpath.step_function rendered them from outbox.transitions.table when
# this migration was written (tests/transitions/test_table.py compares them).
OUTBOX_STEP = """
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
        WHERE id = p_settle_id AND (status IN ('processing')) IS TRUE AND claim_token = p_settle_token;
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
    WHERE id = p_claim_id AND (status IN ('queued')) IS TRUE AND not_before <= now()
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
$$
"""

# Several threads' steps (the worker's group commit) as two set-based UPDATEs;
# why each step's row is what it would be alone:
# outbox.transitions.hotpath.steps_function.
OUTBOX_STEPS = """
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
        WHERE id = x.settle_id AND (status IN ('processing')) IS TRUE AND claim_token = x.settle_token
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
        WHERE id = x.claim_id AND (status IN ('queued')) IS TRUE AND not_before <= now()
        RETURNING id, claim_token, email_id, recipient, priority, attempts, max_attempts, message_id, status
    )
    SELECT (SELECT count(*) FROM done WHERE done.n = x.n)::integer,
        c.email_id, c.recipient, c.priority, c.attempts, c.max_attempts, c.message_id,
        e.subject, e.body, e.html_message, e.from_email, e.reply_to, e.headers, e.mailer,
        EXISTS (SELECT 1 FROM outbox_attachment a WHERE a.email_id = e.id),
        c.status, e.structure
    FROM x
    LEFT JOIN claimed c ON c.id = x.claim_id AND c.claim_token = x.token
    LEFT JOIN outbox_email e ON e.id = c.email_id AND c.status = 'processing'
        AND e.id <> x.known
    ORDER BY x.n;
END
$$
"""

# enqueue_email's insert: the email (its structure too) and one delivery per
# recipient, each looked up in the suppression list by its normalised address
# (p_bare, written as recipient_key); a suppressed one is written cancelled,
# with the text outbox.suppression.suppressed gives elsewhere.
OUTBOX_ENQUEUE = """
CREATE OR REPLACE FUNCTION outbox_enqueue(
    p_subject text, p_body text, p_html text, p_from varchar, p_reply_to jsonb,
    p_headers jsonb, p_now timestamptz, p_priority varchar, p_max_attempts integer,
    p_not_before timestamptz, p_expires_at timestamptz,
    p_recipients text[], p_message_ids text[], p_bare text[], p_mailer varchar,
    p_structure jsonb
) RETURNS TABLE (id bigint, email_id bigint, message_id varchar, last_error text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    new_email bigint;
BEGIN
    INSERT INTO outbox_email AS e (subject, body, html_message, from_email, reply_to, headers,
        mailer, structure, created_at)
    VALUES (p_subject, p_body, p_html, p_from, p_reply_to, p_headers, p_mailer, p_structure,
        p_now)
    RETURNING e.id INTO new_email;
    RETURN QUERY
    INSERT INTO outbox_delivery AS d (email_id, recipient, recipient_key, status, priority,
        attempts, max_attempts, not_before, expires_at, worker_id, message_id, last_error,
        created_at, updated_at)
    SELECT new_email, r.recipient, r.bare,
        CASE WHEN s.address IS NULL THEN 'queued' ELSE 'cancelled' END,
        p_priority, 0, p_max_attempts, p_not_before, p_expires_at, '', r.message_id,
        CASE WHEN s.address IS NULL THEN '' ELSE left('suppressed: ' || s.address
            || ' is on the suppression list (' || s.source || ')'
            || CASE WHEN s.reason = '' THEN '' ELSE ': ' || s.reason END, 2000) END,
        p_now, p_now
    FROM unnest(p_recipients, p_message_ids, p_bare) AS r(recipient, message_id, bare)
    LEFT JOIN outbox_suppression s ON s.address = r.bare
    RETURNING d.id, d.email_id, d.message_id, d.last_error;
END
$$
"""

# OUTBOX_ENQUEUE for one recipient, row for row (the suppression text too).
# Returns {delivery id, email id, why it is suppressed or ""}: one array, so
# that the call is a plain scalar call (see
# outbox.statements.postgresql.ENQUEUE_ONE_CALL).
OUTBOX_ENQUEUE_ONE = """
CREATE OR REPLACE FUNCTION outbox_enqueue_one(
    p_subject text, p_body text, p_html text, p_from varchar, p_reply_to jsonb,
    p_headers jsonb, p_now timestamptz, p_priority varchar, p_max_attempts integer,
    p_not_before timestamptz, p_expires_at timestamptz,
    p_recipient text, p_message_id text, p_bare text, p_mailer varchar,
    p_structure jsonb
) RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    s record;
    delivery_id bigint;
    new_email_id bigint;
    why text;
BEGIN
    INSERT INTO outbox_email AS e (subject, body, html_message, from_email, reply_to, headers,
        mailer, structure, created_at)
    VALUES (p_subject, p_body, p_html, p_from, p_reply_to, p_headers, p_mailer, p_structure,
        p_now)
    RETURNING e.id INTO new_email_id;
    why := '';
    SELECT x.address, x.source, x.reason INTO s
    FROM outbox_suppression x WHERE x.address = p_bare;
    IF FOUND THEN
        why := left('suppressed: ' || s.address
            || ' is on the suppression list (' || s.source || ')'
            || CASE WHEN s.reason = '' THEN '' ELSE ': ' || s.reason END, 2000);
    END IF;
    INSERT INTO outbox_delivery AS d (email_id, recipient, recipient_key, status, priority,
        attempts, max_attempts, not_before, expires_at, worker_id, message_id, last_error,
        created_at, updated_at)
    VALUES (new_email_id, p_recipient, p_bare,
        CASE WHEN why = '' THEN 'queued' ELSE 'cancelled' END,
        p_priority, 0, p_max_attempts, p_not_before, p_expires_at, '', p_message_id, why,
        p_now, p_now)
    RETURNING d.id INTO delivery_id;
    RETURN ARRAY[delivery_id::text, new_email_id::text, why];
END
$$
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    # The previous release's enqueue functions (15 arguments) are not dropped:
    # its web processes still call them (module docstring).
    for sql in (
        DROP_STEP,
        DROP_STEPS,
        DROP_ENQUEUE,
        DROP_ENQUEUE_ONE,
        OUTBOX_STEP,
        OUTBOX_STEPS,
        OUTBOX_ENQUEUE,
        OUTBOX_ENQUEUE_ONE,
    ):
        schema_editor.execute(sql)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for sql in (DROP_STEP, DROP_STEPS, DROP_ENQUEUE, DROP_ENQUEUE_ONE):
        schema_editor.execute(sql)


class Migration(migrations.Migration):
    dependencies = [
        ("outbox", "0016_attempt_esp_message_id"),
    ]

    operations = [
        migrations.RunPython(create, drop),
    ]
