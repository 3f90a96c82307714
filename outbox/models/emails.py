"""An email's content, stored once however many recipients: ``Email`` and ``Attachment``."""

from __future__ import annotations

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .limits import MAILER_MAX_LENGTH
from .routing import OutboxManager


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
