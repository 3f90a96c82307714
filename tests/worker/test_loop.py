"""The worker loop, in process: claim, mark processing, send, settle."""

from __future__ import annotations

import math
import threading
import uuid
from datetime import timedelta

import pytest
from django.core.mail.backends import locmem
from django.utils import timezone

from outbox import enqueue_email
from outbox.models import Attempt, Delivery
from outbox.queue import QueueEntry
from outbox.queue.scripts import shared_script
from outbox.worker import InFlight, Worker, backoff_delay, is_permanent
from outbox.worker.loop import SenderLoop
from outbox.worker.outcomes import failure
from tests.servers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

Status = Delivery.Status


def burst(**kwargs) -> Worker:
    worker = Worker(burst=True, **kwargs)
    assert worker.run(install_signal_handlers=False) == 0
    return worker


def test_burst_delivers_everything_due_and_exits(outbox_mail, queue):
    deliveries = enqueue_email(
        "Hello", "Body", "shop@example.com", [f"u{i}@example.com" for i in range(50)]
    )
    later = enqueue_email(
        "Later", "x", None, ["later@example.com"], send_at=timezone.now() + timedelta(hours=1)
    )
    worker = burst()
    assert worker.delivered_total == 50
    assert len(outbox_mail) == 50
    assert Delivery.objects.filter(status=Status.SENT).count() == 50
    assert Delivery.objects.get(pk=later[0].pk).status == Status.QUEUED
    # Every finished id was acknowledged and the worker deregistered.
    assert queue.live_workers() == {}
    assert queue.redis.keys("{outbox}:processing:*") == []
    sent = Delivery.objects.get(pk=deliveries[0].pk)
    # A success is recorded on the row itself: who sent it, under which claim,
    # from when to when. Only attempts that did not succeed get an Attempt row.
    assert sent.sent_at is not None and sent.attempts == 1 and sent.claim_token is not None
    assert sent.worker_id == worker.worker_id
    assert sent.processing_started_at is not None
    assert sent.processing_started_at <= sent.sent_at
    assert not Attempt.objects.exists()


def test_each_recipient_gets_its_own_copy(outbox_mail):
    deliveries = enqueue_email(
        "Receipt",
        "Text body",
        "Shop <shop@example.com>",
        ["a@example.com", "Bob <b@example.com>"],
        html_message="<p>HTML body</p>",
        reply_to=["help@example.com"],
        headers={"X-Order": "42"},
        attachments=[("r.txt", b"receipt", "text/plain")],
    )
    burst()
    by_to = {tuple(m.to): m for m in outbox_mail}
    assert set(by_to) == {("a@example.com",), ("Bob <b@example.com>",)}
    for delivery in deliveries:
        message = by_to[(delivery.recipient,)]
        assert message.recipients() == [delivery.recipient]
        assert message.extra_headers["Message-ID"] == delivery.message_id
        assert message.extra_headers["X-Order"] == "42"
        assert message.reply_to == ["help@example.com"]
        assert message.alternatives[0][0] == "<p>HTML body</p>"
        assert message.attachments[0][0] == "r.txt"
        parsed = message.message()
        assert parsed["Message-ID"] == delivery.message_id
        assert parsed["To"] == delivery.recipient


class FlakyBackend(locmem.EmailBackend):
    """Fails the first N sends with a transient error, then delivers."""

    failures = 0
    error: Exception = OSError("connection reset")

    def send_messages(self, messages):
        if FlakyBackend.failures > 0:
            FlakyBackend.failures -= 1
            raise FlakyBackend.error
        return super().send_messages(messages)


@pytest.fixture
def flaky(settings):
    settings.OUTBOX = {**settings.OUTBOX, "EMAIL_BACKEND": "tests.worker.test_loop.FlakyBackend"}
    FlakyBackend.failures = 0
    FlakyBackend.error = OSError("connection reset")
    return FlakyBackend


def test_transient_failure_retries_with_backoff_then_succeeds(flaky, outbox_mail, queue, settings):
    # A backoff of 1 to 2 s: the test settings' 0.1 s could come due inside the
    # first burst on a loaded machine, which would then send the retry at once.
    settings.OUTBOX = {**settings.OUTBOX, "RETRY_BACKOFF": (2.0, 2.0)}
    flaky.failures = 1
    delivery = enqueue_email("s", "b", None, ["a@example.com"])[0]
    burst()
    row = Delivery.objects.get(pk=delivery.pk)
    assert row.status == Status.QUEUED and row.attempts == 1
    assert "connection reset" in row.last_error
    assert row.not_before > timezone.now() - timedelta(seconds=1)
    # The retry waits in `scheduled`, not in a ready list.
    assert queue.scheduled_length() == 1
    wait_until(lambda: timezone.now() >= Delivery.objects.get(pk=delivery.pk).not_before, 5)
    burst()
    row.refresh_from_db()
    assert row.status == Status.SENT and row.attempts == 2 and row.last_error == ""
    outcomes = list(Attempt.objects.filter(delivery=row).values_list("number", "outcome"))
    assert outcomes == [(1, "retry")]  # the success is on the row: attempts == 2, sent_at
    assert len(outbox_mail) == 1


def test_permanent_failure_marks_failed(flaky):
    import smtplib

    flaky.failures = 1
    flaky.error = smtplib.SMTPRecipientsRefused({"a@example.com": (550, b"no such user")})
    delivery = enqueue_email("s", "b", None, ["a@example.com"])[0]
    burst()
    row = Delivery.objects.get(pk=delivery.pk)
    assert row.status == Status.FAILED and row.attempts == 1
    assert "no such user" in row.last_error
    assert Attempt.objects.get(delivery=row).outcome == "failed"


def test_attempts_exhausted_marks_failed(flaky):
    flaky.failures = 10
    delivery = enqueue_email("s", "b", None, ["a@example.com"], max_attempts=2)[0]
    burst()
    wait_until(lambda: timezone.now() >= Delivery.objects.get(pk=delivery.pk).not_before, 5)
    burst()
    row = Delivery.objects.get(pk=delivery.pk)
    assert row.status == Status.FAILED and row.attempts == 2
    assert list(Attempt.objects.filter(delivery=row).values_list("outcome", flat=True)) == [
        "retry",
        "failed",
    ]


def test_one_bad_message_does_not_stall_the_queue(flaky, outbox_mail, settings):
    # A backoff of 2 s, as above: the test settings' could come due inside the burst
    # on a loaded machine, which would then send the first one's retry too.
    settings.OUTBOX = {**settings.OUTBOX, "RETRY_BACKOFF": (2.0, 2.0)}
    flaky.failures = 1
    enqueue_email("first", "b", None, ["a@example.com"])
    enqueue_email("second", "b", None, ["b@example.com"])
    burst()
    assert [m.subject for m in outbox_mail] == ["second"]


def test_duplicate_and_stale_ids_send_nothing_twice(outbox_mail, queue):
    delivery = enqueue_email("s", "b", None, ["a@example.com"])[0]
    cancelled = enqueue_email("s", "b", None, ["c@example.com"])[0]
    Delivery.objects.filter(pk=cancelled.pk).update(status=Status.CANCELLED)
    # The same id pushed again, bypassing the dedup gate, as after a partial loss.
    for _ in range(3):
        queue.redis.lpush(queue.ready_key("normal"), delivery.pk)
    queue.redis.lpush(queue.ready_key("normal"), 999_999)  # a row that does not exist
    worker = burst()
    assert len(outbox_mail) == 1
    assert worker.stats.take() == (0, 0, 0, 0, 0, 0)  # the summary was already logged and reset
    assert Delivery.objects.get(pk=delivery.pk).attempts == 1
    assert Delivery.objects.get(pk=cancelled.pk).status == Status.CANCELLED
    assert queue.redis.keys("{outbox}:processing:*") == []


def test_early_id_is_put_back_in_schedule(outbox_mail, queue):
    later = timezone.now() + timedelta(hours=1)
    delivery = enqueue_email("s", "b", None, ["a@example.com"], send_at=later)[0]
    queue.redis.lpush(queue.ready_key("normal"), delivery.pk)  # pushed early by mistake
    queue.redis.delete(queue.scheduled_key, queue.queued_key)
    burst()
    assert outbox_mail == []
    assert queue.redis.zscore(queue.scheduled_key, f"{delivery.pk}:2") == pytest.approx(
        later.timestamp()
    )


def test_stale_worker_cannot_overwrite_another_attempts_outcome():
    from outbox.worker import Settlement

    delivery = enqueue_email("s", "b", None, ["a@example.com"])[0]
    # Attempt 1 by a worker that then stalls; the row is given to attempt 2.
    old_token, new_token = uuid.uuid4(), uuid.uuid4()
    Delivery.objects.filter(pk=delivery.pk).update(
        status=Status.PROCESSING, claim_token=new_token, attempts=2, worker_id="other"
    )
    worker = Worker(burst=True)
    row = Delivery.objects.get(pk=delivery.pk)
    stale = InFlight.marked(row, row.email, [], old_token, worker.worker_id)
    settle_alone(worker, Settlement(stale, Attempt.Outcome.SENT))
    settle_alone(worker, failure(stale, OSError("late"), timezone.now()))
    row.refresh_from_db()
    assert row.status == Status.PROCESSING and row.claim_token == new_token
    assert row.last_error == ""
    # The late success is kept as evidence (the server did accept the message).
    log = list(Attempt.objects.filter(claim_token=old_token).values_list("outcome", flat=True))
    assert log == ["sent", "retry"]


def test_an_outcome_written_twice_is_written_once():
    """A retry after a commit whose reply was lost finds its own write, not a conflict."""
    from outbox.worker import Settlement

    sent, failed = enqueue_email("s", "b", None, ["a@example.com", "b@example.com"])
    worker = Worker(burst=True)
    settlements = []
    for delivery, outcome in ((sent, Attempt.Outcome.SENT), (failed, Attempt.Outcome.FAILED)):
        token = uuid.uuid4()
        Delivery.objects.filter(pk=delivery.pk).update(
            status=Status.PROCESSING, claim_token=token, attempts=1, worker_id=worker.worker_id
        )
        row = Delivery.objects.get(pk=delivery.pk)
        flight = InFlight.marked(row, row.email, [], token, worker.worker_id)
        settlements.append(Settlement(flight, outcome, "550 no such user" * (outcome != "sent")))
    for settlement in settlements * 2:
        assert settle_alone(worker, settlement) == [settlement.delivery.pk]
    assert Delivery.objects.get(pk=sent.pk).status == Status.SENT
    assert Delivery.objects.get(pk=failed.pk).status == Status.FAILED
    assert list(Attempt.objects.values_list("delivery_id", "outcome")) == [(failed.pk, "failed")]


class OneInDoubtBackend(locmem.EmailBackend):
    """Records how many rows are `processing` each time a message is handed over."""

    in_doubt: list[int] = []

    def send_messages(self, messages):
        OneInDoubtBackend.in_doubt.append(Delivery.objects.filter(status=Status.PROCESSING).count())
        return super().send_messages(messages)


@pytest.mark.parametrize("concurrency", [1, 4])
def test_each_outcome_is_committed_before_the_next_send(settings, outbox_mail, concurrency):
    """The next row's claim shares a commit with the last outcome, never more.

    So at any moment at most one row per sending thread is in doubt: the one
    being handed to the backend.
    """
    backend = "tests.worker.test_loop.OneInDoubtBackend"
    settings.OUTBOX = {**settings.OUTBOX, "EMAIL_BACKEND": backend}
    OneInDoubtBackend.in_doubt = []
    enqueue_email("s", "b", None, [f"u{i}@example.com" for i in range(60)])
    burst(concurrency=concurrency)
    assert len(outbox_mail) == 60
    assert len(OneInDoubtBackend.in_doubt) == 60
    assert min(OneInDoubtBackend.in_doubt) >= 1
    assert max(OneInDoubtBackend.in_doubt) <= concurrency
    sent = Delivery.objects.filter(status=Status.SENT)
    assert sent.count() == 60 and not sent.filter(sent_at__isnull=True).exists()


def test_priorities_high_first(outbox_mail):
    enqueue_email("low", "b", None, ["l@example.com"], priority="low")
    enqueue_email("normal", "b", None, ["n@example.com"])
    enqueue_email("high", "b", None, ["h@example.com"], priority="high")
    burst()
    assert [m.subject for m in outbox_mail] == ["high", "normal", "low"]


def test_send_at_is_respected_and_fires_soon_after(outbox_mail):
    at = timezone.now() + timedelta(seconds=1)
    delivery = enqueue_email("s", "b", None, ["a@example.com"], send_at=at)[0]
    worker = Worker()
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    thread.start()
    try:
        wait_until(lambda: Delivery.objects.get(pk=delivery.pk).status == Status.SENT, 10)
    finally:
        worker.stop()
        thread.join(10)
    sent_at = Delivery.objects.get(pk=delivery.pk).sent_at
    assert at <= sent_at < at + timedelta(seconds=2)


def test_concurrency_delivers_every_message_once(outbox_mail):
    deliveries = enqueue_email("s", "b", None, [f"u{i}@example.com" for i in range(200)])
    worker = burst(concurrency=4)
    assert worker.delivered_total == 200
    assert sorted(m.to[0] for m in outbox_mail) == sorted(d.recipient for d in deliveries)
    assert Delivery.objects.filter(status=Status.SENT, attempts=1).count() == 200
    assert not Attempt.objects.exists()


def test_max_messages_stops_and_gives_back_the_rest(outbox_mail, queue):
    enqueue_email("s", "b", None, [f"u{i}@example.com" for i in range(30)])
    worker = Worker(max_messages=7)
    worker.run(install_signal_handlers=False)
    assert len(outbox_mail) == 7
    assert queue.redis.llen(queue.ready_key("normal")) == 23
    assert queue.queued_count() == 23


def test_declared_dead_worker_reregisters_under_a_new_id(queue, outbox_mail):
    worker = Worker()
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    thread.start()
    try:
        first = wait_until(lambda: next(iter(queue.live_workers()), None), 5)
        queue.declare_dead(timeout=-1)
        second = wait_until(lambda: next((w for w in queue.live_workers() if w != first), None), 5)
        assert second != first
        # Redis lists the new incarnation a moment before the worker takes its name.
        wait_until(lambda: worker.worker_id == second, 5)
        enqueue_email("s", "b", None, ["a@example.com"])
        wait_until(lambda: len(outbox_mail) == 1, 5)
        assert Delivery.objects.get().worker_id == second
    finally:
        worker.stop()
        thread.join(10)


def test_backoff_grows_with_jitter_and_is_capped():
    for attempt in range(1, 12):
        delay = backoff_delay(attempt, 10, 3600)
        ceiling = min(3600, 10 * 2 ** (attempt - 1))
        assert ceiling / 2 <= delay <= ceiling


def test_error_classification():
    import smtplib

    from outbox.exceptions import DeliveryError

    assert is_permanent(smtplib.SMTPRecipientsRefused({"a": (550, b"no")}))
    assert not is_permanent(smtplib.SMTPRecipientsRefused({"a": (451, b"later")}))
    assert is_permanent(smtplib.SMTPDataError(554, b"rejected"))
    assert not is_permanent(smtplib.SMTPDataError(421, b"busy"))
    assert not is_permanent(smtplib.SMTPAuthenticationError(535, b"bad auth"))
    assert not is_permanent(smtplib.SMTPServerDisconnected("gone"))
    assert not is_permanent(ConnectionRefusedError())
    assert is_permanent(ValueError("Invalid address"))
    assert is_permanent(DeliveryError("x", permanent=True))
    assert not is_permanent(DeliveryError("x"))


def test_worker_survives_a_redis_restart(redis_server, settings, outbox_mail):
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": redis_server.url,
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 2},
        }
    }
    worker = Worker()
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    thread.start()
    try:
        enqueue_email("before", "b", None, ["a@example.com"])
        wait_until(lambda: len(outbox_mail) == 1, 10)
        redis_server.restart()
        enqueue_email("after", "b", None, ["b@example.com"])
        wait_until(lambda: len(outbox_mail) == 2, 20)
        assert thread.is_alive()
    finally:
        worker.stop()
        thread.join(10)
    assert [m.subject for m in outbox_mail] == ["before", "after"]


def test_two_threads_noticing_a_lost_registration_leave_one_live_incarnation(queue):
    """After Redis lost a worker's entry, exactly one new incarnation is registered.

    The heartbeat thread and a sender thread may both notice the loss. If one
    published a new name before registering it, the other could read that
    name, find it unregistered and move on again: the first name would then be
    registered by nobody's heartbeat and declared dead by the sweeper a few
    seconds later (seen in a chaos run after a Redis wipe). Here a second thread
    notices the loss in the middle of the first one's registration.
    """
    worker = Worker()
    lost = worker.worker_id
    queue.register(lost)
    queue.redis.delete(queue.workers_key)  # Redis forgot every worker
    real_register = worker.queue.register
    others: list[threading.Thread] = []

    def register_while_another_thread_notices(worker_id: str) -> float:
        if not others:
            seen = worker.worker_id  # what a sender thread would claim under now
            other = threading.Thread(target=worker.reincarnate, args=(seen,))
            others.append(other)
            other.start()
            other.join(0.5)  # it must wait for us, or have nothing left to do
        return real_register(worker_id)

    worker.queue.register = register_while_another_thread_notices  # type: ignore[method-assign]
    worker.reincarnate(lost)
    others[0].join(10)
    assert not others[0].is_alive()
    members = [m.decode() for m in queue.redis.zrange(queue.workers_key, 0, -1)]
    assert members == [worker.worker_id] != [lost]
    assert worker.incarnation().worker_id == worker.worker_id != lost


def test_claimed_ids_are_given_back_on_stop(queue, outbox_mail):
    enqueue_email("s", "b", None, ["a@example.com", "b@example.com"])
    worker = Worker(burst=True)
    queue.register(worker.worker_id)
    claimed = queue.claim(worker.worker_id, 2).items
    assert len(claimed) == 2
    loop = SenderLoop(worker, 0, locmem.EmailBackend())
    loop.pending.extend(InFlight(c.id, c.priority) for c in claimed)
    loop._give_back()
    assert queue.redis.llen(queue.ready_key("normal")) == 2
    assert queue.redis.llen(queue.processing_key(worker.worker_id)) == 0
    assert queue.push([QueueEntry(claimed[0].id, "normal", 0)]) == 0  # already back


def test_a_claim_takes_its_fair_share_of_a_short_backlog(queue):
    """At most ceil(ready / share) ids, at least one; a long backlog, CLAIM_BATCH at a time."""
    worker_id = "w#1"
    queue.register(worker_id)
    queue.push([QueueEntry(i, "normal", 0) for i in range(1, 7)])
    assert len(queue.claim(worker_id, 10, share=4).items) == 2  # 6 ready: ceil(6 / 4)
    assert len(queue.claim(worker_id, 10, share=4).items) == 1  # 4 ready
    assert len(queue.claim(worker_id, 10, share=1).items) == 3  # one thread takes all
    queue.push([QueueEntry(i, "normal", 0) for i in range(100, 150)])
    assert len(queue.claim(worker_id, 10, share=4).items) == 10  # 50 ready: the batch
    assert len(queue.claim(worker_id, 1, share=4).items) == 1


class MeetingBackend(locmem.EmailBackend):
    """Each send waits until four sends are under way at once."""

    meeting = threading.Barrier(4)
    met: list[str] = []

    def send_messages(self, email_messages):
        try:
            self.meeting.wait(timeout=10)
        except threading.BrokenBarrierError:
            pass
        else:
            self.met.append(email_messages[0].to[0])
        return super().send_messages(email_messages)


def test_a_short_backlog_is_spread_over_the_idle_threads(settings, outbox_mail):
    """Four ready emails and four threads: four sends at once, not one thread's four in a row.

    With a 20 ms server, the tenth id of a claim of ten waited ~200 ms behind
    the thread that claimed it while the other threads idled.
    """
    settings.OUTBOX = {**settings.OUTBOX, "EMAIL_BACKEND": f"{__name__}.MeetingBackend"}
    MeetingBackend.meeting = threading.Barrier(4)
    MeetingBackend.met = []
    enqueue_email("s", "b", None, [f"r{i}@example.com" for i in range(4)])
    burst(concurrency=4)
    assert sorted(MeetingBackend.met) == [f"r{i}@example.com" for i in range(4)]
    assert Delivery.objects.filter(status=Status.SENT).count() == 4


def test_the_step_statement_is_prepared_only_when_django_allows_it():
    """Prepared statements follow the project's OPTIONS["prepare_threshold"]: the step's call."""
    from django.db import connection

    from outbox.worker.sql import Step, run_steps

    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only: SQLite has no server-side prepared statements")
    first, second = enqueue_email("s", "b", None, ["a@example.com", "b@example.com"])
    connection.ensure_connection()
    raw = connection.connection
    saved = raw.prepare_threshold

    def prepared() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
                ["%outbox_step(%"],
            )
            return cursor.fetchone()[0]

    try:
        raw.prepare_threshold = None  # Django's default: keeps PgBouncer working
        before = prepared()
        ((_, claimed),) = run_steps([Step(None, first.pk, "w", uuid.uuid4(), timezone.now(), 0)])
        assert claimed is not None and claimed.delivery.recipient == "a@example.com"
        assert prepared() == before
        raw.prepare_threshold = 0  # prepare at first use
        ((_, claimed),) = run_steps([Step(None, second.pk, "w", uuid.uuid4(), timezone.now(), 0)])
        assert claimed is not None and claimed.email is not None
        assert claimed.email.subject == "s"
        assert prepared() == before + 1
    finally:
        raw.prepare_threshold = saved
    assert Delivery.objects.filter(status=Status.PROCESSING).count() == 2


def settle_alone(worker, settlement):
    """Write one outcome the way a sender thread does when no next row is ready."""
    loop = SenderLoop(worker, 0, locmem.EmailBackend())
    loop.settling.settlement = settlement
    loop._settle_alone()
    return loop.acks


def test_a_claim_that_finds_nothing_says_when_the_next_scheduled_id_is_due(queue):
    """The idle thread's look at `scheduled` comes with the empty claim, not in a round trip of its own."""
    worker_id = "w#1"
    queue.register(worker_id)
    assert queue.claim(worker_id, 10).next_due == math.inf  # nothing scheduled
    due = queue.claim(worker_id, 10).now + 60
    queue.push([QueueEntry(7, "normal", due), QueueEntry(8, "normal", due + 5)])
    assert queue.claim(worker_id, 10).next_due == pytest.approx(due, abs=1e-5)
    queue.push([QueueEntry(9, "normal", 0)])
    claimed = queue.claim(worker_id, 10)
    assert [c.id for c in claimed.items] == [9]
    assert claimed.next_due is None  # it took one: not looked at


class _Monitor:
    """The commands clients send to the test's Redis (MONITOR), scripts' own calls left out."""

    STOP = "outbox-test-monitor-stop"

    def __init__(self, queue) -> None:
        self.queue = queue
        self.commands: list[str] = []
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Monitor:
        self.thread.start()
        assert self.ready.wait(10)
        return self

    def _run(self) -> None:
        with self.queue.redis.monitor() as monitor:
            self.ready.set()
            while True:
                seen = monitor.next_command()
                if seen["client_type"] == "lua":
                    continue
                if self.STOP in seen["command"]:
                    return
                self.commands.append(seen["command"])

    def __exit__(self, *exc) -> None:
        self.queue.redis.echo(self.STOP)
        self.thread.join(10)


def test_after_a_success_with_nothing_left_the_thread_waits_without_looking_again(
    settings, queue, running, outbox_mail
):
    """Sends spread out: one claim finds nothing, the success is written, and the thread blocks.

    It used to claim once more and then ask for the next scheduled time: two
    round trips more per email whenever the worker keeps up with the traffic.
    The success's ack rides on the next claim.
    """
    # No idle timeout runs out while the test watches (HEARTBEAT_TIMEOUT is 3 s).
    settings.OUTBOX = {**settings.OUTBOX, "BLOCK_TIMEOUT": 2.5}
    claim, push = shared_script("claim").sha, shared_script("push").sha
    with _Monitor(queue) as monitor:
        worker = running(concurrency=1)
        wait_until(lambda: any(c.startswith("BLPOP") for c in monitor.commands))
        [delivery] = enqueue_email("s", "b", None, ["a@example.com"])
        wait_until(lambda: Delivery.objects.get(pk=delivery.pk).status == Delivery.Status.SENT)
        pushed = next(i for i, c in enumerate(monitor.commands) if push in c)

        def made() -> list[str] | None:
            # What the thread sent from the push's wake-up until it blocked again.
            after = monitor.commands[pushed + 1 :]
            blocked = [i for i, c in enumerate(after) if c.startswith("BLPOP")]
            return after[: blocked[0]] if blocked else None

        commands = wait_until(made)
    assert sum(claim in c for c in commands) == 2, commands  # the one that took it, an empty one
    assert not any(c.startswith("ZRANGE") for c in commands), commands
    assert [m.to for m in outbox_mail] == [["a@example.com"]]
    # The ack waits for the next claim: the id is still listed, its row sent.
    assert queue.processing_ids(worker.worker_id) == [delivery.pk]
