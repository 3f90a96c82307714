"""The Prometheus metrics at ``/outbox/metrics``: access, each family on known data, the cost of a scrape.

Every scrape is read twice: by a strict reader here (HELP and TYPE once per
family, before its samples) and by ``prometheus_client``'s text parser, which
must find the same samples.
"""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from outbox import enqueue_email
from outbox.checks.urls import check_metrics_token
from outbox.models import Delivery
from outbox.queue import RedisQueue, control, ratelimit
from outbox.status.metrics import CONTENT_TYPE, Family, authorized, render
from outbox.sweeper import Sweeper

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "tests-only-metrics-token"  # tests/settings.py
URL = "/outbox/metrics"
STATUSES = ["queued", "processing", "sent", "failed", "abandoned", "cancelled"]
SAMPLE = re.compile(r'^([a-z_]+)(?:\{([a-z_]+)="([^"\\]*)"\})? (-?[0-9.e+]+|NaN)$')


def scrape(client, token: str | None = TOKEN, **headers: str):
    if token is not None:
        headers.setdefault("Authorization", f"Bearer {token}")
    return client.get(URL, headers=headers)


def parse(text: str) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    """``({family: {label value or "": value}}, {family: type})``; checks the format as it goes.

    Each family has its HELP and TYPE lines before its samples, once.
    """
    values: dict[str, dict[str, float]] = {}
    types: dict[str, str] = {}
    helped: set[str] = set()
    assert text.endswith("\n")
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split(" ")[2]
            assert name not in helped
            helped.add(name)
        elif line.startswith("# TYPE "):
            _hash, _type, name, kind = line.split(" ")
            assert name in helped and name not in types and kind in ("gauge", "counter")
            types[name] = kind
            values[name] = {}
        elif line.startswith("# "):
            continue  # a note for a person (the failure alarm's cause): Prometheus skips it
        else:
            match = SAMPLE.match(line)
            assert match, line
            name, _label, label_value, value = match.groups()
            assert name in types, f"sample before TYPE: {line}"
            values[name][label_value or ""] = float(value)
    assert _official(text) == _comparable(values)
    return values, types


def _official(text: str) -> dict[str, dict[str, str]]:
    """The samples as prometheus_client's own text parser reads them."""
    samples: dict[str, dict[str, str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            label = next(iter(sample.labels.values()), "")
            samples.setdefault(sample.name, {})[label] = repr(float(sample.value))
    return samples


def _comparable(values: dict[str, dict[str, float]]) -> dict[str, dict[str, str]]:
    # repr() so that NaN equals NaN; a family without samples has no entry there.
    return {name: {k: repr(v) for k, v in found.items()} for name, found in values.items() if found}


def metrics(client) -> dict[str, dict[str, float]]:
    response = scrape(client)
    assert response.status_code == 200
    return parse(response.content.decode())[0]


def register_worker(queue: RedisQueue, worker_id: str, age: float) -> None:
    queue.redis.zadd(queue.workers_key, {worker_id: queue.time() - age})


@pytest.fixture
def known_state(queue: RedisQueue) -> dict[str, list[Delivery]]:
    """Two rows sent, one failed, one abandoned, one cancelled, one processing; three queued,
    two of them due (one for two minutes) and one scheduled; a live and a silent worker."""
    now = timezone.now()
    done = enqueue_email(
        "Secret subject of done",
        "b",
        None,
        [
            "sent1@example.com",
            "sent2@example.com",
            "failed@example.com",
            "abandoned@example.com",
            "cancelled@example.com",
            "processing@example.com",
        ],
    )
    for delivery, status in zip(
        done, ["sent", "sent", "failed", "abandoned", "cancelled", "processing"], strict=True
    ):
        Delivery.objects.filter(pk=delivery.pk).update(status=status, sent_at=now)
    queue.redis.flushdb()  # their ids left Redis long ago
    due = enqueue_email("Secret due", "b", None, ["due1@example.com", "due2@example.com"])
    Delivery.objects.filter(pk=due[0].pk).update(not_before=now - timedelta(minutes=2))
    later = enqueue_email(
        "Later", "b", None, ["later@example.com"], send_at=now + timedelta(hours=1)
    )
    register_worker(queue, "mailhost:1:live-worker", 1)
    register_worker(queue, "mailhost:1:silent-worker", 600)
    return {"done": done, "due": due, "later": later}


# -- access -------------------------------------------------------------------------


def test_the_url_is_named():
    assert reverse("outbox:metrics") == URL


def test_no_token_configured_is_404(client, settings):
    settings.OUTBOX = {k: v for k, v in settings.OUTBOX.items() if k != "METRICS_TOKEN"}
    assert scrape(client).status_code == 404
    assert scrape(client, token="").status_code == 404
    settings.OUTBOX = {**settings.OUTBOX, "METRICS_TOKEN": ""}  # empty: not set
    assert scrape(client, token="").status_code == 404


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        "Bearer wrong",
        f"Bearer {TOKEN[:-1]}",
        f"Bearer {TOKEN}x",
        f"Basic {TOKEN}",
        TOKEN,
        f"Token {TOKEN}",
    ],
)
def test_anything_but_the_token_is_403(client, header):
    headers = {} if header is None else {"Authorization": header}
    response = client.get(URL, headers=headers)
    assert response.status_code == 403
    assert b"outbox_" not in response.content


def test_the_token_is_200(client):
    response = scrape(client)
    assert response.status_code == 200
    assert response["Content-Type"] == CONTENT_TYPE
    assert "no-cache" in response["Cache-Control"] or "no-store" in response["Cache-Control"]
    # The scheme is case-insensitive, and spaces around the token do not matter.
    assert client.get(URL, headers={"Authorization": f"bearer  {TOKEN} "}).status_code == 200
    assert client.post(URL, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 405


def test_authorized():
    assert authorized(f"Bearer {TOKEN}", TOKEN)
    assert not authorized("Bearer é", TOKEN)  # non-ASCII is compared as bytes, no error
    assert not authorized("", TOKEN)


# -- the families on known data -----------------------------------------------------


def test_every_family_on_known_data(client, known_state):
    response = scrape(client)
    values, types = parse(response.content.decode())
    assert types == {
        "outbox_staging_valve": "gauge",
        "outbox_database_up": "gauge",
        "outbox_deliveries": "gauge",
        "outbox_due": "gauge",
        "outbox_oldest_due_seconds": "gauge",
        "outbox_sent_total": "counter",
        "outbox_failed_total": "counter",
        "outbox_redis_up": "gauge",
        "outbox_workers_live": "gauge",
        "outbox_redis_missing": "gauge",
        "outbox_failure_alarm": "gauge",
        "outbox_failure_alarm_attempts": "gauge",
        "outbox_failure_alarm_failed": "gauge",
    }
    assert values["outbox_deliveries"] == {
        "queued": 3,
        "processing": 1,
        "sent": 2,
        "failed": 1,
        "abandoned": 1,
        "cancelled": 1,
    }
    # Against the database itself, too.
    for status in STATUSES:
        assert values["outbox_deliveries"][status] == Delivery.objects.filter(status=status).count()
    assert values["outbox_due"] == {"": 2}
    assert 115 <= values["outbox_oldest_due_seconds"][""] <= 180
    assert values["outbox_sent_total"] == {"": 2}
    assert values["outbox_failed_total"] == {"": 1}
    assert values["outbox_database_up"] == {"": 1}
    assert values["outbox_redis_up"] == {"": 1}
    assert values["outbox_workers_live"] == {"": 1}
    assert values["outbox_redis_missing"] == {"": 0}
    # The default mailer's failure alarm, off (tests/queue/test_alarm.py turns it on).
    assert values["outbox_failure_alarm"] == {"": 0}
    assert values["outbox_failure_alarm_attempts"] == {"": 0}
    assert values["outbox_failure_alarm_failed"] == {"": 0}
    # Every family has a help text.
    assert response.content.decode().count("# HELP ") == len(types)


def test_zeros_on_an_empty_outbox(client):
    values = metrics(client)
    assert values["outbox_deliveries"] == dict.fromkeys(STATUSES, 0.0)
    assert values["outbox_due"] == {"": 0}
    assert values["outbox_oldest_due_seconds"] == {"": 0}
    assert values["outbox_sent_total"] == values["outbox_failed_total"] == {"": 0}
    assert values["outbox_workers_live"] == {"": 0}
    assert values["outbox_redis_missing"] == {"": 0}


def test_redis_missing_counts_due_rows_redis_lost(client, known_state, queue):
    queue.redis.delete(queue.ready_key("normal"))
    values = metrics(client)
    assert values["outbox_redis_missing"] == {"": 2}
    assert values["outbox_due"] == {"": 2}


def test_redis_missing_is_left_out_above_the_comparison_limit(client, known_state, monkeypatch):
    monkeypatch.setattr("outbox.status.snapshot.COMPARE_LIMIT", 1)
    values = metrics(client)
    assert "outbox_redis_missing" not in values
    assert values["outbox_workers_live"] == {"": 1}


def test_no_addresses_subjects_message_ids_or_worker_ids(client, known_state):
    body = scrape(client).content.decode()
    assert "@" not in body
    assert "Secret" not in body and "subject" not in body.lower().replace("_", " ").split()
    for delivery in Delivery.objects.all():
        assert delivery.message_id not in body
        assert delivery.message_id.strip("<>") not in body
        assert delivery.recipient not in body
    assert "mailhost" not in body and "worker-" not in body


def test_redis_down_still_answers_with_the_database(client, known_state, settings):
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",  # nothing listens on port 1
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.5},
        }
    }
    response = scrape(client)
    assert response.status_code == 200
    values, _types = parse(response.content.decode())
    assert values["outbox_redis_up"] == {"": 0}
    assert "outbox_workers_live" not in values and "outbox_redis_missing" not in values
    assert values["outbox_deliveries"]["queued"] == 3
    assert values["outbox_due"] == {"": 2}
    assert values["outbox_database_up"] == {"": 1}
    assert "Connection" not in response.content.decode()  # no error text leaks


def test_database_down_still_answers_with_redis(client, known_state, monkeypatch):
    def broken(now):
        raise RuntimeError("no database today: secret@example.com")

    monkeypatch.setattr("outbox.status.snapshot._read_database", broken)
    response = scrape(client)
    assert response.status_code == 200
    values, _types = parse(response.content.decode())
    assert values["outbox_database_up"] == {"": 0}
    assert "outbox_deliveries" not in values and "outbox_redis_missing" not in values
    assert values["outbox_redis_up"] == {"": 1}
    assert values["outbox_workers_live"] == {"": 1}
    assert "secret" not in response.content.decode()


def test_a_scrape_runs_a_bounded_number_of_queries(client, queue):
    for n in range(3):
        enqueue_email(f"Batch {n}", "b", None, [f"u{n}-{i}@example.com" for i in range(1000)])
    Delivery.objects.filter(pk__in=Delivery.objects.order_by("pk").values("pk")[:500]).update(
        status="sent", sent_at=timezone.now()
    )
    assert Delivery.objects.count() == 3000
    scrape(client)  # warm up (connections, and the sent counter's first checkpoint)
    with CaptureQueriesContext(connection) as captured:
        values = metrics(client)
    # Every status but sent, sent (PostgreSQL: the table's estimated size first),
    # the due rows, the rows sent lately, the sent counter. Over COMPARE_LIMIT
    # (10,000) queued rows there would be no query of their ids; here there is.
    expected = 7 if connection.vendor == "postgresql" else 6
    assert len(captured) == expected, [q["sql"] for q in captured.captured_queries]
    assert values["outbox_deliveries"]["queued"] == 2500
    assert values["outbox_sent_total"] == {"": 500}
    # Each family against the database.
    for status in STATUSES:
        assert values["outbox_deliveries"][status] == Delivery.objects.filter(status=status).count()
    assert values["outbox_due"] == {"": Delivery.objects.due().count()}
    assert values["outbox_redis_missing"] == {"": 0}


def test_the_sent_gauge_may_be_an_estimate_the_counter_is_exact(client, monkeypatch):
    monkeypatch.setattr("outbox.status.snapshot.ESTIMATE_ABOVE", 20)
    rows = enqueue_email("s", "b", None, [f"s{i}@example.com" for i in range(30)])
    sent_at(1, *rows)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE outbox_delivery")
    Delivery.objects.filter(pk__in=[r.pk for r in rows[:10]]).delete()
    response = scrape(client)
    values, _types = parse(response.content.decode())
    # PostgreSQL: the planner's estimate, which the deletion has not reached yet.
    assert values["outbox_deliveries"]["sent"] == (30 if connection.vendor == "postgresql" else 20)
    assert values["outbox_sent_total"] == {"": 20}
    [help_line] = [
        line
        for line in response.content.decode().splitlines()
        if line.startswith("# HELP outbox_deliveries ")
    ]
    assert 'status="sent" on PostgreSQL from 20 sent rows on' in help_line
    assert "estimate" in help_line


def sent_at(minutes_ago: float, *rows: Delivery) -> None:
    when = timezone.now() - timedelta(minutes=minutes_ago)
    Delivery.objects.filter(pk__in=[r.pk for r in rows]).update(status="sent", sent_at=when)


def test_sent_total_never_goes_down_when_old_rows_are_purged(client, queue):
    """The counter counts sends, not rows: a purge of old sent rows leaves it alone."""
    rows = enqueue_email("s", "b", None, [f"s{i}@example.com" for i in range(6)])
    sent_at(60 * 24 * 3, *rows[:3])  # three days ago
    sent_at(30, rows[3])  # half an hour ago: also behind the checkpoint
    sent_at(1, rows[4])  # a minute ago: ahead of it
    assert metrics(client)["outbox_sent_total"] == {"": 5}
    since, base = queue.redis.hmget(queue.sent_total_key, ["since", "base"])
    assert int(base) == 4  # the rows sent before now - SETTLE
    assert time.time() - 11 * 60 < int(since) < time.time() - 9 * 60

    # The retention purge deletes the three old rows; the gauge drops, the counter stays.
    assert Sweeper().purge_sent(older_than_days=1) == 3
    values = metrics(client)
    assert values["outbox_sent_total"] == {"": 5}
    assert values["outbox_deliveries"]["sent"] == 2

    # A new send counts, once.
    sent_at(0, rows[5])
    assert metrics(client)["outbox_sent_total"] == {"": 6}
    assert metrics(client)["outbox_sent_total"] == {"": 6}  # a scrape changes nothing

    # Redis lost the checkpoint: the next scrape counts the rows again, from the database.
    queue.redis.delete(queue.sent_total_key)
    assert metrics(client)["outbox_sent_total"] == {"": 3}


# -- sending control: the pause switches and the rate limits -------------------------


def test_pause_families_follow_the_switches(client, queue):
    # No switches in Redis yet (nothing has run): unknown, so absent.
    values, types = parse(scrape(client).content.decode())
    assert "outbox_paused" not in types and "outbox_paused_domains" not in types
    control.resume(queue=queue)
    values, types = parse(scrape(client).content.decode())
    assert types["outbox_paused"] == types["outbox_paused_domains"] == "gauge"
    assert values["outbox_paused"] == {"": 0} and values["outbox_paused_domains"] == {"": 0}
    control.pause(queue=queue)
    control.pause("gmail.com", queue=queue)
    control.pause("example.org", queue=queue)
    values = metrics(client)
    assert values["outbox_paused"] == {"": 1} and values["outbox_paused_domains"] == {"": 2}
    control.resume(queue=queue)
    values = metrics(client)
    assert values["outbox_paused"] == {"": 0} and values["outbox_paused_domains"] == {"": 2}
    # A mailer whose ESP refused its credential, until a send through it succeeds.
    assert values["outbox_paused_mailers"] == {"": 0}
    control.refuse("bulk", "Postmark refused its credential (HTTP 401: ...)", queue=queue)
    assert metrics(client)["outbox_paused_mailers"] == {"": 1}
    control.accepted("bulk", queue=queue)
    assert metrics(client)["outbox_paused_mailers"] == {"": 0}


def test_rate_limit_families_equal_usage_and_cost_no_query(client, queue, settings):
    scrape(client)  # warm up (connections, and the sent counter's first checkpoint)
    with CaptureQueriesContext(connection) as without_limits:
        values, types = parse(scrape(client).content.decode())
    assert "outbox_rate_limit_used" not in types and "outbox_rate_limit_held" not in types

    settings.OUTBOX = {**settings.OUTBOX, "RATE_LIMITS": {"*": "1000/d", "example.org": "4/d"}}
    checks = ratelimit.applicable("example.org", ratelimit.limits())
    assert ratelimit.take(queue, 1, checks)[1] is None
    assert ratelimit.take(queue, 2, checks)[1] is not None  # held for its slot
    with CaptureQueriesContext(connection) as with_limits:
        response = scrape(client)
    values, types = parse(response.content.decode())
    usage = ratelimit.usage(queue)
    assert types["outbox_rate_limit_used"] == types["outbox_rate_limit_held"] == "gauge"
    assert values["outbox_rate_limit_used"] == {u.key: u.used_fraction for u in usage}
    assert values["outbox_rate_limit_used"] == {"*": 0.001, "example.org": 0.25}
    assert values["outbox_rate_limit_held"] == {"*": 0, "example.org": 1}
    assert 'outbox_rate_limit_used{key="*"} 0.001' in response.content.decode()
    # Read from Redis in the snapshot: not one database query more.
    assert len(with_limits) == len(without_limits)


# -- the text format ----------------------------------------------------------------


def test_render_escapes_help_and_label_values():
    labels = (("k", 'v"\\\n'),)
    family = Family("x", "gauge", 'a\\b\nc "q"', ((labels, 1.5),))
    assert render([family]) == ('# HELP x a\\\\b\\nc "q"\n# TYPE x gauge\nx{k="v\\"\\\\\\n"} 1.5\n')
    nan = Family("y", "gauge", "h", (((), float("nan")),))
    assert render([nan]).endswith("y NaN\n")


# -- the system check -----------------------------------------------------------------


def test_check_is_quiet_with_a_token():
    assert check_metrics_token() == []


def test_check_warns_when_routed_without_a_token(settings):
    settings.OUTBOX = {k: v for k, v in settings.OUTBOX.items() if k != "METRICS_TOKEN"}
    [warning] = check_metrics_token()
    assert warning.id == "outbox.W004"
    assert URL in warning.msg and "METRICS_TOKEN" in warning.msg


def test_check_is_quiet_when_not_routed(settings):
    settings.OUTBOX = {k: v for k, v in settings.OUTBOX.items() if k != "METRICS_TOKEN"}
    settings.ROOT_URLCONF = "tests.status.test_metrics"
    assert check_metrics_token() == []


# Without outbox.urls: test_check_is_quiet_when_not_routed uses this module as ROOT_URLCONF.
urlpatterns: list[object] = []
