"""PL/pgSQL functions for the hot paths on PostgreSQL, created by migrations.

Why functions: at Django's defaults (no ``prepare_threshold``, and always
behind a transaction-pooling PgBouncer) every statement a client sends is
parsed and planned anew, and for the worker's one-row statements planning
costs PostgreSQL about as much CPU as running them. PL/pgSQL caches the plans
of the statements inside a function for the life of the session, so a call
costs one parse of ``SELECT * FROM outbox_step(...)`` and runs cached plans.
The saving is the same as with prepared statements, without needing them.

What they do is exactly what the plain statements in ``outbox/worker/sql.py``
do (``tests/test_plpgsql.py`` runs every transition both ways and compares the
rows): each UPDATE is still one conditional write on one row, found by primary
key, with the status it must be in repeated in its WHERE clause. A function
call in autocommit is one transaction, so the success of one email and the
claim of the next still commit together or not at all.

The table names and the status values are written out as literals: they are the values of
``Delivery.Status``, stored in the rows, and changing one would need a data
migration anyway.

Each DDL text here is frozen once a migration uses it: a change to a function
is a new constant (``..._V2``) and a new migration, so that migrating an old
database replays the history it had.
"""

from __future__ import annotations

from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

# The worker's step (outbox/worker/sql.py): step 4 (success) of the message in hand, then step 2 (claim)
# of the next one, then the next one's content unless the worker has it cached.
# Either half may be skipped by passing NULL ids. The status tests are written
# ``(status = ...) IS TRUE`` for the reason given next to the plain statements
# in outbox/worker/sql.py: no partial index may serve them.
STEP_V1 = """
CREATE OR REPLACE FUNCTION outbox_step(
    p_settle_id bigint, p_settle_token uuid,
    p_claim_id bigint, p_worker varchar, p_token uuid,
    p_now timestamptz, p_known bigint, p_expired_error text,
    OUT settled integer,
    OUT email_id bigint, OUT recipient varchar, OUT priority varchar,
    OUT attempts integer, OUT max_attempts integer, OUT message_id varchar,
    OUT subject text, OUT body text, OUT html_message text, OUT from_email varchar,
    OUT reply_to jsonb, OUT headers jsonb, OUT has_attachments boolean,
    OUT claimed_status varchar
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    settled := 0;
    IF p_settle_id IS NOT NULL THEN
        UPDATE outbox_delivery AS d
        SET status = 'sent', sent_at = p_now, updated_at = p_now, last_error = ''
        WHERE d.id = p_settle_id AND (d.status = 'processing') IS TRUE
            AND d.claim_token = p_settle_token;
        GET DIAGNOSTICS settled = ROW_COUNT;
    END IF;
    IF p_claim_id IS NULL THEN
        RETURN;
    END IF;
    -- A row past its expires_at is claimed into 'cancelled' instead, without
    -- counting an attempt; the caller drops it unsent.
    UPDATE outbox_delivery AS d
    SET status = CASE WHEN d.expires_at <= now() THEN 'cancelled' ELSE 'processing' END,
        last_error = CASE WHEN d.expires_at <= now() THEN p_expired_error ELSE d.last_error END,
        worker_id = p_worker, claim_token = p_token,
        processing_started_at = p_now, updated_at = p_now,
        attempts = d.attempts + CASE WHEN d.expires_at <= now() THEN 0 ELSE 1 END
    WHERE d.id = p_claim_id AND (d.status = 'queued') IS TRUE AND d.not_before <= now()
    RETURNING d.email_id, d.recipient, d.priority, d.attempts, d.max_attempts, d.message_id,
        d.status
    INTO email_id, recipient, priority, attempts, max_attempts, message_id, claimed_status;
    IF NOT FOUND OR claimed_status <> 'processing' OR email_id = p_known THEN
        RETURN;
    END IF;
    SELECT e.subject, e.body, e.html_message, e.from_email, e.reply_to, e.headers,
        EXISTS (SELECT 1 FROM outbox_attachment a WHERE a.email_id = e.id)
    INTO subject, body, html_message, from_email, reply_to, headers, has_attachments
    FROM outbox_email e WHERE e.id = email_id;
END
$$
"""

DROP_STEP = (
    "DROP FUNCTION IF EXISTS outbox_step("
    "bigint, uuid, bigint, varchar, uuid, timestamptz, bigint, text)"
)


# enqueue_email's common case (no idempotency key, no attachments): the email
# and one delivery per recipient, the suppression list looked up in the same
# INSERT (a suppressed recipient's row is written cancelled, with the text
# outbox.suppression.reason gives elsewhere). The recipients travel as arrays;
# RETURNING is matched back by Message-ID, so no row order is assumed.
ENQUEUE_V1 = """
CREATE OR REPLACE FUNCTION outbox_enqueue(
    p_subject text, p_body text, p_html text, p_from varchar, p_reply_to jsonb,
    p_headers jsonb, p_now timestamptz, p_priority varchar, p_max_attempts integer,
    p_not_before timestamptz, p_expires_at timestamptz,
    p_recipients text[], p_message_ids text[], p_bare text[]
) RETURNS TABLE (id bigint, email_id bigint, message_id varchar, last_error text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    new_email bigint;
BEGIN
    INSERT INTO outbox_email AS e (subject, body, html_message, from_email, reply_to, headers,
        created_at)
    VALUES (p_subject, p_body, p_html, p_from, p_reply_to, p_headers, p_now)
    RETURNING e.id INTO new_email;
    RETURN QUERY
    INSERT INTO outbox_delivery AS d (email_id, recipient, status, priority, attempts,
        max_attempts, not_before, expires_at, worker_id, message_id, last_error, created_at,
        updated_at)
    SELECT new_email, r.recipient,
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

DROP_ENQUEUE = (
    "DROP FUNCTION IF EXISTS outbox_enqueue(text, text, text, varchar, jsonb, jsonb, "
    "timestamptz, varchar, integer, timestamptz, timestamptz, text[], text[], text[])"
)


def run_on_postgresql(sql: str) -> object:
    """A RunPython callable that runs ``sql`` on PostgreSQL and does nothing elsewhere."""

    def run(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run
