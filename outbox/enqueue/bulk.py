"""Personalised bulk mail: :func:`enqueue_many`, one email per item.

Every item is validated (and its template rendered) before anything is
written; then the items are written in chunks of :data:`CHUNK` with a fixed
number of statements per chunk, whatever the number of items in it: one
suppression look-up, then the emails and their deliveries (one statement on
PostgreSQL, two on SQLite; see :mod:`outbox.enqueue.sql`). Items with an
``idempotency_key``, attachments or ``sensitive`` take :func:`outbox.enqueue_email`'s
own path, one item at a time, since they need more than an INSERT. The ids
are pushed to Redis after the commit, one pipeline per chunk.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from typing import Any

from django.core.exceptions import ValidationError
from django.db import connections, router, transaction
from django.utils import timezone

from .. import signals
from ..mail import valve
from ..mail.message_id import make_message_id, message_id_domain
from ..models import Delivery, Email, EmailTemplate, outbox_alias
from ..queue.entries import QueueEntry
from ..queue.publish import publish
from ..rendering import TemplateCache
from ..suppression import bare_address, suppressed
from .api import prepare_email, prepare_template, queue_entries, write_one
from .prepare import Prepared
from .sql import BulkRow, insert_many
from .turns import write_transaction

__all__ = ["CHUNK", "enqueue_many"]

# Items per chunk: each chunk is written with the same few statements.
CHUNK = 1000


def enqueue_many(items: Iterable[Mapping[str, Any]]) -> list[list[Delivery]]:
    """Queue one email per item; returns each item's deliveries, in item order.

    Each item is a dict of :func:`~outbox.enqueue_email` keyword arguments
    (``subject``, ``message``, ``from_email``, ``recipient_list``, ...), or,
    with a ``template`` key, of :func:`~outbox.enqueue_template` ones
    (``template`` is the name; ``context``, ``language``, ...), so that each
    recipient can have their own context.

    All or nothing: one bad item raises
    :class:`~django.core.exceptions.ValidationError` (or :class:`TypeError`)
    naming its index as ``items[i]``, and nothing is written. The rows are
    written in the caller's transaction (a savepoint in it) and pushed to
    Redis after the commit; suppression and ``expires_at`` work as they do
    for one email.
    """
    using = outbox_alias()
    cache = TemplateCache(router.db_for_read(EmailTemplate))
    prepared = [_prepare_item(cache, index, item) for index, item in enumerate(items)]
    results: list[list[Delivery]] = []
    with write_transaction(using):
        for start in range(0, len(prepared), CHUNK):
            results += _write_chunk(prepared[start : start + CHUNK], using)
    return results


def _prepare_item(cache: TemplateCache, index: int, item: Any) -> Prepared:
    if not isinstance(item, Mapping):
        raise TypeError(f"items[{index}] must be a dict, not {type(item).__name__}")
    try:
        if "template" in item:
            options = dict(item)
            name = options.pop("template")
            return prepare_template(cache, name, **options)
        return prepare_email(**item)
    except ValidationError as exc:
        raise _at(index, exc) from exc
    except TypeError as exc:
        raise TypeError(f"items[{index}]: {exc}") from exc


def _at(index: int, exc: ValidationError) -> ValidationError:
    """``exc`` with its fields prefixed by ``items[index]``."""
    prefix = f"items[{index}]"
    if hasattr(exc, "error_dict"):
        return ValidationError(
            {f"{prefix}.{field}": errors for field, errors in exc.error_dict.items()}
        )
    return ValidationError({prefix: exc.error_list})


def _write_chunk(chunk: Sequence[Prepared], using: str) -> list[list[Delivery]]:
    results: list[list[Delivery] | None] = [None] * len(chunk)
    simple = [
        i
        for i, p in enumerate(chunk)
        if p.idempotency_key is None and not p.attachments and not p.sensitive
    ]
    for i in sorted(set(range(len(chunk))) - set(simple)):
        results[i] = write_one(chunk[i])
    if simple and connections[using].vendor in ("postgresql", "sqlite"):
        written = _write_bulk([chunk[i] for i in simple], using)
        for i, deliveries in zip(simple, written, strict=True):
            results[i] = deliveries
    else:
        for i in simple:
            results[i] = write_one(chunk[i])
    return [r or [] for r in results]


def _write_bulk(chunk: Sequence[Prepared], using: str) -> list[list[Delivery]]:
    """One suppression query and one insert (two on SQLite) for the whole chunk.

    A recipient suppressed, or stopped by the staging valve (:mod:`outbox.mail.valve`),
    is written ``cancelled`` with its reason in ``why``.
    """
    now = timezone.now()
    # The staging valve's cancellations, then the suppression list's (whose reason wins).
    stopped = valve.refusals(r for p in chunk for r in p.recipients)
    keys = [[bare_address(r) for r in p.recipients] for p in chunk]
    stopped.update(suppressed(using, [k for ks in keys for k in ks]))
    domains: dict[str, str] = {}
    rows: list[BulkRow] = []
    for p, p_keys in zip(chunk, keys, strict=True):
        domain = domains.get(p.from_email)
        if domain is None:
            domain = domains[p.from_email] = message_id_domain(p.from_email)
        rows.append(
            BulkRow(
                p,
                p.send_at or now,
                [make_message_id(domain) for _ in p.recipients],
                p_keys,
                [stopped.get(k, "") for k in p_keys],
            )
        )
    emails, deliveries = insert_many(rows, using=using, now=now)
    entries: list[QueueEntry] = []
    # On PostgreSQL a row due now was written with the database's now(): due now in Redis too.
    postgresql = connections[using].vendor == "postgresql"
    for row, created in zip(rows, deliveries, strict=True):
        due = row.prepared.send_at if postgresql else row.not_before
        entries += queue_entries(created, due)
    transaction.on_commit(partial(_after_commit, emails, deliveries, entries), using=using)
    return deliveries


def _after_commit(
    emails: list[Email], deliveries: list[list[Delivery]], entries: list[QueueEntry]
) -> None:
    publish(entries)  # pipelined in batches (RedisQueue.push)
    for email, created in zip(emails, deliveries, strict=True):
        signals.email_enqueued.send_robust(sender=Email, email=email, deliveries=created)
