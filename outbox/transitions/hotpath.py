"""The transitions the worker runs as raw SQL, rendered for each database.

What runs once per email is a statement, not an ORM update (the ORM's query
building costs more CPU than the round trip): the claim (:data:`MARK`), the
success (:data:`SENT`), a drop-in message's companions (:data:`MARK_COMPANIONS`,
:data:`RELEASE_COMPANIONS`), and on PostgreSQL the two PL/pgSQL functions that
run the success and the claim in one call (:func:`step_function`,
:func:`step_function`'s batch twin :func:`steps_function`). Each is written here
from the table and nowhere else; ``outbox.worker.sql`` runs them, and
``sql/<database>.sql`` beside this module shows them as they are.

A migration carries the functions' DDL as frozen text, as migrations do; the
newest one that creates a function must carry what these render now
(``tests/transitions/test_table.py`` checks it). A change to ``SENT`` or ``MARK`` is
therefore its edit in :mod:`outbox.transitions.table` plus a new migration with the DDL that
``python -m outbox.transitions postgresql`` prints.
"""

from __future__ import annotations

import functools

from ..statements import sqlite
from .render import Placeholder, named
from .table import MARK, MARK_COMPANIONS, RELEASE_COMPANIONS, SENT


@functools.cache
def mark(vendor: str) -> str:
    """Step 2, :data:`MARK` on the row ``%(claim_id)s``; SQLite's brings the email's content
    too (``statements.sqlite.MARKED_CONTENT``), PostgreSQL's step function reads it itself."""
    returns = MARK.returns if vendor == "postgresql" else (*MARK.returns, sqlite.MARKED_CONTENT)
    return MARK.sql(vendor, named(id="claim_id"), returning=returns)


@functools.cache
def sent(vendor: str) -> str:
    """Step 4 for a success, :data:`SENT` on the row ``%(settle_id)s``."""
    return SENT.sql(vendor, named(id="settle_id", token="settle_token"))


@functools.cache
def companions(vendor: str) -> str:
    """:data:`MARK_COMPANIONS`: the other rows of the message of ``%(id)s``."""
    return MARK_COMPANIONS.sql(vendor)


@functools.cache
def release_companions(vendor: str) -> str:
    """:data:`RELEASE_COMPANIONS`: those rows back, when the mark's reply was lost."""
    return RELEASE_COMPANIONS.sql(vendor)


# -- PostgreSQL's step functions ---------------------------------------------------------

# A step's row (``outbox.worker.rows.StepColumns``), in the order of the
# functions' OUT columns (a migration fixed it): how many rows the success
# changed, the claimed row (what MARK returns), and the email's content, read
# only when the worker does not have it cached.
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
# MARK's returned columns by their name in a step's row: the claimed row's
# status is not the OUT column ``status`` (which would shadow the table's in
# the function's own statements) but ``claimed_status``.
_CLAIMED = {column: "claimed_status" if column == "status" else column for column in MARK.returns}
# The email's content: every other column but ``settled``, read from ``outbox_email e``.
_CONTENT = {
    name: f"e.{name}" for name, _ in _COLUMNS if name not in ("settled", *_CLAIMED.values())
}
_CONTENT["has_attachments"] = "EXISTS (SELECT 1 FROM outbox_attachment a WHERE a.email_id = e.id)"
# A column MARK returns that the step's row lacks is a change of both: say so at import.
assert set(_CLAIMED.values()) <= {name for name, _ in _COLUMNS}, _CLAIMED


def _columns(prefix: str) -> str:
    return ",\n    ".join(f"{prefix}{name} {kind}" for name, kind in _COLUMNS)


def _arguments(names: dict[str, str]) -> Placeholder:
    return lambda name: names[name]


def step_function() -> str:
    """``outbox_step``: the success of one email (if any) and the claim of the next."""
    settle = SENT.sql(
        "postgresql",
        _arguments({"id": "p_settle_id", "token": "p_settle_token", "now": "p_now"}),
    )
    mark = MARK.sql(
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
{_indent(settle.rstrip(), 8)};
        GET DIAGNOSTICS settled = ROW_COUNT;
    END IF;
    IF p_claim_id IS NULL THEN
        RETURN;
    END IF;
{_indent(mark.rstrip(), 4)}
    INTO {", ".join(_CLAIMED.values())};
    IF NOT FOUND OR claimed_status <> 'processing' OR email_id = p_known THEN
        RETURN;
    END IF;
    SELECT {_wrap(list(_CONTENT.values()), 8)}
    INTO {_wrap(list(_CONTENT), 8, lead=9)}
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
    settle = SENT.sql(
        "postgresql",
        _arguments({"id": "x.settle_id", "token": "x.settle_token", "now": "x.now"}),
        join="x",
    )
    mark = MARK.sql(
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
        returning=("id", "claim_token", *MARK.returns),
    )
    claimed = {name: f"c.{column}" for column, name in _CLAIMED.items()}
    select = {
        "settled": "(SELECT count(*) FROM done WHERE done.n = x.n)::integer",
        **claimed,
        **_CONTENT,
    }
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
{_indent(settle.rstrip(), 8)}
        RETURNING x.n
    ), claimed AS (
{_indent(mark.rstrip(), 8)}
    )
    SELECT {_wrap([select[name] for name, _ in _COLUMNS], 8)}
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


def _wrap(items: list[str], spaces: int, lead: int = 11, width: int = 96) -> str:
    """``items`` joined by commas, a new line indented by ``spaces`` before one would pass
    ``width`` (the first line starts at column ``lead``: ``    SELECT ``)."""
    lines, length = [""], lead
    for item in items:
        if lines[-1] and length + len(item) + 2 > width:
            lines[-1] += ","
            lines.append(" " * spaces)
            length = spaces
        elif lines[-1].strip():
            lines[-1] += ", "
            length += 2
        lines[-1] += item
        length += len(item)
    return "\n".join(lines)
