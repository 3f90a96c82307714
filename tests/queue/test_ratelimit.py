"""Rate limits held across every worker (outbox/queue/ratelimit.py, lua/rate_take.lua, worker/gate.py)."""

from __future__ import annotations

import contextlib
import io
import json
import socket
import threading
import time
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from outbox import enqueue_email
from outbox.models import Attempt, Delivery
from outbox.queue import control, ratelimit
from outbox.queue.ratelimit import Limit, take
from outbox.status import collect, render
from outbox.sweeper import Sweeper
from tests.cells import only_in_cells
from tests.checking import outbox_checks
from tests.delivery import use_smtp
from tests.servers import SMTPRecorder, wait_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    only_in_cells(
        "6.1:sqlite",
        why="the limits live in Redis, the same in every cell",
    ),
]

Status = Delivery.Status


def limits(settings, **extra) -> None:
    settings.OUTBOX = {**settings.OUTBOX, **extra}


def errors(code: str) -> list[str]:
    return [e.msg for e in outbox_checks() if e.id == code]


def started_times(rows) -> list[float]:
    return sorted(d.processing_started_at.timestamp() for d in rows)


def most_in_one_second(times: list[float]) -> int:
    return max(sum(1 for t in times if start <= t < start + 1.0) for start in times)


# -- settings and checks ------------------------------------------------------------


@pytest.mark.parametrize("value", ["fast", "0/s", "-1/s", "5/x", "5", "1.5/s", 5, None])
def test_a_malformed_limit_is_a_check_error(settings, value):
    limits(settings, RATE_LIMITS={"*": value})
    [message] = errors("outbox.E010")
    assert repr(value) in message
    assert ratelimit.limits() == {}  # never applied half-parsed


@pytest.mark.parametrize(
    "raw",
    [
        "14/s",
        {"not a domain": "1/s"},
        {"": "1/s"},
        {5: "1/s"},
        {"-bad.example": "1/s"},
        {"Gmail.com": "1/s", "gmail.com": "2/s"},
    ],
)
def test_a_malformed_key_or_dict_is_a_check_error(settings, raw):
    limits(settings, RATE_LIMITS=raw)
    assert len(errors("outbox.E010")) == 1


def test_good_limits_pass_and_parse_once_per_settings_value(settings):
    raw = {"*": "14/s", "Gmail.COM": "20/m", "example.org": " 5000 / d "}
    limits(settings, RATE_LIMITS=raw)
    assert errors("outbox.E010") == []
    parsed = ratelimit.limits()
    assert set(parsed) == {"*", "gmail.com", "example.org"}
    assert parsed["gmail.com"].interval == 3.0
    assert parsed["*"].interval == pytest.approx(1 / 14)
    assert parsed["example.org"].count == 5000
    assert ratelimit.limits() is parsed  # the same settings value: not parsed again
    limits(settings, RATE_LIMITS={"*": "1/s"})
    assert set(ratelimit.limits()) == {"*"}


@pytest.mark.parametrize("name", ["THROTTLE_PENALTY", "PAUSED_DOMAIN_RECHECK"])
@pytest.mark.parametrize("value", [0, -1, "10", True])
def test_control_intervals_must_be_positive_numbers(settings, name, value):
    limits(settings, **{name: value})
    assert len(errors("outbox.E011")) == 1


def test_domains_are_exact_and_lower_cased():
    assert ratelimit.domain_of("Bob <Bob@Mail.Gmail.COM>") == "mail.gmail.com"
    configured = ratelimit.parse_limits({"gmail.com": "1/s", "*": "9/s"})
    assert [x.key for x in ratelimit.applicable("gmail.com", configured)] == ["gmail.com", "*"]
    assert [x.key for x in ratelimit.applicable("mail.gmail.com", configured)] == ["*"]


# -- the script: one slot from every limit, atomically -----------------------------


def test_a_busy_limit_reserves_its_next_slot_and_takes_nothing_else(queue):
    domain = Limit("slow.example", "2/s", 2, 1.0)
    everything = Limit("*", "100/s", 100, 1.0)
    assert take(queue, 1, [domain, everything])[1] is None
    star_tat = queue.redis.hget(ratelimit.state_key(queue, "*"), "tat")
    now, slot = take(queue, 2, [domain, everything])
    assert slot is not None and 0.3 < slot - now <= 0.5
    # The domain refused: "*" was not consumed.
    assert queue.redis.hget(ratelimit.state_key(queue, "*"), "tat") == star_tat
    assert take(queue, 2, [domain, everything])[1] == slot  # back early: the same slot
    assert take(queue, 3, [domain, everything])[1] == pytest.approx(slot + 0.5)
    assert [u.held for u in usage_of(queue, domain, everything)] == [2, 0]
    wait_until(lambda: queue.time() >= slot, timeout=5)
    assert take(queue, 2, [domain, everything])[1] is None  # its slot came: it goes
    assert queue.redis.zscore(ratelimit.held_key(queue, "slow.example"), "2") is None


def test_a_busy_global_limit_does_not_consume_the_domain(queue):
    everything = Limit("*", "1/s", 1, 1.0)
    a = Limit("a.example", "100/s", 100, 1.0)
    b = Limit("b.example", "100/s", 100, 1.0)
    assert take(queue, 1, [a, everything])[1] is None
    assert take(queue, 2, [b, everything])[1] is not None
    assert queue.redis.hget(ratelimit.state_key(queue, "b.example"), "tat") is None


def test_a_backlog_whose_slots_went_by_catches_up_by_a_tenth_of_the_period(queue):
    limit = Limit("*", "10/s", 10, 1.0)
    assert take(queue, 1, [limit])[1] is None
    slots = [take(queue, i, [limit])[1] for i in range(2, 7)]
    assert slots == sorted(slots) and slots[0] is not None
    wait_until(lambda: queue.time() > slots[-1], timeout=5)
    # The workers lagged: all five slots have passed. They may run ahead of the
    # spacing by 0.1 s (one interval at 10/s) and no more.
    results = [take(queue, i, [limit]) for i in range(2, 7)]
    admitted = [i for i, (_now, slot) in zip(range(2, 7), results, strict=True) if slot is None]
    assert 1 <= len(admitted) <= 2, results
    later = [slot for _now, slot in results if slot is not None]
    assert min(later) > slots[-1]  # new slots at the end


def usage_of(queue, *configured: Limit) -> list[ratelimit.LimitUsage]:
    from django.conf import settings
    from django.test import override_settings

    raw = {limit.key: limit.text for limit in configured}
    with override_settings(OUTBOX={**settings.OUTBOX, "RATE_LIMITS": raw}):
        return ratelimit.usage(queue)


# -- workers --------------------------------------------------------------------------


def test_a_domain_limit_holds_its_backlog_while_other_domains_flow(
    settings, outbox_mail, queue, running
):
    limits(settings, RATE_LIMITS={"slow.example": "2/s"})
    slow = enqueue_email("s", "b", None, [f"s{i}@slow.example" for i in range(12)])
    fast = enqueue_email("f", "b", None, [f"f{i}@fast.example" for i in range(30)])
    running(concurrency=2)

    def sent(rows) -> int:
        return Delivery.objects.filter(pk__in=[d.pk for d in rows], status=Status.SENT).count()

    wait_until(lambda: sent(fast) == 30, timeout=15)
    # The 12 need at least 5.5 s at 2/s; the other domain did not wait for them.
    waiting = Delivery.objects.filter(pk__in=[d.pk for d in slow], status=Status.QUEUED)
    assert waiting.exists()
    # Held, not attempted: attempts unchanged, no Attempt row, waiting in `scheduled`.
    assert set(waiting.values_list("attempts", flat=True)) == {0}
    assert not Attempt.objects.exists()
    [use] = ratelimit.usage(queue)
    assert use.key == "slow.example" and use.limit == "2/s" and use.held >= 1
    report = collect()
    assert report["redis"]["rate_limits"][0]["key"] == "slow.example"
    assert "slow.example 2/s" in render(report)
    # The sweeper's full check sees the held ids waiting in `scheduled`: nothing to repair.
    assert Sweeper().run_pass(full_mirror_check=True).remirrored == 0

    wait_until(lambda: sent(slow) == 12, timeout=30)
    times = started_times(Delivery.objects.filter(pk__in=[d.pk for d in slow]))
    # Slots are 0.5 s apart; a send may come up to BLOCK_TIMEOUT after its slot.
    assert most_in_one_second(times) <= 3, times
    assert times[-1] - times[0] >= 11 * 0.5 * 0.9
    assert set(Delivery.objects.values_list("attempts", flat=True)) == {1}
    assert not Attempt.objects.exists()
    assert len(outbox_mail) == 42


def test_two_worker_processes_share_one_global_limit(worker_process, queue):
    env = {"OUTBOX_TEST_RATE_LIMITS": json.dumps({"*": "5/s"})}
    worker_process("--concurrency", "2", **env)
    worker_process("--concurrency", "2", **env)
    wait_until(lambda: len(queue.live_workers()) == 2, timeout=30)
    rows = enqueue_email("s", "b", None, [f"u{i}@example.com" for i in range(20)])
    pks = [d.pk for d in rows]
    wait_until(
        lambda: Delivery.objects.filter(pk__in=pks, status=Status.SENT).count() == 20, timeout=40
    )
    sent = list(Delivery.objects.filter(pk__in=pks))
    times = started_times(sent)
    assert len({d.worker_id.partition("#")[0] for d in sent}) == 2  # both took part
    assert most_in_one_second(times) <= 6, times  # 5/s, give or take the boundary
    assert times[-1] - times[0] >= 19 * 0.2 * 0.9
    assert {d.attempts for d in sent} == {1}
    assert not Attempt.objects.exists()


def test_a_421_slows_the_whole_domain_down(settings, running):
    server = SMTPRecorder(refuse={"first@busy.example": "421 4.7.0 Slow down"}).start()
    try:
        use_smtp(settings, server.port, THROTTLE_PENALTY=3.0, RETRY_BACKOFF=(30.0, 30.0))
        [first] = enqueue_email("s", "b", None, ["first@busy.example"])
        worker = running()
        wait_until(lambda: Attempt.objects.filter(delivery_id=first.pk).exists(), timeout=10)
        penalty_set = time.time()
        assert "busy.example" in control.state().slow_domains
        later = enqueue_email("s", "b", None, [f"n{i}@busy.example" for i in range(3)])
        enqueue_email("s", "b", None, [f"o{i}@other.example" for i in range(3)])
        wait_until(lambda: server.count() >= 3, timeout=10)
        assert sorted(r.rcpt_tos[0] for r in server.received) == [
            f"o{i}@other.example" for i in range(3)
        ]
        held = Delivery.objects.filter(pk__in=[d.pk for d in later])
        assert set(held.values_list("status", "attempts")) == {(Status.QUEUED, 0)}
        wait_until(lambda: server.count() == 6, timeout=15)
        assert time.time() - penalty_set >= 2.5  # they waited for the domain, not for a retry
        # The refused message itself was retried as usual: one attempt, backoff 30 s.
        first.refresh_from_db()
        assert first.status == Status.QUEUED and first.attempts == 1
        assert Attempt.objects.get(delivery_id=first.pk).outcome == Attempt.Outcome.RETRY
        # The server counts a message before the worker has recorded its outcome.
        wait_until(lambda: worker.stats.delivered_total == 6, timeout=5)
    finally:
        server.stop()


class BusyServer:
    """Answers every connection with a 421 greeting, as a relay that is too busy does."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _addr = self.listener.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"421 4.3.2 Too busy, try later\r\n")

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.thread.join(timeout=5)


def test_a_421_greeting_holds_all_sending(settings, running, queue):
    server = BusyServer()
    try:
        use_smtp(settings, server.port, THROTTLE_PENALTY=30.0, RETRY_BACKOFF=(30.0, 30.0))
        [first] = enqueue_email("s", "b", None, ["a@one.example"])
        running()
        wait_until(lambda: Attempt.objects.filter(delivery_id=first.pk).exists(), timeout=10)
        assert "*" in control.state(queue).slow_domains
        [other] = enqueue_email("s", "b", None, ["b@two.example"])
        # Another domain waits too (given back, not attempted): the server as a whole is busy.
        held = wait_until(
            lambda: Delivery.objects.filter(
                pk=other.pk,
                status=Status.QUEUED,
                not_before__gt=timezone.now() + timedelta(seconds=20),
            ).first(),
            timeout=10,
        )
        assert held.attempts == 0
        assert not Attempt.objects.filter(delivery_id=other.pk).exists()
    finally:
        server.stop()


def test_outbox_status_lists_each_limit(settings, queue):
    limits(settings, RATE_LIMITS={"*": "14/s", "gmail.com": "20/m"})
    out = io.StringIO()
    call_command("outbox_status", stdout=out)
    assert "* 14/s: 0 of 14 used this period, 0 held" in out.getvalue()
    assert "gmail.com 20/m: 0 of 20 used this period, 0 held" in out.getvalue()


def test_an_idle_worker_wakes_when_a_held_or_scheduled_id_falls_due(settings, running):
    """Nothing pushes when a scheduled id falls due: the idle wait must end by then.

    With a long BLOCK_TIMEOUT, a row scheduled 0.5 s ahead is still sent within a
    second or so, not after the block timeout.
    """
    settings.OUTBOX = {**settings.OUTBOX, "BLOCK_TIMEOUT": 8.0}
    worker = running()
    # Its threads block on the wake token first (with nothing scheduled: 8 s).
    wait_until(
        lambda: any(c.get("cmd") == "blpop" for c in worker.queue.redis.client_list()),
        timeout=10,
    )
    due = timezone.now() + timedelta(seconds=0.5)
    [row] = enqueue_email("s", "b", None, ["later@example.com"], send_at=due)
    wait_until(
        lambda: Delivery.objects.filter(pk=row.pk, status=Delivery.Status.SENT).exists(),
        timeout=4,
    )
    sent = Delivery.objects.get(pk=row.pk).sent_at
    assert sent >= due
