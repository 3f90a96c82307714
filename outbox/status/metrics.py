"""Prometheus metrics: the ``metrics`` view of :mod:`outbox.urls`.

A project routes it with ``path("outbox/", include("outbox.urls"))`` and sets
``OUTBOX["METRICS_TOKEN"]``; Prometheus then scrapes ``/outbox/metrics`` with
``Authorization: Bearer <token>``. Without a token configured the view answers
404 (and the system check ``outbox.W004`` says so); with a wrong or missing
``Authorization`` header, 403.

The numbers are those of :func:`outbox.status.collect` (what ``manage.py
outbox_status`` shows), read once per scrape: at most six database queries
(counts of every status but sent, the table's estimated size on PostgreSQL,
the sent rows when they are few enough to count, the due rows and the oldest
of them, the rows sent lately, and the ids of the queued rows for the
comparison with Redis, which is skipped above :data:`outbox.status.snapshot.COMPARE_LIMIT`
queued rows) and one Redis round trip or two, one more for the pause switches
and one for the rate limits' use when limits are set; then ``outbox_sent_total``
(:mod:`outbox.status.counters`): one query over the rows sent in the last minutes, and
two Redis round trips. None of them reads the history of sent mail, so a scrape
takes about as long on a million rows as on a hundred; the failure alarm is one
more Redis round trip. Only counts and ages leave the process: never an address,
a subject, a Message-ID or a worker id. The labels besides ``status`` are a rate
limit's key (``*`` or a recipient domain, as configured) and a mailer's alias
(``""`` for the default one): both come from the settings, so there are few. The
one text is the cause of a failure alarm while it is on, on a comment line
(``# outbox_failure_alarm{mailer=""} cause: ...``), which Prometheus ignores and
a person reading the scrape finds: the server's reply with its addresses
removed (:func:`outbox.mail.failures.cause_of`).

When Redis cannot be read the database families are still served, with
``outbox_redis_up 0``; when the database cannot be read, ``outbox_database_up
0`` and the Redis families.
"""

from __future__ import annotations

import contextlib
import hmac
import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.http import Http404, HttpRequest, HttpResponse, HttpResponseForbidden
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from ..conf import outbox_settings
from ..queue import ratelimit
from ..queue.reliable import RedisQueue
from . import counters
from . import snapshot as status

# The Prometheus text exposition format, version 0.0.4.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Family:
    """One metric family: its name, type, help text and samples."""

    name: str
    type: str  # "gauge" or "counter"
    help: str
    samples: tuple[tuple[Labels, float], ...]
    # Comment lines after the samples: for a person reading the scrape (the
    # failure alarm's cause); Prometheus skips them.
    notes: tuple[str, ...] = ()


def _one(name: str, type_: str, help_: str, value: float) -> Family:
    return Family(name, type_, help_, (((), value),))


# -- what is measured -------------------------------------------------------------


def collect(queue: RedisQueue | None = None, now: datetime | None = None) -> list[Family]:
    """The metric families of one snapshot of the database and Redis."""
    snapshot = status.collect(queue, now)
    families = [_valve_family(snapshot["valve"]), *_database_families(snapshot["database"])]
    if snapshot["database"]["ok"] and snapshot["redis"]["ok"]:
        # Either could fail between the snapshot and this: the family is then
        # absent from this scrape, as those of a part that could not be read.
        with contextlib.suppress(Exception):
            families.append(_sent_total(queue))
    return families + _redis_families(snapshot["redis"], snapshot["agreement"])


def _valve_family(valve: dict[str, Any]) -> Family:
    return _one(
        "outbox_staging_valve",
        "gauge",
        "1 while OUTBOX['ALLOWED_RECIPIENTS'] is set on the host serving this scrape: mail to "
        "other addresses is redirected to REDIRECT_TO or cancelled (a staging setting; alert "
        "on it in production), else 0.",
        1 if valve["on"] else 0,
    )


def _sent_total(queue: RedisQueue | None) -> Family:
    return _one(
        "outbox_sent_total",
        "counter",
        "Deliveries sent, ever: the database's count, kept up to date from a checkpoint in "
        "Redis (outbox/status/counters.py); rows purged later stay counted. Absent while Redis "
        "or the database cannot be read.",
        counters.sent_total(queue or RedisQueue()),
    )


def _database_families(database: dict[str, Any]) -> list[Family]:
    up = _one(
        "outbox_database_up",
        "gauge",
        "1 if the outbox tables could be read for this scrape, else 0.",
        1 if database["ok"] else 0,
    )
    if not database["ok"]:
        return [up]
    by_status: dict[str, int] = database["by_status"]
    oldest = database["oldest_due_age"]
    return [
        up,
        Family(
            "outbox_deliveries",
            "gauge",
            'Deliveries in the database, by status. Exact, except status="sent" on '
            f"PostgreSQL from {status.ESTIMATE_ABOVE} sent rows on: the planner's estimate of "
            "the table's size less the exact count of every other status (outbox_sent_total "
            "is exact).",
            tuple(((("status", s),), by_status.get(s, 0)) for s in status.STATUSES),
        ),
        _one(
            "outbox_due",
            "gauge",
            "Queued deliveries whose send time has come.",
            database["due"],
        ),
        _one(
            "outbox_oldest_due_seconds",
            "gauge",
            "Seconds since the longest-waiting due delivery became due; 0 when none is due.",
            0.0 if oldest is None else oldest,
        ),
        _one(
            "outbox_failed_total",
            "counter",
            "Deliveries in status failed, counted in the database (survives restarts). "
            "Requeueing or deleting failed rows lowers it, which Prometheus reads as a reset.",
            by_status.get(status.Status.FAILED, 0),
        ),
    ]


def _redis_families(redis: dict[str, Any], agreement: dict[str, Any] | None) -> list[Family]:
    up = _one(
        "outbox_redis_up",
        "gauge",
        "1 if the outbox's Redis could be read for this scrape, else 0.",
        1 if redis["ok"] else 0,
    )
    if not redis["ok"]:
        return [up]
    families = [
        up,
        _one(
            "outbox_workers_live",
            "gauge",
            "Workers whose heartbeat is within HEARTBEAT_TIMEOUT.",
            sum(1 for worker in redis["workers"] if worker["alive"]),
        ),
    ]
    missing = None if agreement is None else agreement["ready"]["missing"]
    if missing is not None:  # None: too many queued rows to compare in one scrape
        families.append(
            _one(
                "outbox_redis_missing",
                "gauge",
                "Due queued deliveries that Redis holds nowhere (no worker sends them until "
                "the sweeper pushes them again). Absent above the comparison limit.",
                missing,
            )
        )
    families += _control_families(redis["control"], redis["rate_limits"])
    return families + _failure_families(redis["failures"])


def _failure_families(failures: dict[str, Any]) -> list[Family]:
    """The failure alarm per mailer: the default one always, others with attempts or an alarm."""
    mailers: dict[str, dict[str, Any]] = {
        "": {"alarm": False, "attempts": 0, "failed": 0, "cause": ""}
    }
    mailers.update(failures["mailers"])
    window = f"{failures['window']:g}"
    rows = sorted(mailers.items())

    def samples(key: str) -> tuple[tuple[Labels, float], ...]:
        return tuple(((("mailer", m),), int(counts[key])) for m, counts in rows)

    notes = tuple(
        f'outbox_failure_alarm{{mailer="{_escape_label(m)}"}} cause: {_one_line(counts["cause"])}'
        for m, counts in rows
        if counts["alarm"] and counts["cause"]
    )
    return [
        Family(
            "outbox_failure_alarm",
            "gauge",
            f"1 while a mailer's failed attempts in the last {window}s reach both "
            "FAILURE_ALARM_MIN and FAILURE_ALARM_SHARE of its attempts (a wrong credential, a "
            'refused sender, a server refusing everything), else 0; mailer="" is the default '
            "one. The cause follows as a comment line.",
            samples("alarm"),
            notes,
        ),
        Family(
            "outbox_failure_alarm_attempts",
            "gauge",
            f"Attempts (sent, retried, failed or in doubt) in the last {window}s, by all "
            "workers, per mailer.",
            samples("attempts"),
        ),
        Family(
            "outbox_failure_alarm_failed",
            "gauge",
            f"Failed attempts (retried, failed or in doubt) in the last {window}s, per mailer.",
            samples("failed"),
        ),
    ]


def _control_families(control: dict[str, Any], limits: list[dict[str, Any]]) -> list[Family]:
    """The pause switches (while Redis holds them) and each rate limit's use (when set).

    Read in the snapshot's own round trips (``outbox.status``); the labels are
    the limits' keys: ``*`` and recipient domains, never an address.
    """
    families = []
    if control["known"]:
        families += [
            _one(
                "outbox_paused",
                "gauge",
                "1 while all sending is paused (outbox_pause, or the admin dashboard), else 0. "
                "Absent while Redis holds no pause switches: nothing has run since Redis "
                "started, or Redis lost them (outbox_status says which).",
                1 if control["paused"] else 0,
            ),
            _one(
                "outbox_paused_domains",
                "gauge",
                "Recipient domains paused on their own (outbox_pause --domain). Absent as "
                "outbox_paused.",
                len(control["paused_domains"]),
            ),
            _one(
                "outbox_paused_mailers",
                "gauge",
                "Mailers whose ESP refused their credential (401/403), or whose backend "
                "cannot be created, and that have not sent since: paused, their mail queued. "
                "Absent as outbox_paused.",
                len(control.get("paused_mailers", {})),
            ),
        ]
    if limits:
        families += [
            Family(
                "outbox_rate_limit_used",
                "gauge",
                'Share of each RATE_LIMITS entry used in its current period, 0 to 1 (key="*" '
                "is all sending, any other key a recipient domain). Present when limits are "
                "set.",
                tuple(
                    ((("key", u["key"]),), ratelimit.LimitUsage(**u).used_fraction) for u in limits
                ),
            ),
            Family(
                "outbox_rate_limit_held",
                "gauge",
                "Deliveries waiting for a slot their rate limit reserved (its backlog), by "
                "limit key. Present when limits are set.",
                tuple(((("key", u["key"]),), u["held"]) for u in limits),
            ),
        ]
    return families


# -- the text format --------------------------------------------------------------


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _sample_line(name: str, labels: Labels, value: float) -> str:
    if labels:
        inner = ",".join(f'{key}="{_escape_label(val)}"' for key, val in labels)
        return f"{name}{{{inner}}} {_number(value)}"
    return f"{name} {_number(value)}"


def render(families: Iterable[Family]) -> str:
    """The families in the Prometheus text format 0.0.4, HELP and TYPE first."""
    lines: list[str] = []
    for family in families:
        lines.append(f"# HELP {family.name} {_escape_help(family.help)}")
        lines.append(f"# TYPE {family.name} {family.type}")
        lines.extend(_sample_line(family.name, labels, value) for labels, value in family.samples)
        lines.extend(f"# {note}" for note in family.notes)
    return "\n".join(lines) + "\n"


# -- the view ---------------------------------------------------------------------


def authorized(header: str, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``token`` as its bearer token.

    The comparison takes the same time wherever the first difference is.
    """
    scheme, _space, credentials = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(credentials.strip().encode(), token.encode())


@never_cache
@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Serve :func:`collect` to a scraper that presents ``OUTBOX["METRICS_TOKEN"]``."""
    token = outbox_settings.METRICS_TOKEN
    if token is None:
        raise Http404("The outbox metrics are off: OUTBOX['METRICS_TOKEN'] is not set.")
    if not authorized(request.headers.get("Authorization", ""), token):
        return HttpResponseForbidden(
            "A bearer token is required.", content_type="text/plain; charset=utf-8"
        )
    return HttpResponse(render(collect()), content_type=CONTENT_TYPE)
