"""The emails: what was enqueued once, with its deliveries and attachments below.

Read-only, like the deliveries. An email may have 100,000 deliveries: its page
lists the first hundred and counts the rest by status in one query.

The content (body, HTML, headers, structure, attachments) may hold a
password-reset link or a login code: its page shows it only to a user with
the permission ``outbox.view_email_content`` besides the view permission, and
nobody filters the list by it without that permission (Django's admin would
otherwise let ``?body__contains=...`` guess a token). Lists and the dashboard
never show content. Once the sweeper has cleared it (:func:`outbox.sweeper.retention.clear_content`)
the page says when.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib import admin
from django.db.models import Count, QuerySet
from django.db.models.functions import Length
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest
from django.template.defaultfilters import filesizeformat
from django.urls import reverse
from django.utils import timezone
from django.utils.formats import localize
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from ..models import Attachment, Delivery, Email
from .cells import status_badge
from .inlines import PartOfParentInline, ReadOnlyInline
from .paginator import EstimatedCountPaginator

Status = Delivery.Status

# What only a user with CONTENT_PERMISSION sees: the fields that hold the content.
CONTENT_PERMISSION = "outbox.view_email_content"
CONTENT_FIELDS = ("headers", "structure", "body", "html_message")


def may_view_content(request: HttpRequest) -> bool:
    """Whether ``request``'s user may see the content of emails (module docstring)."""
    return bool(request.user.has_perm(CONTENT_PERMISSION))


def _local(moment: datetime) -> datetime:
    return timezone.localtime(moment) if timezone.is_aware(moment) else moment


class FirstRowsInlineFormSet(BaseInlineFormSet):
    """Shows only the first :attr:`limit` related rows: an email may have 100,000."""

    limit = 100

    def get_queryset(self) -> QuerySet[Any]:
        queryset = super().get_queryset()
        if not queryset.query.is_sliced:
            queryset = self._queryset = queryset[: self.limit]
        return queryset


class DeliveryInline(ReadOnlyInline):
    model = Delivery
    formset = FirstRowsInlineFormSet
    fields = ("recipient", "status_display", "attempts", "sent_at", "updated_at", "message_id")
    readonly_fields = fields
    show_change_link = True

    @admin.display(description=_("status"))
    def status_display(self, obj: Delivery) -> SafeString:
        return status_badge(obj.status)


class AttachmentInline(PartOfParentInline):
    model = Attachment
    fields = ("name", "mimetype", "size")
    readonly_fields = fields

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Part of the content: names can tell as much as bodies.
        return super().has_view_permission(request, obj) and may_view_content(request)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Attachment]:
        # The size comes from the database; the content itself is never loaded.
        return super().get_queryset(request).defer("content").annotate(size=Length("content"))

    @admin.display(description=_("size"))
    def size(self, obj: Attachment) -> str:
        size: int = getattr(obj, "size")  # noqa: B009 (an annotation, unknown to the type)
        if size < 1024:
            return filesizeformat(size)
        return ngettext("%(size)s (%(count)d byte)", "%(size)s (%(count)d bytes)", size) % {
            "size": filesizeformat(size),
            "count": size,
        }


@admin.register(Email)
class EmailAdmin(admin.ModelAdmin):
    list_display = ("subject_display", "from_email", "created_at")
    list_filter = ("created_at",)
    search_fields = ("subject",)
    ordering = ("-id",)
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    paginator = EstimatedCountPaginator
    actions = None
    fields = (
        "subject",
        "from_email",
        "mailer",
        "reply_to",
        "headers",
        "structure",
        "created_at",
        "sensitive",
        "deliveries_summary",
        "body",
        "html_message",
    )
    readonly_fields = (*fields, "content")
    inlines = (DeliveryInline, AttachmentInline)

    def get_fields(self, request: HttpRequest, obj: Email | None = None) -> Any:
        # Without the permission, or once cleared, one line says why in their place.
        if may_view_content(request) and (obj is None or obj.content_cleared_at is None):
            return self.fields
        return [f for f in self.fields if f not in CONTENT_FIELDS] + ["content"]

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        if lookup.split("__", 1)[0] in (*CONTENT_FIELDS, "attachments") and not (
            may_view_content(request)
        ):
            return False  # a filter on the body would tell it, match by match
        return super().lookup_allowed(lookup, value, request)

    @admin.display(description=_("content"))
    def content(self, obj: Email) -> str:
        if obj.content_cleared_at is not None:
            return gettext(
                "Cleared on %(when)s, once every delivery was settled (its retention, or "
                "the email was sensitive). The subject, the recipients, the Message-IDs and "
                "the attempts are kept."
            ) % {"when": localize(_local(obj.content_cleared_at))}
        return gettext(
            "Hidden: the body, headers and attachments need the permission "
            '"Can view the content of emails" (outbox.view_email_content).'
        )

    @admin.display(description=_("subject"), ordering="subject")
    def subject_display(self, obj: Email) -> str:
        return Truncator(obj.subject).chars(80)

    @admin.display(description=_("deliveries"))
    def deliveries_summary(self, obj: Email) -> SafeString:
        counts = dict(
            obj.deliveries.order_by()
            .values("status")
            .annotate(n=Count("pk"))
            .values_list("status", "n")
        )
        total = sum(counts.values())
        url = reverse(f"{self.admin_site.name}:outbox_delivery_changelist")
        by_status = format_html_join(
            ", ",
            "{} {}",
            ((counts[s], Status(s).label) for s in Status.values if s in counts),
        )
        limit = FirstRowsInlineFormSet.limit
        return format_html(
            '{}: {}. {} <a href="{}?email__id__exact={}">{}</a>',
            ngettext("%(count)d delivery", "%(count)d deliveries", total) % {"count": total},
            by_status or "-",
            gettext("The first %(limit)d are listed below.") % {"limit": limit}
            if total > limit
            else "",
            url,
            obj.pk,
            gettext("Show them in the delivery list"),
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Email | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Email | None = None) -> bool:
        return False
