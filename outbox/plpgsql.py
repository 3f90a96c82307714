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

The status values are written out as literals: they are the values of
``Delivery.Status``, stored in the rows, and changing one would need a data
migration anyway.

Each DDL text here is frozen once a migration uses it: a change to a function
is a new constant (``..._V2``) and a new migration, so that migrating an old
database replays the history it had.
"""

from __future__ import annotations

from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

# The worker's step: step 4 (success) of the message in hand, then step 2 (claim)
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


def run_on_postgresql(sql: str) -> object:
    """A RunPython callable that runs ``sql`` on PostgreSQL and does nothing elsewhere."""

    def run(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run
