"""The evidence log an operator reads before settling a row by hand: ``Attempt``."""

from __future__ import annotations

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .deliveries import Delivery
from .limits import SERVER_ADDRESS_MAX_LENGTH, SERVER_HOST_MAX_LENGTH, WORKER_ID_MAX_LENGTH
from .routing import OutboxManager


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
            # An ESP's webhook names its own message id (outbox.contrib.anymail.find_delivery).
            models.Index(
                fields=["esp_message_id"],
                name="outbox_attempt_esp_id",
                condition=~models.Q(esp_message_id=""),
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.number} {self.get_outcome_display()}"
