"""The PostgreSQL hot path, whole: every statement that runs once per email or per call.

What is here, in the order an email meets it:

- ``ENQUEUE_CALL``: ``enqueue_email``'s common case (no idempotency key, no
  attachments): the email and one delivery per recipient in one call, the
  suppression list looked up inside it; ``ENQUEUE_ONE_CALL`` the same for
  one recipient;
- ``ENQUEUE_MANY``: one chunk of ``enqueue_many``, one statement;
- ``STEP_CALL``: the worker's step, the success of the message in hand
  (step 4) and the claim of the next one (step 2) with its content;
  ``STEPS_CALL``: several threads' steps in one statement (one commit);
- ``EMAIL``: an email's content, for the worker's general path (any outcome
  other than a success), which runs the step's two transitions one by one
  (``outbox/transitions/``); ``TRACE_CONTEXT`` its trace context, when traced;
- the PL/pgSQL functions behind the ``..._CALL`` statements are created by
  migration ``outbox/migrations/0017_postgresql_functions.py``, which holds
  their DDL (a new database: its copy in the squashed migration,
  ``outbox/migrations/0001_squashed_0018_delivery_instants.py``).

The code that runs them is in :mod:`outbox.worker.sql` and
:mod:`outbox.enqueue.sql`; SQLite's hot path is :mod:`outbox.statements.sqlite`.

Why functions: at Django's defaults (no ``prepare_threshold``, and always
behind a transaction-pooling PgBouncer) every statement a client sends is
parsed and planned anew, and for these one-row statements planning costs
PostgreSQL about as much CPU as running them. PL/pgSQL caches the plans of the
statements inside a function for the life of the session, so a call costs one
parse of ``SELECT * FROM outbox_step(...)`` and runs cached plans: the saving
of prepared statements, without needing them. Measured against the same
statements sent plainly, the functions cost PostgreSQL less than half the CPU
per step (``tests/benchmark/results/paths-postgres.md``), so the plain forms
were retired. ``tests/worker/test_step.py`` runs every case of the step and
compares it with the worker's statements one by one.

The rules every statement keeps:

- each write is a transition (:mod:`outbox.transitions`: one conditional
  statement on rows found by primary key that repeats the status the row
  must be in, written so that no index can serve the status test); a
  statement (or a function call) run in autocommit is its own transaction, so
  the two writes of the step commit together or not at all;
- whether a row is due or expired is decided by the server's clock, ``now()``,
  never by the worker host's; the times the worker writes (``%(now)s``) are
  Redis time from its RedisClock (see :class:`outbox.queue.clock.RedisClock`);
- parameters are named (``%(name)s``); table names and status values are
  written out: the tables are the app's own, and a status value is stored in
  the rows, so changing one would need a data migration anyway.
"""

from __future__ import annotations

# -- enqueue ----------------------------------------------------------------------------

# The email and all its deliveries, through the function outbox_enqueue: the
# recipients travel as arrays instead of a VALUES row each (that is what makes
# a 10,000-recipient call cheap), and the rows returned are matched back by
# Message-ID, which is unique, so no row order is assumed. A row due now comes
# with ``not_before`` NULL and gets ``now()``: the database's clock, the one
# the worker's due test reads, not the web host's (also in ENQUEUE_ONE_CALL and
# ENQUEUE_MANY). ``created_at`` and ``updated_at`` are now() too, always: the
# sweeper's incremental mirror check compares ``updated_at`` with the
# database's clock (``outbox.sweeper.mirror.Mirror``), so a web host whose clock is
# slow cannot date a row before the check's window. Each returns now(), so the
# instances returned to the caller hold what the rows hold. A suppressed
# recipient's row is written cancelled, with the text ``outbox.suppression.suppressed``
# gives elsewhere. ``structure`` is a drop-in backend message's (NULL otherwise).
ENQUEUE_CALL = """
SELECT *, now() FROM outbox_enqueue(%(subject)s, %(body)s, %(html)s, %(from)s, %(reply_to)s::jsonb,
    %(headers)s::jsonb, now(), %(priority)s, %(max_attempts)s,
    COALESCE(%(not_before)s::timestamptz, now()), %(expires_at)s::timestamptz,
    %(recipients)s::text[], %(message_ids)s::text[],
    %(bare)s::text[], %(mailer)s, %(structure)s::jsonb)
"""

# The common case of all, one recipient, through outbox_enqueue_one: the same
# parameters as one scalar each instead of arrays, one value returned.
# Arrays cost both ends of the connection more than the rows. The function is
# called in the select list, not ``FROM``: at Django's defaults every call is
# parsed and planned anew, and a function scan with its result columns costs
# PostgreSQL about 20 us more per call to plan and run than a plain call.
ENQUEUE_ONE_CALL = """
SELECT outbox_enqueue_one(%(subject)s, %(body)s, %(html)s, %(from)s,
    %(reply_to)s::jsonb, %(headers)s::jsonb, now(), %(priority)s, %(max_attempts)s,
    COALESCE(%(not_before)s::timestamptz, now()), %(expires_at)s::timestamptz, %(recipient)s,
    %(message_id)s, %(bare)s,
    %(mailer)s, %(structure)s::jsonb) AS enqueued, now()
"""

# One chunk of enqueue_many: the email ids are drawn from the table's sequence
# first (``ids``), so each item's deliveries name their email by the item's
# position, with no reliance on the order RETURNING gives. Every column
# travels as one array.
ENQUEUE_MANY = """
WITH ids AS MATERIALIZED (
    SELECT g AS item, nextval(pg_get_serial_sequence(%(email_table)s, 'id')) AS id
    FROM generate_series(1, %(count)s) AS g
), email AS (
    INSERT INTO outbox_email (id, subject, body, html_message, from_email, reply_to, headers,
        mailer, trace_context, created_at)
    SELECT ids.id, e.subject, e.body, e.html, e.sender, e.reply_to::jsonb, e.headers::jsonb,
        e.mailer, e.trace_context::jsonb, now()
    FROM unnest(%(subjects)s::text[], %(bodies)s::text[], %(htmls)s::text[],
        %(senders)s::text[], %(reply_tos)s::text[], %(headers)s::text[], %(mailers)s::text[],
        %(trace_contexts)s::text[])
        WITH ORDINALITY AS e(subject, body, html, sender, reply_to, headers, mailer,
            trace_context, item)
    JOIN ids USING (item)
    RETURNING id
)
INSERT INTO outbox_delivery (email_id, recipient, recipient_key, status, priority, attempts,
    max_attempts, not_before, expires_at, worker_id, message_id, last_error, created_at,
    updated_at)
SELECT email.id, d.recipient, d.recipient_key,
    CASE WHEN d.why = '' THEN %(queued)s ELSE %(cancelled)s END,
    d.priority, 0, d.max_attempts, COALESCE(d.not_before, now()), d.expires_at, '',
    d.message_id, d.why,
    now(), now()
FROM unnest(%(items)s::bigint[], %(recipients)s::text[], %(keys)s::text[],
    %(message_ids)s::text[], %(why)s::text[], %(priorities)s::text[],
    %(max_attempts)s::integer[], %(not_befores)s::timestamptz[], %(expires)s::timestamptz[])
    AS d(item, recipient, recipient_key, message_id, why, priority, max_attempts, not_before,
        expires_at)
JOIN ids USING (item)
JOIN email ON email.id = ids.id
RETURNING id, email_id, message_id, now()
"""

# -- the worker ---------------------------------------------------------------------------

# The step's two writes, the success (step 4) and the mark (step 2), are
# transitions (``outbox.transitions.table.SENT`` and ``MARK``); the worker
# runs them rendered for PostgreSQL on its general path, and as the function
# below, which the same table renders (``outbox.transitions.hotpath.step_function``; the
# statements as SQL: ``outbox/transitions/sql/postgresql.sql``).

# Steps 4 and 2 and the next email's content in one call of outbox_step: SENT
# and MARK, then EMAIL, as one transaction (a call in autocommit is
# one). The content is skipped when the worker has it cached (%(known)s).
STEP_CALL = """
SELECT * FROM outbox_step(%(settle_id)s, %(settle_token)s, %(claim_id)s, %(worker)s, %(token)s,
    %(now)s, %(known)s, %(expired)s)
"""

# Several threads' steps in one statement, so in one commit (the worker's group
# commit, ``outbox.worker.group_commit.GroupCommit``): outbox_steps, two set-based
# UPDATEs for the whole batch; ``outbox.transitions.hotpath.steps_function``
# says why each step's row is what the step would give alone (a row claimed
# twice in one batch goes to one of them only).
STEPS_CALL = """
SELECT * FROM outbox_steps(%(settle_ids)s::bigint[], %(settle_tokens)s::uuid[],
    %(claim_ids)s::bigint[], %(workers)s::varchar[], %(tokens)s::uuid[],
    %(nows)s::timestamptz[], %(knowns)s::bigint[], %(expired)s)
"""

# An email's content, when the claim did not bring it.
EMAIL = """
SELECT e.subject, e.body, e.html_message, e.from_email, e.reply_to, e.headers, e.mailer,
    EXISTS (SELECT 1 FROM outbox_attachment a WHERE a.email_id = e.id) AS has_attachments,
    e.structure
FROM outbox_email e WHERE e.id = %s
"""

# An email's trace context, for the worker's send span (outbox.tracing.sending); read
# only while the worker traces: the step's statements do not return it.
TRACE_CONTEXT = "SELECT trace_context FROM outbox_email WHERE id = %s"
