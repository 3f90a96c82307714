"""The failure alarm (outbox/queue/alarm.py, outbox/worker/alarm.py): its rule, its cause,
its log lines, and where it shows (outbox_status, the metrics, the dashboard), on a real Redis.

A worker process against a mail server that refuses everything is
tests/worker/test_alarm.py.
"""

from __future__ import annotations

import json
import logging
import smtplib
import time
import uuid
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse

from outbox.mail.failures import cause_of, tidy_cause
from outbox.models import Attempt, Delivery, Email
from outbox.queue import RedisQueue, alarm
from outbox.worker import alarm as worker_alarm
from outbox.worker.alarm import FailureAlarm
from outbox.worker.inflight import InFlight
from outbox.worker.outcomes import Settlement
from outbox.worker.report import Stats, announce
from tests.servers import wait_until

Outcome = Attempt.Outcome
REFUSED = smtplib.SMTPSenderRefused(
    451, b"4.7.1 <shop@example.com>: Sender address rejected: try again later", "shop@example.com"
)
CAUSE = "SMTPSenderRefused 451 4.7.1 <address>: Sender address rejected: try again later"
TOKEN = "tests-only-metrics-token"  # tests/settings.py


@pytest.fixture
def rule(settings):
    """The alarm at 5 failures and half the attempts, over a window of 60 s."""
    settings.OUTBOX = {
        **settings.OUTBOX,
        "FAILURE_ALARM_WINDOW": 60.0,
        "FAILURE_ALARM_MIN": 5,
        "FAILURE_ALARM_SHARE": 0.5,
    }
    return settings


def tally(attempts: int, failures: int, cause: str = CAUSE) -> alarm.Tally:
    t = alarm.Tally(attempts, failures)
    if failures:
        t.causes[cause] = failures
    return t


def one(mailers: list[alarm.MailerAlarm], mailer: str = "") -> alarm.MailerAlarm:
    [found] = [m for m in mailers if m.mailer == mailer]
    return found


def settlement(outcome: str, mailer: str = "", cause: str = CAUSE, pk: int = 1) -> Settlement:
    flight = InFlight.marked(
        Delivery(pk=pk, recipient=f"r{pk}@example.com", attempts=1, max_attempts=5),
        Email(mailer=mailer),
        [],
        uuid.uuid4(),
        "w#1",
    )
    if outcome == Outcome.SENT:
        return Settlement(flight, outcome)
    return Settlement(
        flight, outcome, f"SMTPSenderRefused: {cause}", cause=cause, retry_at=_later()
    )


def _later():
    from django.utils import timezone

    return timezone.now()


# -- the cause -----------------------------------------------------------------------


def test_the_cause_is_the_reply_without_addresses_or_serials():
    assert cause_of(REFUSED) == CAUSE
    refused = smtplib.SMTPRecipientsRefused(
        {"Bob <bob@example.com>": (550, b"5.1.1 bob@example.com: unknown; queue id 4Xyz12AbCD")}
    )
    assert cause_of(refused) == "SMTPRecipientsRefused 550 5.1.1 <address>: unknown; queue id …"
    assert cause_of(ConnectionRefusedError(111, "Connection refused")) == (
        "ConnectionRefusedError: [Errno 111] Connection refused"
    )
    assert tidy_cause("x\n  y " + "z" * 300).startswith("x y zzz")
    assert len(tidy_cause("z " * 300)) == 200


# -- the rule, in Redis ------------------------------------------------------------------


def test_on_at_the_minimum_and_the_share_across_workers(rule, queue):
    _now, mailers = alarm.add({"": tally(4, 4)}, queue)
    assert one(mailers) == alarm.MailerAlarm("", False, 4, 4, CAUSE, None, "")
    # A second worker's failure sets it off: both counts are Redis'.
    now, mailers = alarm.add({"": tally(1, 1, "other cause")}, RedisQueue())
    began = one(mailers)
    assert (began.on, began.attempts, began.failures, began.event) == (True, 5, 5, "began")
    assert began.cause == CAUSE  # the most frequent
    assert began.since == pytest.approx(now, abs=0.01)
    # Said once: the next call while it lasts has nothing to say.
    assert one(alarm.add({"": tally(1, 1)}, queue)[1]).event == ""
    # Sends through the mailer: below half the attempts, it is over.
    cleared = one(alarm.add({"": tally(7, 0)}, queue)[1])
    assert (cleared.on, cleared.attempts, cleared.failures, cleared.event) == (
        False,
        13,
        6,
        "cleared",
    )
    assert one(alarm.add({}, queue)[1]).event == ""


def test_each_mailer_has_its_own_alarm(rule, queue):
    _now, mailers = alarm.add({"": tally(100, 4), "bulk": tally(6, 6)}, queue)
    assert not one(mailers).on and one(mailers, "bulk").on
    _now, read = alarm.read(queue)
    assert [(m.mailer, m.on, m.attempts, m.failures, m.event) for m in read] == [
        ("", False, 100, 4, ""),
        ("bulk", True, 6, 6, ""),
    ]


def test_read_changes_nothing(rule, queue):
    alarm.add({"": tally(5, 5)}, queue)
    before = queue.redis.hgetall(queue.alarm_state_key), queue.redis.hgetall(queue.alarm_key)
    rule.OUTBOX = {**rule.OUTBOX, "FAILURE_ALARM_MIN": 50}  # read with its own settings
    _now, mailers = alarm.read(queue)
    assert not one(mailers).on and one(mailers).failures == 5
    assert (queue.redis.hgetall(queue.alarm_state_key), queue.redis.hgetall(queue.alarm_key)) == (
        before
    )


def test_said_again_once_a_window_then_cleared_when_the_failures_leave_it(rule, queue):
    rule.OUTBOX = {**rule.OUTBOX, "FAILURE_ALARM_WINDOW": 1.0}
    events: list[str] = []
    start = time.monotonic()
    while time.monotonic() - start < 2.5:  # two workers failing, for 2.5 windows
        for q in (queue, RedisQueue()):
            events += [m.event for m in alarm.add({"": tally(3, 3)}, q)[1] if m.event]
        time.sleep(0.05)
    assert events == ["began", "still", "still"]
    cleared = wait_until(
        lambda: [m for m in alarm.add({}, queue)[1] if m.event == "cleared"], timeout=3
    )
    assert not cleared[0].on and cleared[0].since is not None
    assert cleared[0].failures < 5
    # The window's old buckets are forgotten: the hash holds the window at most.
    wait_until(lambda: not alarm.read(queue)[1], timeout=3)
    alarm.add({}, queue)
    assert queue.redis.hlen(queue.alarm_key) == 0


# -- the worker's side ----------------------------------------------------------------------


def test_one_warning_when_it_begins_then_single_failures_go_to_debug(
    rule, queue, caplog, monkeypatch
):
    counter = FailureAlarm(queue)
    stats = Stats()
    caplog.set_level(logging.DEBUG, logger="outbox.worker")
    for pk in range(1, 31):
        announce(settlement(Outcome.RETRY, pk=pk), 1, stats, "w#1", counter)
        # A failure wakes the worker's main loop while no alarm is known, not after.
        assert counter.wake.is_set() == (pk <= 5)
        counter.wake.clear()
        counter.tick()  # as the main loop does
    announce(settlement(Outcome.SENT, pk=31), 1, stats, "w#1", counter)
    alarm_lines = [r for r in caplog.records if "failure alarm" in r.getMessage()]
    assert [r.levelno for r in alarm_lines] == [logging.WARNING]
    message = alarm_lines[0].getMessage()
    assert message.startswith(
        f"failure alarm for the default mailer: 5 of 5 attempts failed in the last 60s, "
        f"most often: {CAUSE}."
    )
    single = [r for r in caplog.records if "attempt 1 of 5 failed" in r.getMessage()]
    # The fifth's line was written before the main loop heard of the alarm.
    assert [r.levelno for r in single] == [logging.INFO] * 5 + [logging.DEBUG] * 25
    # Only the failures up to the alarm went to Redis at once; the rest waits for a tick.
    assert one(alarm.read(queue)[1]).failures == 5
    counter.tick()
    assert one(alarm.read(queue)[1]).failures == 5  # within the second of the last call
    monkeypatch.setattr(worker_alarm, "CALL_EVERY", 0.0)
    counter.tick()
    assert (one(alarm.read(queue)[1]).attempts, one(alarm.read(queue)[1]).failures) == (31, 30)


def test_a_release_or_a_cancellation_is_no_attempt(rule, queue):
    counter = FailureAlarm(queue)
    for outcome in (Outcome.RELEASED, Outcome.CANCELLED):
        counter.observe(settlement(outcome))
    counter.call()
    assert alarm.read(queue)[1] == []
    # What is left goes as the worker stops.
    counter.observe(settlement(Outcome.SENT))
    counter.flush()
    assert [(m.attempts, m.failures) for m in alarm.read(queue)[1]] == [(1, 0)]


def test_redis_away_keeps_the_tallies_for_the_next_call(rule, redis_server):
    away = RedisQueue(redis_server.client())
    counter = FailureAlarm(away)
    counter.observe(settlement(Outcome.SENT))
    redis_server.stop()
    counter.observe(settlement(Outcome.RETRY))
    counter.tick()  # its call fails; nothing is raised
    redis_server.start()
    counter.call()
    found = one(alarm.read(RedisQueue(redis_server.client()))[1])
    assert (found.attempts, found.failures) == (2, 1)


# -- where it shows ------------------------------------------------------------------------


def status_text(*args: str) -> str:
    out = StringIO()
    call_command("outbox_status", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_outbox_status_metrics_and_dashboard_show_it(rule, queue, client, admin_client):
    alarm.add({"": tally(12, 11), "bulk": tally(3, 1)}, queue)
    text = status_text()
    assert text.splitlines()[2].startswith(
        "FAILURE ALARM: the default mailer: 11 of 12 attempts failed in the last 1m00s (for "
    )
    assert text.splitlines()[2].endswith(f"most often: {CAUSE}")
    assert "mailer 'bulk': 3, 1 failed\n" in text
    assert "the default mailer: 12, 11 failed ALARM" in text
    report = json.loads(status_text("--json"))
    assert report["redis"]["failures"]["window"] == 60.0
    assert report["redis"]["failures"]["mailers"][""] == {
        "alarm": True,
        "attempts": 12,
        "failed": 11,
        "cause": CAUSE,
        "since": pytest.approx(time.time(), abs=5),
    }
    assert report["redis"]["failures"]["mailers"]["bulk"]["alarm"] is False

    body = client.get("/outbox/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).content
    lines = body.decode().splitlines()
    assert 'outbox_failure_alarm{mailer=""} 1' in lines
    assert 'outbox_failure_alarm{mailer="bulk"} 0' in lines
    assert 'outbox_failure_alarm_failed{mailer=""} 11' in lines
    assert 'outbox_failure_alarm_attempts{mailer="bulk"} 3' in lines
    assert f'# outbox_failure_alarm{{mailer=""}} cause: {CAUSE}' in lines
    assert "@" not in body.decode()

    page = admin_client.get(reverse("admin:outbox_dashboard")).content.decode()
    assert "Failure alarm: the default mailer." in page
    assert "11 of 12 attempts failed in the last 1 min 0 s" in page
    assert "SMTPSenderRefused 451 4.7.1 &lt;address&gt;: Sender address rejected" in page
    assert "bulk" not in page.split('id="outbox-failure-alarm-1"')[1].split("</p>")[0]


@pytest.mark.django_db
def test_no_alarm_shows_nothing_loud(rule, queue, client, admin_client):
    alarm.add({"": tally(40, 3)}, queue)
    text = status_text()
    assert "FAILURE ALARM" not in text
    assert "Attempts in the last 1m00s (alarm at 5 failed and 50% of attempts):" in text
    body = client.get("/outbox/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert 'outbox_failure_alarm{mailer=""} 0' in body.content.decode().splitlines()
    assert "cause:" not in body.content.decode()
    page = admin_client.get(reverse("admin:outbox_dashboard")).content.decode()
    assert "outbox-failure-alarm" not in page
