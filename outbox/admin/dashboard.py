"""The outbox dashboard: the operator's four answers at a glance, in the admin.

``/admin/outbox/dashboard/`` (URL name ``admin:outbox_dashboard``) shows whether
mail flows (sent and failed per minute over the last hour, drawn server-side as
inline SVG), how far behind it is (the rows due now and the age of the oldest),
whether the workers are alive (heartbeat age, and the rows each holds), what
needs a person (the abandoned rows, linked to the filtered delivery list) and
whether Redis agrees with the database; and the sending control: the pause
switches with Pause/Resume buttons, and the rate limits' use
(:mod:`outbox.admin.control_panel`). A mailer whose failure alarm is on
(:mod:`outbox.queue.alarm`) is a red note at the top, with its counts and the
most frequent cause of its failures.

The numbers are those of :func:`outbox.status.collect` (what ``manage.py
outbox_status`` shows): five or six database queries and one Redis transaction
(two round trips when the queued rows are few enough to compare with Redis id
by id), plus a round trip each for the pause switches, the rate limits (when
set) and the failure alarm. The chart is one more query, grouping the sent rows of the last hour by
the minute of ``sent_at`` and the failed ones by the minute of ``updated_at``.
Each query reads a partial index that holds only the rows it counts, so none
grows with the history of sent mail, except the count of sent rows itself: on
PostgreSQL, once there are :data:`outbox.status.snapshot.ESTIMATE_ABOVE` of them, it is
the planner's estimate, marked "≈" on the page. Everything else is exact, and
the page says which is which.

:class:`DashboardSiteMixin` adds the page to a project's own
:class:`~django.contrib.admin.AdminSite` class, and :func:`install` to a site
instance (``outbox.admin`` installs it on the default site): its URL, and a
"Dashboard" row in the outbox section of the app list. Only staff who may view
deliveries see either; anyone else gets 403. The buttons' URL
(``outbox/dashboard/control/``) takes POSTs from staff who may change
deliveries only.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib.admin import AdminSite
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.db.models import Case, Count, DateTimeField, F, Q, When
from django.db.models.functions import TruncMinute
from django.http import HttpRequest, HttpResponseBase
from django.template.response import TemplateResponse
from django.urls import URLPattern, URLResolver, path, reverse
from django.utils import timezone
from django.utils.http import urlencode
from django.utils.translation import gettext, ngettext

from ..compat.django import extend_admin_site
from ..models import Delivery
from ..queue.reliable import RedisQueue
from ..status import snapshot as status
from . import control_panel as dashboard_control
from .cells import age, status_badge

Status = Delivery.Status

URL_NAME = "outbox_dashboard"
TEMPLATE = "admin/outbox/dashboard.html"
# The chart: one bar pair per minute of the last hour, the current minute last.
CHART_MINUTES = 60
CHART_WIDTH, CHART_HEIGHT = 720, 190
PLOT_LEFT, PLOT_TOP, PLOT_BOTTOM = 44, 30, 160  # in SVG user units
SLOT = 11  # one minute; CHART_MINUTES * SLOT + PLOT_LEFT + a margin = CHART_WIDTH
BAR = 5
# At most this many held row ids are listed per worker (the count is always shown).
HELD_SHOWN = 5


def can_view(request: HttpRequest) -> bool:
    """Whether the user may see the dashboard: the admin's rule for viewing deliveries."""
    opts = Delivery._meta
    return any(
        request.user.has_perm(f"{opts.app_label}.{get_permission_codename(action, opts)}")
        for action in ("view", "change")
    )


# -- the chart --------------------------------------------------------------------


@dataclass(frozen=True)
class Bar:
    """One bar of the chart, in SVG user units."""

    kind: str  # "sent" or "failed"
    minute: str  # "14:05", local time
    count: int
    x: float
    y: float
    height: float


@dataclass(frozen=True)
class Chart:
    """Sent and failed per minute over the last :data:`CHART_MINUTES` minutes."""

    start: datetime
    sent: tuple[int, ...]
    failed: tuple[int, ...]

    @property
    def peak(self) -> int:
        return max((*self.sent, *self.failed, 1))

    def label(self, index: int) -> str:
        return timezone.localtime(self.start + timedelta(minutes=index)).strftime("%H:%M")

    def bars(self) -> list[Bar]:
        """A bar for every minute with a non-zero count (at least one unit high)."""
        scale = (PLOT_BOTTOM - PLOT_TOP) / self.peak
        bars = []
        for offset, kind, counts in ((0.5, "sent", self.sent), (0.5 + BAR, "failed", self.failed)):
            for index, count in enumerate(counts):
                if count:
                    height = max(1.0, round(count * scale, 1))
                    x = PLOT_LEFT + index * SLOT + offset
                    bars.append(
                        Bar(kind, self.label(index), count, x, PLOT_BOTTOM - height, height)
                    )
        return bars

    def ticks(self) -> list[tuple[float, str]]:
        """``(x, label)`` under the first minute, the middle one and the current one."""
        return [
            (PLOT_LEFT + index * SLOT + SLOT / 2, self.label(index))
            for index in (0, CHART_MINUTES // 2, CHART_MINUTES - 1)
        ]


def per_minute(now: datetime) -> Chart:
    """One query: sent rows by minute of ``sent_at``, failed rows by minute of ``updated_at``.

    On PostgreSQL the two halves of the condition read the partial index on
    ``sent_at`` of sent rows and the ``(status, updated_at)`` index.
    """
    start = now.replace(second=0, microsecond=0) - timedelta(minutes=CHART_MINUTES - 1)
    when = Case(
        When(status=Status.SENT, then=F("sent_at")),
        default=F("updated_at"),
        output_field=DateTimeField(),
    )
    rows = (
        Delivery.objects.filter(
            Q(status=Status.SENT, sent_at__gte=start)
            | Q(status=Status.FAILED, updated_at__gte=start)
        )
        .annotate(minute=TruncMinute(when, tzinfo=UTC))
        .order_by()
        .values("status", "minute")
        .annotate(n=Count("id"))
    )
    sent = [0] * CHART_MINUTES
    failed = [0] * CHART_MINUTES
    for row in rows:
        index = int((row["minute"] - start).total_seconds() // 60)
        if 0 <= index < CHART_MINUTES:
            (sent if row["status"] == Status.SENT else failed)[index] += row["n"]
    return Chart(start, tuple(sent), tuple(failed))


# -- the page ---------------------------------------------------------------------


def _changelist(site: AdminSite, **filters: str) -> str:
    url = reverse(f"{site.name}:outbox_delivery_changelist")
    return f"{url}?{urlencode(filters)}" if filters else url


def _database_context(site: AdminSite, database: dict[str, Any]) -> dict[str, Any]:
    by_status = database["by_status"]
    estimated = set(database["estimated"])
    return {
        "counts": [
            {
                "status": value,
                "badge": status_badge(value),
                "count": by_status.get(value, 0),
                "estimated": value in estimated,
                "url": _changelist(site, status__exact=value),
            }
            for value in Status.values
        ],
        "total": sum(by_status.values()),
        "estimated": bool(estimated),
        "due": database["due"],
        "scheduled": database["scheduled"],
        "oldest_due_age": age(database["oldest_due_age"]),
        "abandoned": by_status.get(Status.ABANDONED, 0),
        "abandoned_url": _changelist(site, status__exact=Status.ABANDONED),
    }


def _worker_context(site: AdminSite, redis_part: dict[str, Any]) -> dict[str, Any]:
    def held(ids: list[int]) -> list[dict[str, Any]]:
        return [
            {"id": pk, "url": reverse(f"{site.name}:outbox_delivery_change", args=[pk])}
            for pk in ids[:HELD_SHOWN]
        ]

    workers = redis_part["workers"]
    return {
        "live_workers": [
            {
                "id": w["id"],
                "heartbeat_age": age(w["heartbeat_age"]),
                "held_count": len(w["held"]),
                "held": held(w["held"]),
                "held_more": max(0, len(w["held"]) - HELD_SHOWN),
                # The README's "Upgrading": the sweeper clears no content while it runs.
                "earlier_release": (
                    w["release_level"] if w["release_level"] < redis_part["release_level"] else None
                ),
            }
            for w in workers
            if w["alive"]
        ],
        "silent_workers": sum(1 for w in workers if not w["alive"]),
        "dead_workers": len(redis_part["dead_workers"]),
        "ready": sum(redis_part["ready"].values()),
        "redis_scheduled": redis_part["scheduled"],
    }


def _agreement_context(agreement: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    if agreement is None:
        return None
    names = {"ready": gettext("due rows"), "scheduled": gettext("scheduled rows")}
    return [
        {"name": names[key], "key": key, **agreement[key]}
        for key in ("ready", "scheduled")
        if key in agreement
    ]


def dashboard_context(
    site: AdminSite, queue: RedisQueue | None = None, now: datetime | None = None
) -> dict[str, Any]:
    """What the page shows: one :func:`status.collect` and one :func:`per_minute`."""
    now = now or timezone.now()
    snapshot = status.collect(queue, now)
    database, redis_part = snapshot["database"], snapshot["redis"]
    context: dict[str, Any] = {
        "now": now,
        "database_ok": database["ok"],
        "database_error": database["error"],
        "redis_ok": redis_part["ok"],
        "redis_error": redis_part["error"],
        "agreement": _agreement_context(snapshot["agreement"]),
        "compare_limit": status.COMPARE_LIMIT,
        # The staging valve, shown first while it is on (outbox.mail.valve.state).
        "valve": snapshot["valve"],
    }
    if database["ok"]:
        context.update(_database_context(site, database))
        chart = per_minute(now)
        context.update(
            chart=chart,
            bars=chart.bars(),
            ticks=chart.ticks(),
            sent_last_hour=sum(chart.sent),
            failed_last_hour=sum(chart.failed),
        )
    if redis_part["ok"]:
        context.update(_worker_context(site, redis_part))
        context["control"] = dashboard_control.control_context(redis_part)
        context["failure_alarms"] = _failure_alarms(redis_part)
    return context


def _failure_alarms(redis_part: dict[str, Any]) -> list[dict[str, Any]]:
    """The mailers whose failure alarm is on, for the red note at the top."""
    failures, now = redis_part["failures"], redis_part["control"]["read_at"]
    return [
        {
            "mailer": mailer,
            "failed": counts["failed"],
            "attempts": counts["attempts"],
            "cause": counts["cause"],
            "lasted": age(max(0.0, now - (counts["since"] or now))),
            "window": age(failures["window"]),
        }
        for mailer, counts in sorted(failures["mailers"].items())
        if counts["alarm"]
    ]


def _chart_geometry() -> dict[str, Any]:
    return {
        "width": CHART_WIDTH,
        "height": CHART_HEIGHT,
        "left": PLOT_LEFT,
        "top": PLOT_TOP,
        "bottom": PLOT_BOTTOM,
        "right": PLOT_LEFT + CHART_MINUTES * SLOT,
        "bar": BAR,
        "label_y": PLOT_BOTTOM + 18,
    }


def dashboard_view(request: HttpRequest, site: AdminSite) -> TemplateResponse:
    """The page; wrapped in ``site.admin_view`` by :func:`install` (login, staff, no cache)."""
    if not can_view(request):
        raise PermissionDenied
    data = dashboard_context(site)
    workers = len(data.get("live_workers", ()))
    context = {
        **site.each_context(request),
        "title": gettext("Outbox dashboard"),
        "app_label": Delivery._meta.app_label,
        "app_name": Delivery._meta.app_config.verbose_name,
        "geometry": _chart_geometry(),
        "workers_title": ngettext("%(count)d live worker", "%(count)d live workers", workers)
        % {"count": workers},
        "can_change_control": dashboard_control.can_change(request),
        "control_url": reverse(f"{site.name}:{dashboard_control.URL_NAME}"),
        **data,
    }
    return TemplateResponse(request, TEMPLATE, context)


# -- wiring into an admin site ------------------------------------------------------


def _app_list_entry(site: AdminSite) -> dict[str, Any]:
    return {
        "name": gettext("Dashboard"),
        "object_name": "Dashboard",
        "perms": {"add": False, "change": False, "delete": False, "view": True},
        "admin_url": reverse(f"{site.name}:{URL_NAME}"),
        "add_url": None,
        "view_only": True,
    }


def dashboard_urls(site: AdminSite) -> list[URLPattern | URLResolver]:
    """The dashboard's two URLs on ``site``: the page and its buttons."""

    def view(request: HttpRequest) -> TemplateResponse:
        return dashboard_view(request, site)

    def control(request: HttpRequest) -> HttpResponseBase:
        return dashboard_control.control_view(request, site, back_to=URL_NAME)

    page = path("outbox/dashboard/", site.admin_view(view), name=URL_NAME)
    buttons = path(
        "outbox/dashboard/control/",
        site.admin_view(control),
        name=dashboard_control.URL_NAME,
    )
    return [page, buttons]


def with_dashboard_entry(
    site: AdminSite, request: HttpRequest, app_list: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``app_list`` with a Dashboard row first in the outbox's section, for those who may view it."""
    for app in app_list:
        if app["app_label"] == Delivery._meta.app_label and can_view(request):
            app["models"].insert(0, _app_list_entry(site))
    return app_list


class DashboardSiteMixin:
    """Put before ``AdminSite`` in a project's own site class: the site gets the dashboard.

    ``class MySite(DashboardSiteMixin, AdminSite)``: its URL and the
    Dashboard row of the app list, through the site's own hooks
    (``get_urls``, ``get_app_list``).
    """

    def get_urls(self) -> list[URLPattern | URLResolver]:
        site: AdminSite = self  # type: ignore[assignment]
        return [*dashboard_urls(site), *super().get_urls()]  # type: ignore[misc]

    def get_app_list(
        self, request: HttpRequest, app_label: str | None = None
    ) -> list[dict[str, Any]]:
        site: AdminSite = self  # type: ignore[assignment]
        entries = super().get_app_list(request, app_label)  # type: ignore[misc]
        return with_dashboard_entry(site, request, entries)


def install(site: AdminSite) -> None:
    """Add the dashboard to the site instance ``site`` (``outbox.admin`` does so for the default one).

    A site whose class has :class:`DashboardSiteMixin` has it already.
    Another site's ``get_urls`` and ``get_app_list`` are wrapped on this
    instance (:func:`outbox.compat.django.extend_admin_site`: Django has no
    public way to add a view to a site the app did not create); calling it
    twice changes nothing.
    """
    if isinstance(site, DashboardSiteMixin):
        return
    extend_admin_site(
        site,
        urls=lambda: dashboard_urls(site),
        app_list=lambda request, entries: with_dashboard_entry(site, request, entries),
    )
