"""The outbox status report as text for a terminal: ``manage.py outbox_status``.

:func:`outbox.status.collect` gathers the numbers; this module only lays them
out (and repeats them with ``--watch``). Kept apart so that the report's keys
and how they are read stay in one module and its wording in another. Both
functions are re-exported by :mod:`outbox.status`.
"""

from __future__ import annotations

import time
from typing import Any

from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from ..conf import PRIORITIES
from ..models import Delivery

STATUSES: tuple[str, ...] = tuple(Delivery.Status.values)


def render(report: dict[str, Any]) -> str:
    """The report as text for a terminal."""
    lines = [_("Outbox status at %(time)s") % {"time": report["time"]}, ""]
    lines += _render_valve(report["valve"])
    lines += _render_alarms(report["redis"])
    lines += _render_database(report["database"])
    lines.append("")
    lines += _render_redis(report["redis"], report["agreement"])
    return "\n".join(lines) + "\n"


def _render_valve(valve: dict[str, Any]) -> list[str]:
    """The staging valve, first and loud while it is on; nothing while it is off."""
    if not valve["on"]:
        return []
    patterns = ", ".join(valve["allowed_recipients"]) or _("(none)")
    if valve["redirect_to"]:
        then = _("mail to anyone else goes to %(to)s") % {"to": valve["redirect_to"]}
    else:
        then = _("mail to anyone else is cancelled")
    return [
        _("STAGING VALVE ON: only %(patterns)s get mail; %(then)s (OUTBOX['ALLOWED_RECIPIENTS'])")
        % {"patterns": patterns, "then": then},
        "",
    ]


def _render_alarms(redis: dict[str, Any]) -> list[str]:
    """Each mailer whose failure alarm is on, first and loud; nothing otherwise."""
    if not redis["ok"]:
        return []
    failures, now = redis["failures"], redis["control"]["read_at"]
    lines = []
    for mailer, counts in sorted(failures["mailers"].items()):
        if not counts["alarm"]:
            continue
        lines.append(
            _(
                "FAILURE ALARM: %(mailer)s: %(failed)d of %(attempts)d attempts failed in the "
                "last %(window)s (for %(lasted)s), most often: %(cause)s"
            )
            % {
                "mailer": _mailer_name(mailer),
                "failed": counts["failed"],
                "attempts": counts["attempts"],
                "window": _duration(failures["window"]),
                "lasted": _duration(max(0.0, now - (counts["since"] or now))),
                "cause": counts["cause"] or "-",
            }
        )
    return [*lines, ""] if lines else []


def _render_failures(failures: dict[str, Any]) -> list[str]:
    """The window's attempts and failures per mailer, and the alarm's rule: one line or more."""
    rule = _("alarm at %(least)d failed and %(share)d%% of attempts") % {
        "least": failures["min_failures"],
        "share": round(failures["share"] * 100),
    }
    window = _duration(failures["window"])
    if not failures["mailers"]:
        return [
            _("Attempts in the last %(window)s: none (%(rule)s)") % {"window": window, "rule": rule}
        ]
    lines = [_("Attempts in the last %(window)s (%(rule)s):") % {"window": window, "rule": rule}]
    for mailer, counts in sorted(failures["mailers"].items()):
        alarm = " " + _("ALARM") if counts["alarm"] else ""
        lines.append(
            "  "
            + _("%(mailer)s: %(attempts)d, %(failed)d failed%(alarm)s")
            % {
                "mailer": _mailer_name(mailer),
                "attempts": counts["attempts"],
                "failed": counts["failed"],
                "alarm": alarm,
            }
        )
    return lines


def _mailer_name(mailer: str) -> str:
    return _("mailer %(alias)r") % {"alias": mailer} if mailer else _("the default mailer")


def _render_database(db: dict[str, Any]) -> list[str]:
    if not db["ok"]:
        if db.get("not_migrated"):
            return [_("Database: not migrated (%(error)s)") % {"error": db["error"]}]
        return [_("Database: unreachable (%(error)s)") % {"error": db["error"]}]
    labels = dict(Delivery.Status.choices)
    header = [_("Deliveries"), *(str(dict(Delivery.Priority.choices)[p]) for p in PRIORITIES)]
    header.append(_("total"))
    table = [header]
    estimated = set(db.get("estimated", ()))
    for status in STATUSES:
        counts = [db["by_priority"].get(p, {}).get(status, 0) for p in PRIORITIES]
        total = ("≈" if status in estimated else "") + str(db["by_status"][status])
        table.append([str(labels[status]), *("-" if n is None else str(n) for n in counts), total])
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = [
        "  ".join(
            cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row)
        ).rstrip()
        for row in table
    ]
    oldest = db["oldest_due_age"]
    if estimated:
        lines.append(
            _("≈ PostgreSQL's estimate, not a count (per priority: -); the rest is exact.")
        )
    lines.append("")
    lines.append(
        _("Due now: %(due)d (oldest waiting %(age)s); scheduled for later: %(scheduled)d")
        % {
            "due": db["due"],
            "age": "-" if oldest is None else _duration(oldest),
            "scheduled": db["scheduled"],
        }
    )
    lines.append(
        _("Sent: %(minute)d in the last minute, %(hour)d in the last hour")
        % {"minute": db["sent_last_minute"], "hour": db["sent_last_hour"]}
    )
    return lines


def _render_redis(redis: dict[str, Any], agreement: dict[str, Any] | None) -> list[str]:
    if not redis["ok"]:
        return [
            _("Redis: unreachable (%(error)s)") % {"error": redis["error"]},
            _("Mail is not being sent; queued rows stay in the database until Redis is back."),
        ]
    ready = redis["ready"]
    lines = [
        _("Redis: ready %(ready)s; scheduled %(scheduled)d")
        % {
            "ready": ", ".join(f"{p} {ready[p]}" for p in PRIORITIES),
            "scheduled": redis["scheduled"],
        }
    ]
    if agreement is not None:
        for name, label in (("ready", _("ready")), ("scheduled", _("scheduled"))):
            lines.append("  " + _agreement_line(label, agreement[name]))
    workers = redis["workers"]
    lines.append(
        ngettext("%(count)d worker", "%(count)d workers", len(workers)) % {"count": len(workers)}
    )
    for worker in workers:
        state = "" if worker["alive"] else " " + _("(no heartbeat: presumed dead)")
        if worker["release_level"] < redis["release_level"]:
            # The README's "Upgrading": the sweeper clears no content while it runs.
            state += " " + _("(an earlier release, level %(level)d: content is kept)") % {
                "level": worker["release_level"]
            }
        lines.append(
            "  "
            + _("%(id)s: heartbeat %(age)s ago, holding %(count)d%(ids)s%(state)s")
            % {
                "id": worker["id"],
                "age": _duration(worker["heartbeat_age"]),
                "count": len(worker["held"]),
                "ids": _ids(worker["held"]),
                "state": state,
            }
        )
    for worker in redis["dead_workers"]:
        lines.append(
            "  "
            + _("%(id)s: declared dead, holding %(count)d%(ids)s (the sweeper cleans it up)")
            % {"id": worker["id"], "count": len(worker["held"]), "ids": _ids(worker["held"])}
        )
    anyone = bool(workers or redis["dead_workers"])
    lines += _render_control(redis["control"], anyone) + _render_limits(redis["rate_limits"])
    return lines + _render_failures(redis["failures"])


def _render_control(control: dict[str, Any], anyone: bool) -> list[str]:
    """The pause switches: one line, plus a line per paused or slowed domain.

    ``anyone``: a worker is registered, so a missing switch hash was lost, not
    yet to be written.
    """
    if not control["known"] and not anyone:
        lines = [
            _(
                "Sending: no worker yet (none is registered with this Redis: none has "
                "started, or Redis lost its data; start manage.py outbox_worker)"
            )
        ]
    elif not control["known"]:
        lines = [
            _(
                "Sending: UNKNOWN (Redis lost the pause switches; a worker restores what "
                "it last saw)"
            )
        ]
    elif control["paused"]:
        lines = [_("Sending: PAUSED by the operator (outbox_resume to send again)")]
    else:
        lines = [_("Sending: running")]
    if control["lost_at"] is not None:
        lines.append(
            "  "
            + _(
                "Redis lost the switches; a worker restored what it last saw "
                "(outbox_resume clears this)"
            )
        )
    for domain in sorted(control["paused_domains"]):
        lines.append("  " + _("%(domain)s: paused") % {"domain": domain})
    for domain in sorted(control["slow_domains"]):
        lines.append(
            "  " + _("%(domain)s: slowed down (its server answered 421/450)") % {"domain": domain}
        )
    for mailer, paused in sorted(control.get("paused_mailers", {}).items()):
        lines.append("  " + _mailer_pause_line(mailer, paused, control.get("read_at")))
    return lines


def _mailer_pause_line(mailer: str, paused: dict[str, Any], now: float | None) -> str:
    """One mailer paused because its ESP refused its credential: for how long, and why."""
    name = _mailer_name(mailer)
    left = None if now is None else paused["until"] - now
    values = {"mailer": name, "count": paused["count"], "why": paused["why"]}
    if left is not None and left > 0:
        return _("%(mailer)s: PAUSED for %(left)ds more (%(count)d in a row): %(why)s") % {
            **values,
            "left": max(1, round(left)),
        }
    return (
        _("%(mailer)s: refused %(count)d times in a row, the next send tries again: %(why)s")
        % values
    )


def _render_limits(limits: list[dict[str, Any]]) -> list[str]:
    if not limits:
        return []
    lines = [_("Rate limits:")]
    for limit in limits:
        lines.append(
            "  "
            + _("%(key)s %(limit)s: %(used)d of %(capacity)d used this period, %(held)d held")
            % limit
        )
    return lines


def _agreement_line(label: str, part: dict[str, Any]) -> str:
    if part["agrees"] is None:
        return _(
            "%(name)s vs database: not compared id by id (over %(limit)d ids); "
            "database %(database)d, Redis %(redis)d"
        ) % {
            "name": label,
            "limit": part["limit"],
            "database": part["database"],
            "redis": part["redis"],
        }
    if part["agrees"]:
        return _("%(name)s vs database: agree") % {"name": label}
    return _(
        "%(name)s vs database: DISAGREE (%(missing)d rows missing from Redis, "
        "%(stale)d stale ids in Redis)"
    ) % {"name": label, "missing": part["missing"], "stale": part["stale"]}


def _ids(ids: list[int], limit: int = 10) -> str:
    if not ids:
        return ""
    shown = ", ".join(str(i) for i in ids[:limit])
    more = ", ..." if len(ids) > limit else ""
    return f" ({shown}{more})"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return _("%(n).1fs") % {"n": seconds}
    if seconds < 3600:
        return _("%(m)dm%(s)02ds") % {"m": seconds // 60, "s": seconds % 60}
    return _("%(h)dh%(m)02dm") % {"h": seconds // 3600, "m": seconds % 3600 // 60}


def watch_loop(interval: float, show: Any, sleep: Any = time.sleep) -> None:
    """Call ``show()`` every ``interval`` seconds until interrupted (Ctrl-C)."""
    try:
        while True:
            show()
            sleep(interval)
    except KeyboardInterrupt:
        return
