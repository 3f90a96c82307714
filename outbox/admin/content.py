"""Admin for the content side of the outbox: email templates and the suppression list.

Imported by :mod:`outbox.admin`, so it registers with the default site.
A template's change page shows the saved template rendered with its sample
context (subject, text, and the HTML in a sandboxed frame); its syntax is
checked on save by ``EmailTemplate.clean()``, so an error is a form error
with its line.
"""

from __future__ import annotations

from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..models import EmailTemplate, Suppression
from ..rendering import compile_row, render
from ..validation import suppression_key


@admin.register(EmailTemplate)
class EmailTemplateAdmin(admin.ModelAdmin):
    list_display = ["name", "language", "subject", "updated_at"]
    list_filter = ["language"]
    search_fields = ["name", "subject", "description"]
    readonly_fields = ["updated_at", "preview"]
    fieldsets = [
        (None, {"fields": ["name", "language", "description"]}),
        (_("Content"), {"fields": ["subject", "text", "html"]}),
        (_("Preview"), {"fields": ["sample_context", "preview", "updated_at"]}),
    ]

    @admin.display(description=_("rendered with the sample context"))
    def preview(self, obj: EmailTemplate) -> SafeString | str:
        if obj.pk is None:
            return gettext("Save the template to see it rendered.")
        if not isinstance(obj.sample_context, dict):
            return gettext("The sample context must be a JSON object.")
        try:
            compiled = compile_row(EmailTemplate.objects.get(pk=obj.pk))
            subject, text, html = render(compiled, obj.sample_context)
        except ValidationError as exc:
            return format_html('<p class="errornote">{}</p>', " ".join(exc.messages))
        # Rendered templates are SafeStrings, which format_html would not
        # escape: escape() always does. The HTML body is shown as a page of
        # its own in a sandboxed frame (no scripts, no access to the admin).
        return format_html(
            "<p><strong>{}</strong> {}</p><pre style='white-space: pre-wrap'>{}</pre>{}",
            _("Subject:"),
            escape(subject),
            escape(text),
            format_html(
                '<iframe sandbox srcdoc="{}" title="{}" '
                'style="width: 100%; min-height: 20em; border: 1px solid #ccc"></iframe>',
                escape(html),
                _("HTML body"),
            )
            if html
            else "",
        )


@admin.register(Suppression)
class SuppressionAdmin(admin.ModelAdmin):
    list_display = ["address", "source", "reason", "created_at"]
    list_filter = ["source"]
    search_fields = ["address", "reason"]
    readonly_fields = ["created_at"]

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, str | list[str]]:
        return {"source": Suppression.Source.OPERATOR}

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Suppression], search_term: str
    ) -> tuple[QuerySet[Suppression], bool]:
        """Also find an address searched for in its Unicode form (stored IDNA-encoded)."""
        found, duplicates = super().get_search_results(request, queryset, search_term)
        term = search_term.strip()
        # A bare domain (or a part of one) is encoded as the domain of an address.
        key = suppression_key(term if "@" in term else "@" + term).removeprefix("@")
        if key and key != term.lower():
            found |= queryset.filter(address__contains=key)
        return found, duplicates
