"""The PL/pgSQL functions behind the ``..._CALL`` statements of ``postgresql.py``.

Migrations 0005, 0008, 0011, 0012 and 0013 create them (``STEP_FUNCTION_V1``,
then ``_V2``, ``ENQUEUE_FUNCTION_V1`` and ``ENQUEUE_ONE_FUNCTION_V1``, then
their ``_V2``, ``STEPS_FUNCTION_V1``); why the hot path calls functions at all is told in
``postgresql.py``.

Each function's DDL is frozen once a release ships it: a change is a new
constant (``..._V2``) and a new migration, so that migrating an old database
replays the history it had; ``CURRENT`` names the newest version of each
(check ``outbox.E022`` and ``outbox_functions --create`` read it). (Before
the first release the ``_V1`` functions were changed in place, to carry
``outbox_email.mailer``, which migration 0007 adds: PL/pgSQL resolves column
names when a function first runs, not when migration 0005 creates it; and
``ENQUEUE_ONE_FUNCTION_V1`` came to return one array instead of three columns.)
"""

from __future__ import annotations

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.recorder import MigrationRecorder
from django.db.migrations.state import StateApps

from ..conf import outbox_settings

# -- outbox_step: the worker's step (migration 0005, then 0011) -----------------------------

STEP_FUNCTION_V1 = """
CREATE OR REPLACE FUNCTION outbox_step(
    p_settle_id bigint, p_settle_token uuid,
    p_claim_id bigint, p_worker varchar, p_token uuid,
    p_now timestamptz, p_known bigint, p_expired_error text,
    OUT settled integer,
    OUT email_id bigint, OUT recipient varchar, OUT priority varchar,
    OUT attempts integer, OUT max_attempts integer, OUT message_id varchar,
    OUT subject text, OUT body text, OUT html_message text, OUT from_email varchar,
    OUT reply_to jsonb, OUT headers jsonb, OUT mailer varchar, OUT has_attachments boolean,
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
    SELECT e.subject, e.body, e.html_message, e.from_email, e.reply_to, e.headers, e.mailer,
        EXISTS (SELECT 1 FROM outbox_attachment a WHERE a.email_id = e.id)
    INTO subject, body, html_message, from_email, reply_to, headers, mailer, has_attachments
    FROM outbox_email e WHERE e.id = email_id;
END
$$
"""

DROP_STEP = (
    "DROP FUNCTION IF EXISTS outbox_step("
    "bigint, uuid, bigint, varchar, uuid, timestamptz, bigint, text)"
)

# V1 with the email's ``structure`` (migration 0011) as a last column: a worker
# that reads the columns before it by position is not disturbed. A function's
# OUT columns cannot change in place, so the migration drops V1 first.
STEP_FUNCTION_V2 = """
CREATE OR REPLACE FUNCTION outbox_step(
    p_settle_id bigint, p_settle_token uuid,
    p_claim_id bigint, p_worker varchar, p_token uuid,
    p_now timestamptz, p_known bigint, p_expired_error text,
    OUT settled integer,
    OUT email_id bigint, OUT recipient varchar, OUT priority varchar,
    OUT attempts integer, OUT max_attempts integer, OUT message_id varchar,
    OUT subject text, OUT body text, OUT html_message text, OUT from_email varchar,
    OUT reply_to jsonb, OUT headers jsonb, OUT mailer varchar, OUT has_attachments boolean,
    OUT claimed_status varchar, OUT structure jsonb
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
    SELECT e.subject, e.body, e.html_message, e.from_email, e.reply_to, e.headers, e.mailer,
        EXISTS (SELECT 1 FROM outbox_attachment a WHERE a.email_id = e.id), e.structure
    INTO subject, body, html_message, from_email, reply_to, headers, mailer, has_attachments,
        structure
    FROM outbox_email e WHERE e.id = email_id;
END
$$
"""

# -- outbox_steps: the group commit's batch of steps (migration 0012) -----------------------

# Several threads' steps as two set-based UPDATEs (all successes, then all
# claims) instead of outbox_step() once per step: the per-call and per-statement
# overhead of 2 x n statements is PostgreSQL's largest cost per email in a batch
# (measured, 9 steps per commit: ~290 -> ~150 us of server CPU per email).
# The result is what the steps would give one by one, row for row, because:
# - each UPDATE is still conditional on the status (and, for a success, the
#   claim token) the row must be in, and finds its rows by primary key;
# - a success needs 'processing' and a claim 'queued', so no row is written by
#   both (one statement sees one snapshot, and the two sets are disjoint in it);
#   a stale id settled by one step and claimed by another is claimed by neither,
#   as it would be in either order;
# - an id two steps claim (duplicate ids are harmless) is updated once, by one
#   of them: UPDATE ... FROM uses one of the joined rows, and each step reads
#   back only the row that carries its own id and token.
# Each step's row has STEP_FUNCTION_V2's columns, in step order.
STEPS_FUNCTION_V1 = """
CREATE OR REPLACE FUNCTION outbox_steps(
    p_settle_ids bigint[], p_settle_tokens uuid[],
    p_claim_ids bigint[], p_workers varchar[], p_tokens uuid[],
    p_nows timestamptz[], p_knowns bigint[], p_expired_error text
) RETURNS TABLE (
    settled integer,
    email_id bigint, recipient varchar, priority varchar,
    attempts integer, max_attempts integer, message_id varchar,
    subject text, body text, html_message text, from_email varchar,
    reply_to jsonb, headers jsonb, mailer varchar, has_attachments boolean,
    claimed_status varchar, structure jsonb
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH x AS (
        SELECT * FROM unnest(p_settle_ids, p_settle_tokens, p_claim_ids, p_workers, p_tokens,
            p_nows, p_knowns)
            WITH ORDINALITY AS r(settle_id, settle_token, claim_id, worker, token, now, known, n)
    ), done AS (
        UPDATE outbox_delivery AS d
        SET status = 'sent', sent_at = x.now, updated_at = x.now, last_error = ''
        FROM x
        WHERE d.id = x.settle_id AND (d.status = 'processing') IS TRUE
            AND d.claim_token = x.settle_token
        RETURNING x.n
    ), claimed AS (
        -- A row past its expires_at is claimed into 'cancelled' instead, without
        -- counting an attempt; the caller drops it unsent.
        UPDATE outbox_delivery AS d
        SET status = CASE WHEN d.expires_at <= now() THEN 'cancelled' ELSE 'processing' END,
            last_error = CASE WHEN d.expires_at <= now() THEN p_expired_error
                ELSE d.last_error END,
            worker_id = x.worker, claim_token = x.token,
            processing_started_at = x.now, updated_at = x.now,
            attempts = d.attempts + CASE WHEN d.expires_at <= now() THEN 0 ELSE 1 END
        FROM x
        WHERE d.id = x.claim_id AND (d.status = 'queued') IS TRUE AND d.not_before <= now()
        RETURNING d.id, d.claim_token, d.email_id, d.recipient, d.priority, d.attempts,
            d.max_attempts, d.message_id, d.status
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

DROP_STEPS = (
    "DROP FUNCTION IF EXISTS outbox_steps("
    "bigint[], uuid[], bigint[], varchar[], uuid[], timestamptz[], bigint[], text)"
)

ENQUEUE_FUNCTION_V1 = """
CREATE OR REPLACE FUNCTION outbox_enqueue(
    p_subject text, p_body text, p_html text, p_from varchar, p_reply_to jsonb,
    p_headers jsonb, p_now timestamptz, p_priority varchar, p_max_attempts integer,
    p_not_before timestamptz, p_expires_at timestamptz,
    p_recipients text[], p_message_ids text[], p_bare text[], p_mailer varchar
) RETURNS TABLE (id bigint, email_id bigint, message_id varchar, last_error text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    new_email bigint;
BEGIN
    INSERT INTO outbox_email AS e (subject, body, html_message, from_email, reply_to, headers,
        mailer, created_at)
    VALUES (p_subject, p_body, p_html, p_from, p_reply_to, p_headers, p_mailer, p_now)
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
    "timestamptz, varchar, integer, timestamptz, timestamptz, text[], text[], text[], varchar)"
)


# ENQUEUE_FUNCTION_V1 for one recipient, row for row (the suppression text too):
# ``tests/test_fast_paths.py`` compares both with the plain ENQUEUE. Returns
# {delivery id, email id, why it is suppressed or ""}: one array, so that the
# call is a plain scalar call (see ENQUEUE_ONE_CALL).
ENQUEUE_ONE_FUNCTION_V1 = """
CREATE OR REPLACE FUNCTION outbox_enqueue_one(
    p_subject text, p_body text, p_html text, p_from varchar, p_reply_to jsonb,
    p_headers jsonb, p_now timestamptz, p_priority varchar, p_max_attempts integer,
    p_not_before timestamptz, p_expires_at timestamptz,
    p_recipient text, p_message_id text, p_bare text, p_mailer varchar
) RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    s record;
    delivery_id bigint;
    new_email_id bigint;
    why text;
BEGIN
    INSERT INTO outbox_email AS e (subject, body, html_message, from_email, reply_to, headers,
        mailer, created_at)
    VALUES (p_subject, p_body, p_html, p_from, p_reply_to, p_headers, p_mailer, p_now)
    RETURNING e.id INTO new_email_id;
    why := '';
    SELECT x.address, x.source, x.reason INTO s
    FROM outbox_suppression x WHERE x.address = p_bare;
    IF FOUND THEN
        why := left('suppressed: ' || s.address
            || ' is on the suppression list (' || s.source || ')'
            || CASE WHEN s.reason = '' THEN '' ELSE ': ' || s.reason END, 2000);
    END IF;
    INSERT INTO outbox_delivery AS d (email_id, recipient, status, priority, attempts,
        max_attempts, not_before, expires_at, worker_id, message_id, last_error, created_at,
        updated_at)
    VALUES (new_email_id, p_recipient,
        CASE WHEN why = '' THEN 'queued' ELSE 'cancelled' END,
        p_priority, 0, p_max_attempts, p_not_before, p_expires_at, '', p_message_id, why,
        p_now, p_now)
    RETURNING d.id INTO delivery_id;
    RETURN ARRAY[delivery_id::text, new_email_id::text, why];
END
$$
"""

DROP_ENQUEUE_ONE = (
    "DROP FUNCTION IF EXISTS outbox_enqueue_one(text, text, text, varchar, jsonb, jsonb, "
    "timestamptz, varchar, integer, timestamptz, timestamptz, text, text, text, varchar)"
)


# -- the enqueue functions, writing Delivery.recipient_key (migration 0013) ---------------

# ENQUEUE_FUNCTION_V1 that also writes ``recipient_key``, the normalised
# address (``p_bare``, the form the suppression list is matched on): the same
# signature, parameters and rows returned.
ENQUEUE_FUNCTION_V2 = """
CREATE OR REPLACE FUNCTION outbox_enqueue(
    p_subject text, p_body text, p_html text, p_from varchar, p_reply_to jsonb,
    p_headers jsonb, p_now timestamptz, p_priority varchar, p_max_attempts integer,
    p_not_before timestamptz, p_expires_at timestamptz,
    p_recipients text[], p_message_ids text[], p_bare text[], p_mailer varchar
) RETURNS TABLE (id bigint, email_id bigint, message_id varchar, last_error text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    new_email bigint;
BEGIN
    INSERT INTO outbox_email AS e (subject, body, html_message, from_email, reply_to, headers,
        mailer, created_at)
    VALUES (p_subject, p_body, p_html, p_from, p_reply_to, p_headers, p_mailer, p_now)
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

# ENQUEUE_ONE_FUNCTION_V1 that also writes ``recipient_key`` (``p_bare``).
ENQUEUE_ONE_FUNCTION_V2 = """
CREATE OR REPLACE FUNCTION outbox_enqueue_one(
    p_subject text, p_body text, p_html text, p_from varchar, p_reply_to jsonb,
    p_headers jsonb, p_now timestamptz, p_priority varchar, p_max_attempts integer,
    p_not_before timestamptz, p_expires_at timestamptz,
    p_recipient text, p_message_id text, p_bare text, p_mailer varchar
) RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    s record;
    delivery_id bigint;
    new_email_id bigint;
    why text;
BEGIN
    INSERT INTO outbox_email AS e (subject, body, html_message, from_email, reply_to, headers,
        mailer, created_at)
    VALUES (p_subject, p_body, p_html, p_from, p_reply_to, p_headers, p_mailer, p_now)
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


def run_on_postgresql(sql: str) -> object:
    """A RunPython callable that runs ``sql`` on PostgreSQL and does nothing elsewhere.

    Nothing either while ``OUTBOX["POSTGRESQL_FUNCTIONS"]`` is False: a site
    whose database role may not create functions sets it before migrating, and
    the migrations then create none (the plain statements need none).
    """

    def run(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
        if schema_editor.connection.vendor == "postgresql" and outbox_settings.POSTGRESQL_FUNCTIONS:
            schema_editor.execute(sql)

    return run


# -- the functions a migrated database has --------------------------------------------------

# Each function's DDL as the newest migration that writes it leaves it, by that migration.
CURRENT = {
    "outbox_step": ("0011_message_structure", STEP_FUNCTION_V2),
    "outbox_enqueue": ("0015_delivery_recipient_key", ENQUEUE_FUNCTION_V2),
    "outbox_enqueue_one": ("0015_delivery_recipient_key", ENQUEUE_ONE_FUNCTION_V2),
    "outbox_steps": ("0012_batched_steps_function", STEPS_FUNCTION_V1),
}


def function_states(connection: BaseDatabaseWrapper) -> dict[str, str]:
    """Each function of ``CURRENT``: "present", "missing", or "unmigrated" (migration not applied).

    "missing" happens when the database was migrated while ``POSTGRESQL_FUNCTIONS``
    was False (the migrations then create none): if the setting is True now,
    the hot paths call functions that do not exist. Empty elsewhere than on
    PostgreSQL. Raises DatabaseError when the database cannot be asked.
    """
    if connection.vendor != "postgresql":
        return {}
    applied = MigrationRecorder(connection).applied_migrations()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT proname FROM pg_proc "
            "WHERE proname = ANY(%s) AND pg_function_is_visible(oid)",
            [list(CURRENT)],
        )
        present = {row[0] for row in cursor.fetchall()}
    return {
        name: "present"
        if name in present
        else ("missing" if ("outbox", migration) in applied else "unmigrated")
        for name, (migration, _) in CURRENT.items()
    }


def missing_functions(connection: BaseDatabaseWrapper) -> list[str]:
    """The functions whose migration is applied but which this database lacks."""
    return [name for name, state in function_states(connection).items() if state == "missing"]


def create_functions(connection: BaseDatabaseWrapper, names: list[str]) -> None:
    """Create the named functions as a migrated database has them, in one transaction."""
    with connection.schema_editor() as editor:
        for name in names:
            editor.execute(CURRENT[name][1])
