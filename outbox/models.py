"""The outbox's tables: the database is the truth about every email.

``Email`` holds the content once per enqueue call, ``Delivery`` is one queue row
per recipient, and ``Attempt`` is the evidence log an operator reads before
settling a row by hand.

Every status change of a ``Delivery`` is a single conditional ``UPDATE``
(``WHERE status = ... AND claim_token = ...``) whose row count decides what
happens next; no code reads a row, changes it in Python and saves it back.
"""

from __future__ import annotations

from datetime import datetime
from typing import TypeVar

from django.db import models, router
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .validation import check_template_syntax, suppression_key

# Worker ids on rows and in the attempt log. The ``outbox_worker`` command
# accepts ids of up to 200 characters; the worker may append an incarnation
# suffix (``#`` and 12 hex digits), so the columns leave room for it.
WORKER_ID_MAX_LENGTH = 255

# A mailer alias (Email.mailer): MAILERS aliases and OUTBOX["BACKENDS"] keys are short names.
MAILER_MAX_LENGTH = 100

# Where a message was handed over: a DNS name (at most 253 characters) and
# "ip:port" or "[ipv6]:port" (at most 47).
SERVER_HOST_MAX_LENGTH = 255
SERVER_ADDRESS_MAX_LENGTH = 64

_Row = TypeVar("_Row", bound=models.Model)


def outbox_alias() -> str:
    """The database of the outbox's rows: the project's routers' write database for ``Delivery``.

    Every process uses it, for reads as well as writes: enqueue, the worker,
    the sweeper, operations and the admin's actions, status, metrics and the
    checks. Reads go to the write database on purpose: a router may send
    reads to a replica, and a replica lags, while the outbox decides what to
    send, retry or repair from its own rows. Read from a stale copy, a claim
    or a repair would act on a state the row has left. All of the outbox's
    tables live in this one database: an outcome, its Attempt row and its
    suppressions are one transaction.

    Asked each time, never cached: routers are settings. Without routers,
    ``DEFAULT_DB_ALIAS``.
    """
    return router.db_for_write(Delivery)


class OutboxManager(models.Manager[_Row]):
    """The manager of the outbox's tables: every query on :func:`outbox_alias`.

    So that ORM code reads and writes the rows where the worker and enqueue do,
    whatever a router says for reads; ``.using(alias)`` after it still wins.
    Related lookups (``delivery.email``) follow the instance's database
    unless a router says otherwise.
    """

    def get_queryset(self) -> models.QuerySet[_Row]:
        return super().get_queryset().using(outbox_alias())


class Email(models.Model):
    """The content of one ``enqueue_email`` call, shared by all its deliveries."""

    subject = models.TextField(_("subject"))
    body = models.TextField(_("body"), blank=True)
    html_message = models.TextField(_("HTML alternative"), blank=True, default="")
    from_email = models.CharField(_("from"), max_length=320)
    reply_to = models.JSONField(_("reply-to"), default=list, blank=True)
    headers = models.JSONField(_("extra headers"), default=dict, blank=True)
    created_at = models.DateTimeField(_("created"), default=timezone.now, editable=False)
    # The delivery backend of every delivery of this email: an alias of MAILERS
    # (Django 6.1) or a key of OUTBOX["BACKENDS"]; blank is the worker's default
    # (see outbox/mail/mailers.py). The database default serves raw INSERTs that
    # predate the column.
    mailer = models.CharField(
        _("mailer"),
        max_length=MAILER_MAX_LENGTH,
        blank=True,
        default="",
        db_default="",
        help_text=_("The mailer the worker delivers through; blank for its default."),
    )

    # A message from the drop-in backend: what Django's ``message()`` needs,
    # beyond the columns above, to build the message exactly as Django would
    # (see outbox/mail/structure.py). NULL for ``enqueue_email`` and for rows
    # written before the column existed: those are built from the columns.
    structure = models.JSONField(
        _("message structure"), null=True, blank=True, default=None, editable=False
    )

    objects = OutboxManager()

    class Meta:
        verbose_name = _("email")
        verbose_name_plural = _("emails")

    def __str__(self) -> str:
        return self.subject[:80]


class Attachment(models.Model):
    """A file attached to an :class:`Email`; stored once however many recipients."""

    email = models.ForeignKey(
        Email, on_delete=models.CASCADE, related_name="attachments", verbose_name=_("email")
    )
    name = models.CharField(_("file name"), max_length=255, blank=True)
    content = models.BinaryField(_("content"))
    mimetype = models.CharField(_("MIME type"), max_length=255, blank=True)
    # The content is a whole MIME part as the sender built it (an inline image
    # with its Content-ID, a MIMEBase): attached as it is, headers and all.
    mime_part = models.BooleanField(_("MIME part"), default=False, db_default=False)

    objects = OutboxManager()

    class Meta:
        verbose_name = _("attachment")
        verbose_name_plural = _("attachments")

    def __str__(self) -> str:
        return self.name or "(unnamed)"


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
    not_before = models.DateTimeField(_("not before"), default=timezone.now)
    worker_id = models.CharField(
        _("worker"), max_length=WORKER_ID_MAX_LENGTH, blank=True, default=""
    )
    claim_token = models.UUIDField(_("claim token"), null=True, blank=True)
    processing_started_at = models.DateTimeField(_("processing started"), null=True, blank=True)
    sent_at = models.DateTimeField(_("sent"), null=True, blank=True)
    # The server the latest attempt handed the message to (outbox/mail/handover.py,
    # handover_server), written before SMTP's final dot while OUTBOX["RECONCILERS"]
    # is set: a reconciler may rule a handover out only from that server's log.
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
    expires_at = models.DateTimeField(_("expires"), null=True, blank=True)
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
            # ON CONFLICT DO NOTHING at enqueue leans on this (enqueue/api.py).
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


class Attempt(models.Model):
    """One try at delivering a :class:`Delivery`, or an operator's decision on it."""

    class Outcome(models.TextChoices):
        SENT = "sent", _("sent")
        RETRY = "retry", _("will retry")
        FAILED = "failed", _("failed")
        ABANDONED = "abandoned", _("abandoned (worker went away)")
        # The connection was cut or timed out after the message body was
        # handed over: the server may have the message. Handled like a crash
        # in the send window (abandoned under "review", retried under "requeue").
        AMBIGUOUS = "ambiguous", _("in doubt")
        REQUEUED = "requeued", _("requeued")
        RELEASED = "released", _("released unsent")
        # Settled by hand or by a reconciler (outbox.sweeper.reconcile): the
        # attempt's actor says which ("admin:<user>", "reconciler:<path>").
        MARKED_SENT = "marked_sent", _("marked sent")
        MARKED_FAILED = "marked_failed", _("marked failed")
        CANCELLED = "cancelled", _("cancelled")
        # Reported later by an ESP (django-anymail's tracking, outbox.contrib.anymail).
        BOUNCED = "bounced", _("bounced (reported by the ESP)")
        REJECTED = "rejected", _("rejected (reported by the ESP)")
        COMPLAINED = "complained", _("spam complaint (reported by the ESP)")
        # Any other event of the ESP about the message (delivered, opened, ...):
        # evidence that it has it, written once per event type.
        REPORTED = "reported", _("reported by the ESP")

    delivery = models.ForeignKey(
        Delivery, on_delete=models.CASCADE, related_name="attempt_log", verbose_name=_("delivery")
    )
    number = models.PositiveIntegerField(_("attempt number"))
    worker_id = models.CharField(
        _("worker"), max_length=WORKER_ID_MAX_LENGTH, blank=True, default=""
    )
    claim_token = models.UUIDField(_("claim token"), null=True, blank=True)
    started_at = models.DateTimeField(_("started"), default=timezone.now)
    finished_at = models.DateTimeField(_("finished"), null=True, blank=True)
    # No default: every Attempt is written once its outcome is known.
    outcome = models.CharField(_("outcome"), max_length=16, choices=Outcome.choices)
    error = models.TextField(_("error"), blank=True, default="")
    # Where the message was handed over: the server's greeting host name and the
    # peer address (ip:port) of the connection; blank when none was reached.
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
    # The ESP's own id of the message sent through its HTTP API (django-anymail's
    # ``anymail_status.message_id``): what its webhooks and its logs name.
    esp_message_id = models.CharField(
        _("ESP message id"), max_length=255, blank=True, default="", db_default=""
    )
    # A worker id, "sweeper" or "admin:<username>" (usernames are up to 150).
    actor = models.CharField(
        _("by"),
        max_length=WORKER_ID_MAX_LENGTH,
        blank=True,
        default="",
        help_text=_("worker, sweeper or user"),
    )

    objects = OutboxManager()

    class Meta:
        verbose_name = _("attempt")
        verbose_name_plural = _("attempts")
        ordering = ["delivery_id", "id"]
        indexes = [
            models.Index(fields=["delivery", "claim_token"], name="outbox_attempt_claim"),
            # An ESP's webhook names its own message id (outbox/contrib/anymail.py).
            models.Index(
                fields=["esp_message_id"],
                name="outbox_attempt_esp_id",
                condition=~models.Q(esp_message_id=""),
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.number} {self.get_outcome_display()}"


class EmailTemplate(models.Model):
    """A template edited in the admin: subject, text and HTML, one row per language.

    ``language`` blank is the default, used when no row exists for the
    language asked for. See :mod:`outbox.rendering` for the lookup order.
    """

    name = models.CharField(_("name"), max_length=255)
    language = models.CharField(
        _("language"),
        max_length=15,
        blank=True,
        default="",
        help_text=_("A language code such as de or pt-br; blank for the default."),
    )
    subject = models.CharField(_("subject"), max_length=998)
    text = models.TextField(_("text body"), blank=True, default="")
    html = models.TextField(_("HTML body"), blank=True, default="")
    description = models.TextField(_("description"), blank=True, default="")
    sample_context = models.JSONField(
        _("sample context"),
        default=dict,
        blank=True,
        help_text=_("A JSON object the admin's preview renders the template with."),
    )
    updated_at = models.DateTimeField(_("updated"), auto_now=True)

    class Meta:
        verbose_name = _("email template")
        verbose_name_plural = _("email templates")
        ordering = ["name", "language"]
        constraints = [
            # Also the index of the lookup `name = %s AND language IN (...)`.
            models.UniqueConstraint(fields=["name", "language"], name="outbox_template_lang"),
        ]

    def __str__(self) -> str:
        return f"{self.name} [{self.language}]" if self.language else self.name

    def clean(self) -> None:
        """Compile each part: a syntax error becomes a form error with its line."""
        check_template_syntax({"subject": self.subject, "text": self.text, "html": self.html})


class Suppression(models.Model):
    """An address the outbox never sends to: enqueueing to it creates a cancelled row."""

    class Source(models.TextChoices):
        REFUSAL = "refusal", _("refused by the mail server")
        OPERATOR = "operator", _("operator")
        API = "api", _("API")

    # Stored in one form (``save()``: lower-cased, the domain IDNA-encoded, see
    # ``validation.suppression_key``), so the unique index compares what
    # enqueue and a refusal name alike and serves enqueue's one query.
    address = models.CharField(_("address"), max_length=320, unique=True)
    reason = models.TextField(_("reason"), blank=True, default="")
    source = models.CharField(
        _("source"), max_length=16, choices=Source.choices, default=Source.OPERATOR
    )
    created_at = models.DateTimeField(_("created"), default=timezone.now, editable=False)

    objects = OutboxManager()

    class Meta:
        verbose_name = _("suppressed address")
        verbose_name_plural = _("suppressed addresses")
        ordering = ["address"]

    def __str__(self) -> str:
        return self.address

    def save(self, *args: object, **kwargs: object) -> None:
        self.address = suppression_key(self.address)
        super().save(*args, **kwargs)  # type: ignore[arg-type]

    def clean(self) -> None:
        # Before the form's unique check, so "A@x" collides with "a@x" (and
        # "a@bücher.de" with "a@xn--bcher-kva.de").
        self.address = suppression_key(self.address)
