"""Templates edited in the admin: ``EmailTemplate``."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from ..validation import check_template_syntax


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
