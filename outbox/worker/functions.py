"""The worker's PL/pgSQL functions, rendered from the transitions table.

``outbox_step`` (one thread's step) and ``outbox_steps`` (the group commit's
batch of steps) run the transitions :data:`~outbox.transitions.SENT` and
:data:`~outbox.transitions.MARK` inside PostgreSQL: measured, a call costs
PostgreSQL well under half the CPU of the same statements sent as plain text,
which it would parse and plan anew each time
(``tests/benchmark/results/paths-postgres.md``).

A migration carries the DDL it ran as frozen text, as migrations do, so that
migrating an old database replays its history; the newest migration that
creates a function must carry what :func:`step_function` and
:func:`steps_function` render now (``tests/test_transitions.py`` checks it).
A change to either transition is therefore its edit in ``outbox/transitions/table.py``
plus a new migration with the DDL these print::

    python -c "from outbox.worker.functions import print_ddl; print_ddl()"
"""

from __future__ import annotations

from .. import transitions
from ..transitions import Placeholder

# A step's row (``outbox.worker.rows.StepColumns``): how many rows the success
# changed, the claimed row, and the email's content, read only when the worker
# does not have it cached.
_COLUMNS = (
    ("settled", "integer"),
    ("email_id", "bigint"),
    ("recipient", "varchar"),
    ("priority", "varchar"),
    ("attempts", "integer"),
    ("max_attempts", "integer"),
    ("message_id", "varchar"),
    ("subject", "text"),
    ("body", "text"),
    ("html_message", "text"),
    ("from_email", "varchar"),
    ("reply_to", "jsonb"),
    ("headers", "jsonb"),
    ("mailer", "varchar"),
    ("has_attachments", "boolean"),
    ("claimed_status", "varchar"),
    ("structure", "jsonb"),
)


def _columns(prefix: str) -> str:
    return ",\n    ".join(f"{prefix}{name} {kind}" for name, kind in _COLUMNS)


def _arguments(names: dict[str, str]) -> Placeholder:
    return lambda name: names[name]


def step_function() -> str:
    """``outbox_step``: the success of one email (if any) and the claim of the next."""
    sent = transitions.SENT.sql(
        "postgresql",
        _arguments({"id": "p_settle_id", "token": "p_settle_token", "now": "p_now"}),
    )
    claim = transitions.MARK.sql(
        "postgresql",
        _arguments(
            {
                "id": "p_claim_id",
                "token": "p_token",
                "worker": "p_worker",
                "now": "p_now",
                "expired": "p_expired_error",
            }
        ),
    )
    return f"""
CREATE OR REPLACE FUNCTION outbox_step(
    p_settle_id bigint, p_settle_token uuid,
    p_claim_id bigint, p_worker varchar, p_token uuid,
    p_now timestamptz, p_known bigint, p_expired_error text,
    {_columns("OUT ")}
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    settled := 0;
    IF p_settle_id IS NOT NULL THEN
{_indent(sent.rstrip(), 8)};
        GET DIAGNOSTICS settled = ROW_COUNT;
    END IF;
    IF p_claim_id IS NULL THEN
        RETURN;
    END IF;
{_indent(claim.rstrip(), 4)}
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


def steps_function() -> str:
    """``outbox_steps``: several threads' steps as two set-based UPDATEs, one row per step.

    The result is what the steps would give one by one, row for row: each
    UPDATE is still conditional on the status (and, for a success, the claim
    token) the row must be in, and finds its rows by primary key; a success
    needs ``processing`` and a claim ``queued``, so no row is written by both
    (one statement sees one snapshot), and a stale id settled by one step and
    claimed by another is claimed by neither, as in either order; an id two
    steps claim is updated once, by one of them (UPDATE ... FROM uses one of
    the joined rows), and each step reads back only the row that carries its
    own id and token.
    """
    sent = transitions.SENT.sql(
        "postgresql",
        _arguments({"id": "x.settle_id", "token": "x.settle_token", "now": "x.now"}),
        join="x",
    )
    claim = transitions.MARK.sql(
        "postgresql",
        _arguments(
            {
                "id": "x.claim_id",
                "token": "x.token",
                "worker": "x.worker",
                "now": "x.now",
                "expired": "p_expired_error",
            }
        ),
        join="x",
        returning=("id", "claim_token", *transitions.MARK.returns),
    )
    return f"""
CREATE OR REPLACE FUNCTION outbox_steps(
    p_settle_ids bigint[], p_settle_tokens uuid[],
    p_claim_ids bigint[], p_workers varchar[], p_tokens uuid[],
    p_nows timestamptz[], p_knowns bigint[], p_expired_error text
) RETURNS TABLE (
    {_columns("")}
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH x AS (
        SELECT * FROM unnest(p_settle_ids, p_settle_tokens, p_claim_ids, p_workers, p_tokens,
            p_nows, p_knowns)
            WITH ORDINALITY AS r(settle_id, settle_token, claim_id, worker, token, now, known, n)
    ), done AS (
{_indent(sent.rstrip(), 8)}
        RETURNING x.n
    ), claimed AS (
{_indent(claim.rstrip(), 8)}
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


def _indent(text: str, spaces: int) -> str:
    pad = " " * spaces
    return "\n".join(pad + line for line in text.splitlines())


def print_ddl() -> None:
    """Print both functions' DDL, for a new migration (module docstring)."""
    print(step_function())
    print(steps_function())
