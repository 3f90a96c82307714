"""The operator's view of the outbox.

Deliveries are read-only here: nothing in the admin saves a row it has read
(a worker may be changing it at that moment). The only way to change a row is
one of the actions, each a call to :mod:`outbox.operations`, which changes only
rows in the statuses it allows (never a row that is processing right now) and
writes an :class:`~outbox.models.Attempt` with the acting user as its actor.

The delivery list is built for tables of millions of rows: one query for the
page (the email's subject comes in by a join), no count of a long list,
filtered or not, where PostgreSQL can estimate it (:mod:`.paginator`), no
facet counts, and a search that each index answers (:func:`search_condition`):
by address or Message-ID, never a substring scan. Filtered by a status, the
page is read from an index: the partial indexes of queued and processing rows,
the ``(status, id, priority)`` index of failed, abandoned and cancelled ones,
and the primary key for sent rows, nearly all of the table
(tests/admin/test_query_plans.py).

"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import flatten_fieldsets
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils.safestring import SafeString
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from .. import operations
from ..mail import valve
from ..models import Attempt, Delivery
from ..operations import TransitionResult
from ..validation import bare_address
from .cells import compact_time, recipient_and_subject, status_badge
from .inlines import PartOfParentInline

# Re-exported: its import path before it had a module of its own.
from .paginator import EstimatedCountPaginator

Status = Delivery.Status

# Django >= 6.1 can offer an action on the change form too: there it settles
# the one delivery the operator is looking at.
if hasattr(admin, "ActionLocation"):
    _ACTION_LOCATIONS: dict[str, Any] = {
        "location": [admin.ActionLocation.CHANGE_LIST, admin.ActionLocation.CHANGE_FORM]
    }
else:  # pragma: no cover - Django < 6.1
    _ACTION_LOCATIONS = {}


# -- deliveries -------------------------------------------------------------------


class AttemptInline(PartOfParentInline):
    model = Attempt
    verbose_name = _("attempt")
    verbose_name_plural = _("attempts and operator decisions")
    fields = (
        "number",
        "worker_id",
        "started_at",
        "finished_at",
        "outcome",
        "server",
        "esp_message_id",
        "error",
        "actor",
    )
    readonly_fields = fields

    @admin.display(description=_("server"))
    def server(self, obj: Attempt) -> str:
        """Where the message was handed over: the greeting's host name and the peer address."""
        if obj.server_address:
            return f"{obj.server_host or '?'} ({obj.server_address})"
        return obj.server_host


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    # Fits a 1,366 px window beside the app list and the filters: the subject
    # under the recipient takes what the short columns leave, cut to fit, the
    # full text in a tooltip (the template's CSS). Priority is a filter; the
    # worker, the claim and the processing start are on the delivery's page.
    change_list_template = "admin/outbox/delivery_change_list.html"
    list_display = (
        "recipient_display",
        "status_display",
        "attempts_display",
        "sent_display",
        "updated_display",
    )
    list_select_related = ("email",)
    list_filter = ("status", "priority", "updated_at", "created_at")
    # Shows the search box; what a term matches is search_condition's.
    search_fields = ("recipient_key", "message_id")
    search_help_text = _(
        "Search by a recipient's address or any start of it, in any case or form "
        "(bob@example.com, Bob <BOB@Example.com>, bob, bob@exa), or by a whole "
        "Message-ID (<id@host>, brackets optional). Subjects are not searched here."
    )
    ordering = ("-id",)
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    paginator = EstimatedCountPaginator
    actions = ("requeue", "requeue_now", "mark_sent", "mark_failed", "cancel")
    fieldsets = (
        (
            None,
            {"fields": ("recipient", "email", "message_id", "status_display", "priority")},
        ),
        (
            _("Sending"),
            {
                "fields": (
                    ("attempts", "max_attempts"),
                    ("not_before", "expires_at"),
                    "worker_id",
                    "claim_token",
                    "processing_started_at",
                    ("server_host", "server_address"),
                    "sent_at",
                    "last_error",
                )
            },
        ),
        (_("Record"), {"fields": ("idempotency_key", "created_at", "updated_at")}),
    )
    readonly_fields = (*flatten_fieldsets(fieldsets), "staging_valve")
    inlines = (AttemptInline,)

    def get_fieldsets(self, request: HttpRequest, obj: Delivery | None = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)
        if not valve.state()["on"]:
            return fieldsets
        # While the staging valve is on, what it does with this row, under its recipient.
        (name, options), *rest = fieldsets
        fields = list(options["fields"])
        fields.insert(fields.index("recipient") + 1, "staging_valve")
        return [(name, {**options, "fields": fields}), *rest]

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Delivery], search_term: str
    ) -> tuple[QuerySet[Delivery], bool]:
        where = search_condition(search_term)
        return (queryset if where is None else queryset.filter(where)), False

    # -- columns

    @admin.display(description=_("recipient and subject"), ordering="recipient")
    def recipient_display(self, obj: Delivery) -> SafeString:
        # The row keeps its own recipient (search finds it by that address);
        # where the staging valve sends its copies instead follows the arrow.
        target = valve.redirect_to(obj.recipient)
        shown = f"{obj.recipient} \u2192 {target}" if target else obj.recipient
        return recipient_and_subject(shown, obj.email.subject)

    @admin.display(description=_("staging valve"))
    def staging_valve(self, obj: Delivery) -> str:
        if not valve.state()["on"]:
            return gettext("off")
        if valve.allows(obj.recipient):
            return gettext("on; this recipient is allowed and gets its own copy")
        target = valve.redirect_to(obj.recipient)
        if target:
            return gettext(
                "on; this recipient is not allowed: a copy goes to %(to)s instead, with "
                "%(header)s: %(recipient)s (each sent copy is in the attempt log)"
            ) % {
                "to": target,
                "header": valve.ORIGINAL_RECIPIENT_HEADER,
                "recipient": obj.recipient,
            }
        return gettext("on; this recipient is not allowed: its delivery is cancelled, never sent")

    @admin.display(description=_("sent"), ordering="sent_at")
    def sent_display(self, obj: Delivery) -> SafeString | None:
        return compact_time(obj.sent_at)

    @admin.display(description=_("updated"), ordering="updated_at")
    def updated_display(self, obj: Delivery) -> SafeString | None:
        return compact_time(obj.updated_at)

    @admin.display(description=_("status"), ordering="status")
    def status_display(self, obj: Delivery) -> SafeString:
        return status_badge(obj.status)

    @admin.display(description=_("attempts"), ordering="attempts")
    def attempts_display(self, obj: Delivery) -> str:
        return f"{obj.attempts}/{obj.max_attempts}"

    # -- permissions: rows change only through the actions

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Delivery | None = None) -> bool:
        # The model-level check decides who may run the actions. A single row
        # is never edited through its form: saving it would write back every
        # column as it was read, over whatever a worker did meanwhile.
        if obj is not None:
            return False
        return super().has_change_permission(request)

    def has_delete_permission(self, request: HttpRequest, obj: Delivery | None = None) -> bool:
        # Also keeps the site-wide "delete selected" action away.
        return False

    # -- actions

    @admin.action(
        permissions=["change"], description=_("Requeue (send again)"), **_ACTION_LOCATIONS
    )
    def requeue(self, request: HttpRequest, queryset: QuerySet[Delivery]) -> None:
        self._run(
            request,
            queryset,
            operations.requeue,
            lambda n: ngettext("Requeued %(count)d delivery.", "Requeued %(count)d deliveries.", n),
        )

    @admin.action(
        permissions=["change"],
        description=_("Requeue and send now (ignore a later send time)"),
        **_ACTION_LOCATIONS,
    )
    def requeue_now(self, request: HttpRequest, queryset: QuerySet[Delivery]) -> None:
        self._run(
            request,
            queryset,
            operations.requeue_now,
            lambda n: ngettext(
                "Requeued %(count)d delivery to send now.",
                "Requeued %(count)d deliveries to send now.",
                n,
            ),
        )

    @admin.action(
        permissions=["change"],
        description=_("Mark as sent (confirmed in the mail logs)"),
        **_ACTION_LOCATIONS,
    )
    def mark_sent(self, request: HttpRequest, queryset: QuerySet[Delivery]) -> None:
        self._run(
            request,
            queryset,
            operations.mark_sent,
            lambda n: ngettext(
                "Marked %(count)d delivery as sent.", "Marked %(count)d deliveries as sent.", n
            ),
        )

    @admin.action(permissions=["change"], description=_("Mark as failed"), **_ACTION_LOCATIONS)
    def mark_failed(self, request: HttpRequest, queryset: QuerySet[Delivery]) -> None:
        self._run(
            request,
            queryset,
            operations.mark_failed,
            lambda n: ngettext(
                "Marked %(count)d delivery as failed.",
                "Marked %(count)d deliveries as failed.",
                n,
            ),
        )

    @admin.action(permissions=["change"], description=_("Cancel"), **_ACTION_LOCATIONS)
    def cancel(self, request: HttpRequest, queryset: QuerySet[Delivery]) -> None:
        self._run(
            request,
            queryset,
            operations.cancel,
            lambda n: ngettext(
                "Cancelled %(count)d delivery.", "Cancelled %(count)d deliveries.", n
            ),
        )

    def _run(
        self,
        request: HttpRequest,
        queryset: QuerySet[Delivery],
        operation: Callable[[Iterable[int], str], TransitionResult],
        changed_message: Callable[[int], str],
    ) -> None:
        actor = f"admin:{request.user.get_username()}"
        result = operation(queryset.values_list("pk", flat=True), actor)
        count = len(result.changed)
        message = changed_message(count) % {"count": count}
        skipped = sum(result.skipped.values())
        if skipped:
            message += " " + ngettext(
                "Skipped %(count)d: %(reasons)s.", "Skipped %(count)d: %(reasons)s.", skipped
            ) % {"count": skipped, "reasons": skip_reasons(result.skipped)}
        self.message_user(request, message, messages.WARNING if skipped else messages.SUCCESS)


def search_condition(term: str) -> Q | None:
    """What the delivery list's search matches, each through an index; None: no search.

    The term, normalised as ``recipient_key`` is (lower case, "Name <address>"
    read as its address, a non-ASCII domain in its IDNA form), matches every
    row whose ``recipient_key`` starts with it: a whole address, or any start
    of one, with or without the domain's start (``bob``, ``bob@``, ``bob@exa``,
    ``Bob@Example.c``), a prefix match its index answers (``varchar_pattern_ops``).
    A Unicode domain is compared in its IDNA form, so its last label is matched
    whole (``bob@bücher`` finds ``bob@bücher.de``, ``bob@büch`` does not; its
    IDNA form's start, ``bob@xn--bch``, does). A term of the form ``left@right``
    is also tried as a Message-ID, with and without its angle brackets (the
    unique index on ``message_id``). A substring (``icontains``) of the
    recipient, the Message-ID or the subject, as the search once was, reads
    every row: 11 s at 5 million.
    """
    term = term.strip()
    if not term:
        return None
    key = bare_address(term)
    where = Q(recipient_key__startswith=key)
    left, at, right = term.strip("<>").rpartition("@")
    if at and left and right:
        message_id = term.strip("<>")
        where |= Q(message_id__in=[message_id, f"<{message_id}>"])
    return where


def skip_reasons(skipped: Counter[str]) -> str:
    """Skipped rows by their current status, in life-cycle order: "1 processing, 2 sent"."""
    order = {status: index for index, status in enumerate(Status.values)}
    parts = []
    for status in sorted(skipped, key=lambda s: (order.get(s, len(order)), s)):
        if status in Status.values:
            label = str(Status(status).label)
        elif status == "deleted":
            label = gettext("deleted")
        elif status == operations.CONTENT_CLEARED:
            label = gettext("whose content was cleared (enqueue the email again)")
        else:
            label = status
        parts.append(gettext("%(count)d %(status)s") % {"count": skipped[status], "status": label})
    return ", ".join(parts)
