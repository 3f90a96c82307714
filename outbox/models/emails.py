"""An email's content, stored once however many recipients: ``Email`` and ``Attachment``.

The content (the texts, the headers, the structure and the attachments' bytes)
does not stay as long as the row: once every delivery of an email is settled
(``sent``, ``failed`` or ``cancelled``), the sweeper clears it after
``OUTBOX["CONTENT_RETENTION"]``, or at its next pass for a ``sensitive`` email
(:func:`outbox.sweeper.retention.clear_content`). The row keeps its subject, sender and
deliveries, with their recipients, statuses, Message-IDs and attempts.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
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
    # (see outbox.mail.mailers). The database default serves raw INSERTs that
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
    # (see outbox.mail.structure.describe). NULL for ``enqueue_email`` and for rows
    # written before the column existed: those are built from the columns.
    structure = models.JSONField(
        _("message structure"), null=True, blank=True, default=None, editable=False
    )
    # Its content is cleared as soon as every delivery is settled (the sweeper's
    # next pass), not after CONTENT_RETENTION: a password reset, a login code.
    # The database default serves a previous release's inserts during an upgrade.
    sensitive = models.BooleanField(_("sensitive"), default=False, db_default=False, editable=False)
    # The trace context of the code that enqueued it (outbox.tracing: W3C
    # traceparent and tracestate), for the worker's send span; NULL when that
    # code was not traced or OpenTelemetry is not installed.
    trace_context = models.JSONField(
        _("trace context"), null=True, blank=True, default=None, editable=False
    )
    # When the sweeper cleared the content (module docstring); NULL while it is kept.
    content_cleared_at = models.DateTimeField(
        _("content cleared"), null=True, blank=True, editable=False
    )

    objects = OutboxManager()

    class Meta:
        verbose_name = _("email")
        verbose_name_plural = _("emails")
        permissions = [
            # View permission on emails shows their subjects and deliveries; the
            # bodies, headers and attachments need this one too (outbox.admin.emails.EmailAdmin).
            ("view_email_content", _("Can view the content of emails")),
        ]
        indexes = [
            # The sweeper's content retention: emails whose content is kept, oldest
            # first. Once their retention has passed they leave it, so it holds
            # about CONTENT_RETENTION's worth of mail however large the table.
            models.Index(
                fields=["created_at"],
                condition=Q(content_cleared_at__isnull=True),
                name="outbox_email_content_kept",
            ),
            # Sensitive emails whose content is kept: cleared once settled.
            models.Index(
                fields=["id"],
                condition=Q(sensitive=True, content_cleared_at__isnull=True),
                name="outbox_email_sensitive",
            ),
        ]

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
