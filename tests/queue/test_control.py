"""Pause and resume: outbox_pause / outbox_resume (outbox/queue/control.py, lua/claim.lua)."""

from __future__ import annotations

import io
import logging
import re
import signal

import pytest
from django.core.management import CommandError, call_command

from outbox import enqueue_email
from outbox.models import Attempt, Delivery
from outbox.queue import control
from outbox.status import collect, render
from tests.servers import SMTPRecorder, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

Status = Delivery.Status


def run(command: str, *args: str) -> str:
    out = io.StringIO()
    call_command(command, *args, stdout=out)
    return out.getvalue()


def sent(rows) -> int:
    return Delivery.objects.filter(pk__in=[d.pk for d in rows], status=Status.SENT).count()


def test_pause_and_resume_commands_set_the_switches(queue):
    assert "Paused all sending" in run("outbox_pause")
    assert control.state(queue).paused
    assert "Paused mail to gmail.com" in run("outbox_pause", "--domain", "GMail.com")
    assert "Resumed sending; still paused: gmail.com" in run("outbox_resume")
    state = control.state(queue)
    assert not state.paused and set(state.paused_domains) == {"gmail.com"}
    run("outbox_resume", "--domain", "gmail.com")
    assert control.state(queue).paused_domains == {}
    with pytest.raises(CommandError, match="not a domain name"):
        run("outbox_pause", "--domain", "not a domain")


def test_resume_says_it_once_and_logs_nothing(queue, caplog):
    """The command's line is its output; a log line too would print it twice."""
    caplog.set_level(logging.DEBUG, logger="outbox")
    assert run("outbox_resume") == "Resumed sending.\n"
    assert run("outbox_pause", "--domain", "gmail.com") == "Paused mail to gmail.com.\n"
    assert caplog.records == []


@pytest.mark.parametrize(
    ("command", "verb"), [("outbox_pause", "paused"), ("outbox_resume", "resumed")]
)
def test_pause_and_resume_without_redis_exit_75(settings, command, verb):
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.3},
        }
    }
    with pytest.raises(CommandError) as raised:
        run(command)
    assert raised.value.returncode == 75
    assert (
        f"Redis (cache 'default' at redis://127.0.0.1:1/0) is unreachable, nothing was {verb}"
        in str(raised.value)
    )


def test_the_help_says_what_pause_does():
    from outbox.management.commands.outbox_pause import Command as Pause
    from outbox.management.commands.outbox_resume import Command as Resume

    assert "within about one second" in Pause.help and "nothing is lost" in Pause.help
    assert "outbox_pause" in Resume.help


def test_a_paused_claim_hands_out_nothing(queue):
    enqueue_email("s", "b", None, ["a@example.com"])
    queue.register("w#1")
    control.pause(queue=queue)
    result = queue.claim("w#1", 10)
    assert result.items == [] and control.parse(result.control).paused
    control.resume(queue=queue)
    assert len(queue.claim("w#1", 10).items) == 1


def test_pause_stops_claiming_within_a_second_and_resume_drains(worker_process, queue):
    server = SMTPRecorder(delay=0.2).start()
    try:
        rows = enqueue_email("s", "b", None, [f"u{i}@example.com" for i in range(40)])
        proc = worker_process("--concurrency", "2", OUTBOX_TEST_SMTP_PORT=str(server.port))
        wait_until(lambda: server.count() >= 4, timeout=20)
        run("outbox_pause")
        paused_at = queue.time()
        # The messages in hand finish; the ids claimed but not started go back to Redis.
        wait_until(lambda: not Delivery.objects.filter(status=Status.PROCESSING).exists(), 10)
        queued = Delivery.objects.filter(status=Status.QUEUED).count()
        wait_until(lambda: sum(queue.ready_lengths().values()) >= queued, timeout=10)
        assert queued > 0
        latest = max(
            d.processing_started_at.timestamp()
            for d in Delivery.objects.all()
            if d.processing_started_at is not None
        )
        assert latest <= paused_at + 1.0
        assert server.count() == sent(rows)  # nothing more reached the server
        assert "Sending: PAUSED" in render(collect())

        run("outbox_resume")
        wait_until(lambda: sent(rows) == 40, timeout=40)
        assert server.count() == 40
        assert not Attempt.objects.exists()
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
        assert output.count("paused by operator") == 1
    finally:
        server.stop()


def test_a_paused_domain_waits_while_others_flow(settings, outbox_mail, running):
    settings.OUTBOX = {**settings.OUTBOX, "PAUSED_DOMAIN_RECHECK": 1.0}
    run("outbox_pause", "--domain", "hold.example")
    held = enqueue_email("s", "b", None, [f"h{i}@hold.example" for i in range(3)])
    going = enqueue_email("s", "b", None, [f"g{i}@go.example" for i in range(3)])
    running()
    wait_until(lambda: sent(going) == 3, timeout=10)
    rows = Delivery.objects.filter(pk__in=[d.pk for d in held])
    assert set(rows.values_list("status", "attempts")) == {(Status.QUEUED, 0)}
    assert not Attempt.objects.exists()
    run("outbox_resume", "--domain", "hold.example")
    wait_until(lambda: sent(held) == 3, timeout=10)
    assert set(Delivery.objects.values_list("attempts", flat=True)) == {1}


def test_a_pause_survives_redis_losing_it(outbox_mail, queue, running):
    run("outbox_pause")
    worker = running()
    wait_until(lambda: worker.control.current.paused, timeout=5)
    queue.redis.flushdb()  # a restart without persistence, while paused
    assert not control.state(queue).known
    # Redis lost everything, the worker's registration too until its next heartbeat:
    # never "running", whichever of the two the status sees first.
    text = render(collect())
    assert "Sending: no worker yet" in text or "Sending: UNKNOWN" in text
    # New mail is pushed to Redis; the worker claims it before it has seen the
    # switches again, and must give it back rather than send it.
    rows = enqueue_email("s", "b", None, ["a@example.com", "b@example.com"])
    state = wait_until(lambda: (s := control.state(queue)).lost_at is not None and s, timeout=10)
    assert state.paused
    assert "Redis lost the switches" in render(collect())
    wait_until(lambda: sum(queue.ready_lengths().values()) >= 2, timeout=10)
    assert outbox_mail == []
    assert sent(rows) == 0
    run("outbox_resume")
    wait_until(lambda: sent(rows) == 2, timeout=10)
    assert control.state(queue).lost_at is None


# -- a mailer paused because its ESP refused the credential ----------------------------


def test_a_refused_mailer_pauses_alone_each_pause_in_a_row_twice_as_long(queue, settings):
    settings.OUTBOX = {**settings.OUTBOX, "MAILER_PAUSE": (30.0, 100.0)}
    state, began = control.refuse("bulk", "Postmark refused its credential (HTTP 401: x)", queue)
    paused = state.paused_mailers["bulk"]
    assert began and paused.count == 1 and paused.until - paused.since == pytest.approx(30)
    assert paused.why == "Postmark refused its credential (HTTP 401: x)"
    now = paused.since
    # Only that mailer's rows are held, until the pause ends; the default mailer's go.
    assert control.hold_until(state, "example.com", now, "bulk") == paused.until
    assert control.hold_until(state, "example.com", now, "") is None
    # Another thread or worker meeting the same refusal joins the running pause.
    state, began = control.refuse("bulk", "again", queue)
    assert not began and state.paused_mailers["bulk"] == paused
    # The pause ended and the credential was refused again: twice as long, then the cap.
    for count, seconds in ((2, 60), (3, 100), (4, 100)):
        fields = {"refused:bulk": f"{now:.6f} {count - 1} {now - 1:.6f} before"}
        queue.redis.hset(queue.control_key, mapping=fields)
        state, began = control.refuse("bulk", "refused", queue)
        paused = state.paused_mailers["bulk"]
        assert began and paused.count == count
        assert paused.until - paused.since == pytest.approx(seconds)
    # The pause stays visible after its end, until a send through the mailer succeeds.
    state, forgot = control.accepted("bulk", queue)
    assert forgot and state.paused_mailers == {}
    assert control.accepted("bulk", queue) == (state, False)


def test_resume_of_one_mailer_leaves_every_other_switch(queue, settings):
    """A fixed key for one mailer: the global pause, a domain and the other mailer stay."""
    bulk = "django.core.mail.backends.locmem.EmailBackend"
    if hasattr(settings, "MAILERS"):  # Django 6.1 (tests/settings.py)
        settings.MAILERS = {**settings.MAILERS, "bulk": {"BACKEND": bulk}}
    else:
        settings.OUTBOX = {**settings.OUTBOX, "BACKENDS": {"bulk": bulk}}
    control.refuse("", "Postmark refused its credential (HTTP 401: x)", queue)
    control.refuse("bulk", "Mailgun refused its credential (HTTP 401: y)", queue)
    run("outbox_pause")
    run("outbox_pause", "--domain", "gmail.com")
    assert run("outbox_resume", "--mailer", "bulk") == "Resumed mailer 'bulk'.\n"
    state = control.state(queue)
    assert set(state.paused_mailers) == {""}
    assert state.paused and set(state.paused_domains) == {"gmail.com"}
    assert run("outbox_resume", "--mailer", "bulk") == "Mailer 'bulk' was not paused.\n"
    assert run("outbox_resume", "--mailer", "") == "Resumed the default mailer.\n"
    assert control.state(queue).paused_mailers == {} and control.state(queue).paused
    with pytest.raises(CommandError, match=r"no mailer 'nope' is configured \(known: '', 'bulk'"):
        run("outbox_resume", "--mailer", "nope")
    with pytest.raises(CommandError, match="not allowed with argument"):
        run("outbox_resume", "--mailer", "bulk", "--domain", "gmail.com")


def test_resume_forgets_the_mailers_pauses_and_status_says_why(queue):
    control.refuse("", "Postmark refused its credential (HTTP 401: no valid Server token)", queue)
    control.refuse("bulk", "its backend cannot be used: missing MAILGUN_API_KEY", queue)
    text = run("outbox_status")
    assert re.search(r"the default mailer: PAUSED for \d+s more \(1 in a row\): Postmark", text)
    assert re.search(r"mailer 'bulk': PAUSED for \d+s more \(1 in a row\): its backend", text)
    snapshot = collect()
    assert set(snapshot["redis"]["control"]["paused_mailers"]) == {"", "bulk"}
    run("outbox_resume")
    assert control.state(queue).paused_mailers == {}
    assert "PAUSED" not in render(collect())
