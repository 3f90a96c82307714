"""Addresses the outbox never sends to: ``Suppression``."""

from __future__ import annotations

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..validation import suppression_key
from .routing import OutboxManager


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
