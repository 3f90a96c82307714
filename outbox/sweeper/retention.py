"""Content retention: the content of settled mail leaves the database; the rows stay.

An email's content is what could hold a secret (a password-reset link, a login
code): its body, its HTML and other alternatives, its headers, its structure
(``outbox.mail.structure``) and its attachments' bytes. It is needed while a
delivery may still be sent: ``queued``, ``processing``, and ``abandoned``
(a person may requeue it). Once every delivery of the email is settled
(``sent``, ``failed`` or ``cancelled``) the sweeper clears it:

- ``OUTBOX["CONTENT_RETENTION"]`` seconds after the last delivery was settled
  (its ``updated_at``), so that a failed row can be requeued meanwhile;
  ``None`` keeps the content as long as the rows;
- at its first pass after that for a ``sensitive`` email
  (``enqueue_email(..., sensitive=True)``, ``message.outbox_sensitive``,
  ``OUTBOX["SENSITIVE_LINKS"]``).

The email row keeps its subject, sender, reply-to and mailer; its deliveries
keep their recipients, statuses, Message-IDs and attempts; attachments keep
their names and types. ``content_cleared_at`` says when.

Clearing is one conditional UPDATE of the emails (:func:`_clear`) that repeats
the test "every delivery settled" the candidates were chosen by, rows counted;
the attachments of the emails it cleared lose their bytes in the same
transaction. The candidates are locked first (``FOR UPDATE SKIP LOCKED``) and
the UPDATE is a statement of its own: an operator's requeue locks the email
row with its delivery (``operations.transition``), so the two take turns. A
requeue that holds the email keeps it from this pass; one that committed
before the lock is seen by the UPDATE's fresh snapshot (PostgreSQL's read
committed); one that comes after finds the content gone and skips the row. The candidates come from two partial indexes of ``outbox_email``
(``outbox_email_content_kept``, by age, and ``outbox_email_sensitive``) and
each one's deliveries through the index of ``email_id``: no table is scanned,
however many rows it holds. A pass clears at most :data:`PASS_LIMIT` emails
per rule, so a backlog (the first pass after an upgrade) never holds up the
sweeper's repairs.

A requeue needs the content (``transitions.CONTENT``): it skips a cleared row.
A row queued without content all the same (a previous release's requeue during
a rolling upgrade, a hand-written UPDATE) is failed by its worker, "its
content was cleared": never an empty message (``outbox.mail.structure.refuse_cleared``).
A previous release's worker would send it empty, so no content is cleared
while one is registered (``sweep.Sweeper._clear_content``).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Exists, OuterRef, Q

from ..conf import outbox_settings
from ..mail.structure import CLEARED
from ..models import Attachment, Delivery, Email, outbox_alias

Status = Delivery.Status

# Settled for good: nothing will send these rows again without a person's requeue.
SETTLED = (Status.SENT, Status.FAILED, Status.CANCELLED)
BATCH = 1000
# Emails cleared per pass and rule at most (ten batches).
PASS_LIMIT = 10 * BATCH


def clear_content(now: datetime, keep_lease: Callable[[], None] = lambda: None) -> int:
    """Clear what the retention and the sensitive rule allow at ``now``; the emails cleared.

    ``now`` is the sweeper's clock (Redis time), which the workers' outcomes
    (``updated_at``) are written by on SQLite.
    """
    cleared = _clear_all(Q(sensitive=True), None, now, keep_lease)
    retention = outbox_settings.CONTENT_RETENTION
    if retention is not None:
        cutoff = now - timedelta(seconds=retention)
        cleared += _clear_all(Q(created_at__lt=cutoff), cutoff, now, keep_lease)
    return cleared


def _clear_all(
    which: Q, cutoff: datetime | None, now: datetime, keep_lease: Callable[[], None]
) -> int:
    cleared = 0
    while cleared < PASS_LIMIT:
        found, changed = _clear(which, cutoff, now)
        cleared += changed
        keep_lease()
        if found < BATCH or not changed:
            break
    return cleared


class _PerEmail(Exists):
    """``EXISTS`` asked of each email through the index of ``email_id``, however many rows.

    ``OFFSET 0`` keeps PostgreSQL from planning it as an anti-join over the
    delivery table, which it prefers while its statistics say few deliveries
    are unsettled: a scan of every delivery, per batch. Each email's probe
    reads its own deliveries only.
    """

    template = "EXISTS(%(subquery)s OFFSET 0)"


def _unsettled(cutoff: datetime | None) -> Exists:
    """A delivery of the outer email that may still be sent (or, with ``cutoff``, settled since)."""
    open_ = ~Q(status__in=SETTLED)
    if cutoff is not None:
        open_ |= Q(updated_at__gte=cutoff)
    return _PerEmail(Delivery.objects.filter(open_, email_id=OuterRef("pk")))


def _clear(which: Q, cutoff: datetime | None, now: datetime) -> tuple[int, int]:
    """One batch: (candidates found, emails cleared)."""
    using = outbox_alias()
    kept = Q(content_cleared_at__isnull=True) & which
    unsettled = _unsettled(cutoff)
    with transaction.atomic(using=using):
        ids = list(
            Email.objects.using(using)
            # An email a requeue holds is left for the next pass (module docstring).
            .select_for_update(skip_locked=True)
            .filter(kept)
            .filter(~unsettled)
            .order_by("created_at" if cutoff is not None else "pk")
            .values_list("pk", flat=True)[:BATCH]
        )
        if not ids:
            return 0, 0
        # The write, a statement of its own: the same conditions again, read after
        # the lock, so an email whose delivery was requeued meanwhile keeps its content.
        changed = (
            Email.objects.using(using)
            .filter(kept, pk__in=ids)
            .filter(~unsettled)
            .update(
                body="",
                html_message="",
                headers={},
                structure=CLEARED,
                content_cleared_at=now,
            )
        )
        if changed:
            Attachment.objects.using(using).filter(
                email_id__in=ids, email__content_cleared_at__isnull=False
            ).exclude(content=b"").update(content=b"")
    return len(ids), changed
