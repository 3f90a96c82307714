"""The SQLite hot path, whole: every statement that runs once per email or per call.

- ``MARKED_CONTENT``: what the worker's mark returns besides the row (the
  step's two UPDATEs are rendered from the table by ``outbox.transitions.hotpath``);
- ``EMAIL``: an email's content, when the mark did not bring it;
  ``TRACE_CONTEXT`` its trace context, when the worker traces;
- ``ENQUEUE_MANY_EMAILS`` and ``ENQUEUE_MANY_DELIVERIES``: one chunk of
  ``enqueue_many``, two statements.

``enqueue_email`` itself goes through the ORM on SQLite (one look-up of the
suppression list, then the email and its deliveries, with ``bulk_create``, in
one transaction; see :func:`outbox.enqueue.api.write_one`), the same path that serves attachments
and idempotency keys everywhere. The code that runs the statements here is in
:func:`outbox.worker.sql._steps_sqlite`, :mod:`outbox.enqueue.sql` and
:func:`outbox.enqueue.turns.write_transaction`; PostgreSQL's hot path is
:mod:`outbox.statements.postgresql`.

The same rules as PostgreSQL's, with one difference. SQLite has no server
clock: its ``now`` would be the clock of whichever host runs the statement, so
whether a row is due or expired is decided by Redis time, passed in as
``%(now)s``, the clock that also promoted the id (see :class:`outbox.queue.clock.RedisClock`).
The times an enqueue writes are the clock of the process that runs it; the
sweeper's mirror check does not trust them and looks at new rows by id
(:class:`outbox.sweeper.mirror.Mirror`).
Each write is one conditional statement on a row found by primary key that
repeats the status the row must be in; parameters are named (``%(name)s``).
"""

# -- the worker ---------------------------------------------------------------------------

# The worker's step is two transitions of ``outbox.transitions.table`` (SENT and
# MARK), rendered for SQLite by ``outbox.transitions.hotpath`` and run in one
# transaction (``outbox.worker.sql._steps_sqlite``: SQLite has no data-modifying CTE). The
# mark's RETURNING brings the email's content too, as one JSON object built by
# this subquery, keyed by column name, unless the worker has it cached (%(known)s);
# ``outbox/transitions/sql/sqlite.sql`` shows the mark whole.
MARKED_CONTENT = """CASE WHEN email_id = %(known)s THEN NULL ELSE (
        SELECT json_object('subject', e.subject, 'body', e.body,
            'html_message', e.html_message, 'from_email', e.from_email,
            'reply_to', json(e.reply_to), 'headers', json(e.headers), 'mailer', e.mailer,
            'has_attachments', EXISTS (SELECT 1 FROM outbox_attachment a WHERE a.email_id = e.id),
            'structure', json(e.structure))
        FROM outbox_email e WHERE e.id = email_id
    ) END AS content"""

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

# -- enqueueing ---------------------------------------------------------------------------

# The first statement of an enqueue's own transaction: it changes nothing, but
# as a write it takes SQLite's write lock at once, as BEGIN IMMEDIATE would
# (Django begins DEFERRED unless OPTIONS["transaction_mode"] says otherwise). A
# transaction that read first and then asked for the lock while another
# connection held it would get "database is locked" at once, without waiting.
TAKE_WRITE_LOCK = "DELETE FROM outbox_email WHERE 0"

# -- enqueue_many -----------------------------------------------------------------------

# One chunk, each statement with one JSON parameter (no limit on the number of
# items). Within one INSERT the new ids are consecutive and given in the order
# of ORDER BY, so the sorted ids pair with the items.
ENQUEUE_MANY_EMAILS = """
INSERT INTO outbox_email (subject, body, html_message, from_email, reply_to, headers, mailer,
    trace_context, created_at)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'), json_extract(value, '$[3]'), json_extract(value, '$[4]'), json_extract(value, '$[5]'), json_extract(value, '$[6]'), json_extract(value, '$[7]'), %s
FROM json_each(%s) ORDER BY key
RETURNING id
"""

ENQUEUE_MANY_DELIVERIES = """
INSERT INTO outbox_delivery (email_id, recipient, recipient_key, status, priority, attempts,
    max_attempts, not_before, expires_at, worker_id, message_id, last_error, created_at,
    updated_at)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[8]'),
    CASE WHEN json_extract(value, '$[3]') = '' THEN %s ELSE %s END,
    json_extract(value, '$[4]'), 0, json_extract(value, '$[5]'), json_extract(value, '$[6]'), json_extract(value, '$[7]'), '', json_extract(value, '$[2]'), json_extract(value, '$[3]'), %s, %s
FROM json_each(%s)
RETURNING id, message_id
"""
