"""The dashboard's "Sending control" panel: the pause switches, the rate limits, and the buttons.

The panel shows what :func:`outbox.queue.control.state` and
:func:`outbox.queue.ratelimit.usage` report, as read in the dashboard's one
snapshot (:func:`outbox.status.collect`): whether sending runs, is paused (since
when) or is *unknown* (Redis holds no switches: nothing has run since Redis
started, or it lost them and no worker has written them back yet), whether
Redis lost the switches (``lost_at``, until a global resume clears the mark),
the paused domains, the domains held after a 421/450 with their remaining
wait, and each rate limit's use.

**The buttons** POST to ``admin:outbox_control`` (``/admin/outbox/dashboard/control/``)
and call the very functions ``manage.py outbox_pause`` and ``outbox_resume``
call, :func:`outbox.queue.control.pause` and :func:`outbox.queue.control.resume`, with
the admin user's name, which they log (logger ``outbox.queue.control``): an operator
can always see who paused. They are shown to, and accepted from, staff with
the ``change_delivery`` permission only; staff who may only view deliveries
see the state and no buttons, and their POST gets 403. The admin's own CSRF
protection applies (``AdminSite.admin_view``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.admin import AdminSite
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponseRedirect
from django.urls import reverse
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _
from django.views.decorators.http import require_POST
from redis.exceptions import RedisError

from ..models import Delivery
from ..queue import control
from .cells import age

URL_NAME = "outbox_control"
ACTIONS = (("pause", _("Pause")), ("resume", _("Resume")))


def can_change(request: HttpRequest) -> bool:
    """Whether the user may pause and resume: the admin's rule for changing deliveries."""
    opts = Delivery._meta
    return bool(
        request.user.has_perm(f"{opts.app_label}.{get_permission_codename('change', opts)}")
    )


def _when(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, tz=UTC)


def control_context(redis_part: dict[str, Any]) -> dict[str, Any]:
    """The panel's data from a snapshot's Redis part (``ok`` is true)."""

    switches = redis_part["control"]
    now = switches["read_at"]
    since = switches["paused_since"]
    return {
        "state": "unknown"
        if not switches["known"]
        else ("paused" if switches["paused"] else "running"),
        "paused_since": _when(since),
        "paused_for": age(None if since is None else max(0.0, now - since)),
        "lost_at": _when(switches["lost_at"]),
        "paused_domains": [
            {"domain": domain, "since": _when(at), "for": age(max(0.0, now - at))}
            for domain, at in sorted(switches["paused_domains"].items())
        ],
        "slow_domains": [
            {"domain": domain, "remaining": age(max(0.0, until - now))}
            for domain, until in sorted(switches["slow_domains"].items())
        ],
        "paused_mailers": [
            {
                "mailer": mailer,
                "paused": paused["until"] > now,
                "remaining": age(max(0.0, paused["until"] - now)),
                "count": paused["count"],
                "why": paused["why"],
            }
            for mailer, paused in sorted(switches.get("paused_mailers", {}).items())
        ],
        "limits": [
            {
                **limit,
                "percent": round(100 * min(1.0, limit["used"] / limit["capacity"])),
                "next_free": age(limit["next_free_in"]) if limit["next_free_in"] else "",
            }
            for limit in redis_part["rate_limits"]
        ],
    }


class ControlForm(forms.Form):
    """One button's POST: pause or resume, everything or one domain."""

    action = forms.ChoiceField(choices=ACTIONS)
    domain = forms.CharField(required=False, max_length=253, label=_("Recipient domain"))

    def clean_domain(self) -> str:
        # As outbox_pause --domain validates it (lower-cased, a domain name).
        domain: str = self.cleaned_data["domain"]
        return control.clean_domain(domain) if domain.strip() else ""


def _done(action: str, domain: str, state: control.ControlState) -> str:
    if domain:
        if action == "pause":
            return gettext("Mail to %(domain)s paused; it waits as queued.") % {"domain": domain}
        return gettext("Mail to %(domain)s resumed.") % {"domain": domain}
    if action == "pause":
        return gettext("Sending paused. Messages already being handed over finish.")
    if state.paused_domains:
        return gettext("Sending resumed; still paused: %(domains)s.") % {
            "domains": ", ".join(sorted(state.paused_domains))
        }
    return gettext("Sending resumed.")


@require_POST
def control_view(request: HttpRequest, site: AdminSite, back_to: str) -> HttpResponseRedirect:
    """Pause or resume, then back to ``back_to`` (the dashboard's URL name) with a message."""
    if not can_change(request):
        raise PermissionDenied
    back = HttpResponseRedirect(reverse(f"{site.name}:{back_to}"))
    form = ControlForm(request.POST)
    if not form.is_valid():
        for errors in form.errors.values():
            for error in errors.as_data():
                messages.error(request, " ".join(error.messages))
        return back
    action, domain = form.cleaned_data["action"], form.cleaned_data["domain"]
    switch = control.pause if action == "pause" else control.resume
    try:
        state = switch(domain or None, by=f"{request.user.get_username()} (admin dashboard)")
    except RedisError as exc:
        messages.error(
            request,
            gettext("Redis is unreachable; nothing changed: %(error)s") % {"error": exc},
        )
        return back
    messages.success(request, _done(action, domain, state))
    return back
