"""The queue row, one per recipient: ``Delivery`` and its state-named queries.

Every status change of a ``Delivery`` is a single conditional ``UPDATE``
(``WHERE status = ... AND claim_token = ...``) whose row count decides what
happens next; no code reads a row, changes it in Python and saves it back.
"""

from __future__ import annotations

from datetime import datetime

from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .emails import Email
from .instants import InstantField
from .limits import SERVER_ADDRESS_MAX_LENGTH, SERVER_HOST_MAX_LENGTH, WORKER_ID_MAX_LENGTH
from .routing import OutboxManager


class DeliveryQuerySet(models.QuerySet["Delivery"]):
    """Named by state, each matching an index the worker or sweeper relies on."""

    def queued(self) -> DeliveryQuerySet:
        return self.filter(status=Delivery.Status.QUEUED)

    def due(self, now: datetime | None = None) -> DeliveryQuerySet:
        """Queued rows whose earliest send time has come."""
        return self.queued().filter(not_before__lte=now or timezone.now())

    def processing(self) -> DeliveryQuerySet:
        return self.filter(status=Delivery.Status.PROCESSING)

    def abandoned(self) -> DeliveryQuerySet:
        return self.filter(status=Delivery.Status.ABANDONED)


class Delivery(models.Model):
    """One recipient's copy of an :class:`Email`: the queue row.

    Life cycle::

        queued ──► processing ──► sent
          ▲  │         │  └──────► failed
          │  │         ├──(retry)─► queued
          │  │         └──(worker died)──► abandoned ──(admin)──► sent / failed / queued
          │  └──────────────────────────────────► cancelled
    """

    class Status(models.TextChoices):
        QUEUED = "queued", _("queued")
        PROCESSING = "processing", _("processing")
        SENT = "sent", _("sent")
        FAILED = "failed", _("failed")
        ABANDONED = "abandoned", _("abandoned")
        CANCELLED = "cancelled", _("cancelled")

    class Priority(models.TextChoices):
        HIGH = "high", _("high")
        NORMAL = "normal", _("normal")
        LOW = "low", _("low")

    LIVE_STATUSES = (Status.QUEUED, Status.PROCESSING)
    TERMINAL_STATUSES = (Status.SENT, Status.FAILED, Status.ABANDONED, Status.CANCELLED)

    email = models.ForeignKey(
        Email, on_delete=models.CASCADE, related_name="deliveries", verbose_name=_("email")
    )
    recipient = models.CharField(_("recipient"), max_length=320)
    # The recipient's bare address in the one form the outbox compares
    # addresses in (``validation.bare_address``: no display name, lower case,
    # domain IDNA-encoded), written by every enqueue path: idempotency keys
    # match on it, and the admin finds a customer's rows by it, through its
    # index. The database default ('') is for rows a previous release inserts
    # during a rolling upgrade.
    recipient_key = models.CharField(
        _("recipient address"), max_length=320, default="", db_default="", editable=False
    )
    status = models.CharField(
        _("status"), max_length=16, choices=Status.choices, default=Status.QUEUED
    )
    priority = models.CharField(
        _("priority"), max_length=8, choices=Priority.choices, default=Priority.NORMAL
    )
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    max_attempts = models.PositiveIntegerField(_("max attempts"), default=5)
    # Instants (instants.InstantField): compared with a clock on every re-read, stored in UTC.
    not_before = InstantField(_("not before"), default=timezone.now)
    worker_id = models.CharField(
        _("worker"), max_length=WORKER_ID_MAX_LENGTH, blank=True, default=""
    )
    claim_token = models.UUIDField(_("claim token"), null=True, blank=True)
    processing_started_at = models.DateTimeField(_("processing started"), null=True, blank=True)
    sent_at = models.DateTimeField(_("sent"), null=True, blank=True)
    # The server the latest attempt handed the message to
    # (outbox.mail.handover.handover_server), written before SMTP's final dot
    # while OUTBOX["RECONCILERS"] is set: a reconciler may rule a handover out
    # only from that server's log.
    server_host = models.CharField(
        _("server"), max_length=SERVER_HOST_MAX_LENGTH, blank=True, default="", db_default=""
    )
    server_address = models.CharField(
        _("server address"),
        max_length=SERVER_ADDRESS_MAX_LENGTH,
        blank=True,
        default="",
        db_default="",
    )
    # Unique through Meta.constraints, not unique=True: on PostgreSQL Django adds
    # a second, varchar_pattern_ops index to a unique=True CharField (for LIKE
    # queries nobody runs here), and every status change would write it too.
    message_id = models.CharField(_("Message-ID"), max_length=255)
    last_error = models.TextField(_("last error"), blank=True, default="")
    # Not sent by then, never sent: the claim UPDATE and the sweeper cancel it.
    # NULL (no expiry) on the hot path, so its index below never sees those rows.
    expires_at = InstantField(_("expires"), null=True, blank=True)
    # NULL, not "", for "no key": the unique constraint ignores NULLs.
    idempotency_key = models.CharField(  # noqa: DJ001
        _("idempotency key"), max_length=255, null=True, blank=True
    )
    created_at = models.DateTimeField(_("created"), default=timezone.now, editable=False)
    updated_at = models.DateTimeField(_("updated"), default=timezone.now)

    objects = OutboxManager.from_queryset(DeliveryQuerySet)()

    class Meta:
        verbose_name = _("delivery")
        verbose_name_plural = _("deliveries")
        constraints = [
            models.UniqueConstraint(fields=["message_id"], name="outbox_delivery_message_id_uniq"),
            # A retry with the same key names the same person however it
            # writes the address ("Bob <bob@example.com>", "BOB@Example.com"):
            # ON CONFLICT DO NOTHING at enqueue leans on this (outbox.enqueue.api.write_one).
            # Rows without a recipient_key (a previous release's, during an
            # upgrade) stay out of it.
            models.UniqueConstraint(
                fields=["idempotency_key", "recipient_key"],
                condition=Q(idempotency_key__isnull=False) & ~Q(recipient_key=""),
                name="outbox_delivery_idempotency_key",
            ),
        ]
        # Every status change writes a new row version into every index (the
        # indexed status column changes, so PostgreSQL cannot update in place),
        # so each index here is paid twice per delivered email. Only what the
        # worker, the sweeper, the dashboard and the admin query is indexed.
        indexes = [
            # The admin's search by address: an exact or prefix match on the
            # normalised address. varchar_pattern_ops (PostgreSQL) serves both
            # ``=`` and ``LIKE 'prefix%'`` whatever the database's collation.
            models.Index(
                fields=["recipient_key"],
                name="outbox_deliv_recipient_key",
                opclasses=["varchar_pattern_ops"],
            ),
            # Mirror rebuild and `due()`: only queued rows, in due order.
            models.Index(
                fields=["not_before", "id"],
                condition=Q(status="queued"),
                name="outbox_deliv_queued_due",
            ),
            # Incremental mirror check: queued rows changed since the last pass.
            models.Index(
                fields=["updated_at"],
                condition=Q(status="queued"),
                name="outbox_deliv_queued_upd",
            ),
            # Sweeper: processing rows whose worker went away (`stuck()`).
            models.Index(
                fields=["processing_started_at"],
                condition=Q(status="processing"),
                name="outbox_deliv_processing",
            ),
            # Retention purge of sent rows by age.
            models.Index(
                fields=["sent_at"],
                condition=Q(status="sent"),
                name="outbox_deliv_sent_at",
            ),
            # Rows that wait for a person or ended badly, by status and recency:
            # the dashboard's counts and failure chart, the admin's status
            # filter. Rows enter it rarely, so the hot path never writes it.
            models.Index(
                fields=["status", "updated_at"],
                condition=Q(status__in=["failed", "abandoned", "cancelled"]),
                name="outbox_deliv_attention",
            ),
            # The same rows by status and id, priority last: the admin's list filtered
            # by one of these statuses reads its newest page backwards from here, and
            # the dashboard counts them by status and priority without the table
            # (an index-only scan), whatever the history of sent mail around them.
            models.Index(
                fields=["status", "id", "priority"],
                condition=Q(status__in=["failed", "abandoned", "cancelled"]),
                name="outbox_deliv_attention_id",
            ),
            # Sweeper: queued rows with an expiry, oldest expiry first. Rows
            # without `expires_at` (the hot path) never enter it, so it costs
            # nothing there; a row with one leaves it at its claim.
            models.Index(
                fields=["expires_at"],
                condition=Q(status="queued", expires_at__isnull=False),
                name="outbox_deliv_expiring",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.recipient} [{self.status}]"
