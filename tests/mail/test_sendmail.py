"""SendmailBackend against a real executable: tests/bin/fake_sendmail.

The fake records its argv and standard input as one JSON line per invocation
and exits with the status it is told to (see its docstring); the backend runs
it with no shell, passing the test's environment through.
"""

from __future__ import annotations

import email
import email.policy
import json
import os
import signal
import stat
import sys
import time
from dataclasses import dataclass
from email.message import EmailMessage as ParsedMessage
from pathlib import Path
from typing import Any

import pytest

from outbox import enqueue_email
from outbox.exceptions import AmbiguousDeliveryError, DeliveryError
from outbox.mail.failures import FailureKind, classify, is_permanent
from outbox.mail.sendmail import SendmailBackend
from outbox.mail.targets import get_delivery_connection
from outbox.models import Attempt, Delivery
from tests.paths import ROOT
from tests.servers import sample_message as message

FAKE_SENDMAIL = ROOT / "tests" / "bin" / "fake_sendmail"
EX_NOUSER = 67
EX_TEMPFAIL = 75


@dataclass
class FakeSendmail:
    path: str
    log: Path

    def calls(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text("utf-8").splitlines()]


def parse(call: dict[str, Any]) -> ParsedMessage:
    parsed = email.message_from_string(call["message"], policy=email.policy.default)
    assert isinstance(parsed, ParsedMessage)
    return parsed


@pytest.fixture
def fake_sendmail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSendmail:
    assert os.access(FAKE_SENDMAIL, os.X_OK), f"{FAKE_SENDMAIL} must be executable"
    log = tmp_path / "sendmail.jsonl"
    monkeypatch.setenv("FAKE_SENDMAIL_LOG", str(log))
    for name in (
        "FAKE_SENDMAIL_EXIT",
        "FAKE_SENDMAIL_STDERR",
        "FAKE_SENDMAIL_HANG",
        "FAKE_SENDMAIL_HANG_BEFORE_READ",
        "FAKE_SENDMAIL_SIGNAL",
    ):
        monkeypatch.delenv(name, raising=False)
    # `#!/usr/bin/env python3` then finds this interpreter, not a pyenv shim
    # (a bash script): nothing between the backend and the fake is a shell.
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return FakeSendmail(str(FAKE_SENDMAIL), log)


# -- the backend on its own ------------------------------------------------------


def test_pipes_the_message_to_sendmail_with_the_envelope_on_the_command_line(fake_sendmail):
    msg = message(cc=["c@example.com"], bcc=["d@example.com"])
    sent = SendmailBackend(sendmail_path=fake_sendmail.path).send_messages([msg])

    assert sent == 1
    [call] = fake_sendmail.calls()
    assert call["argv"] == [
        fake_sendmail.path,
        "-oi",
        "-f",
        "shop@example.com",
        "--",
        "a@example.com",
        "c@example.com",
        "d@example.com",
    ]
    assert call["recipients"] == ["a@example.com", "c@example.com", "d@example.com"]
    parsed = parse(call)
    assert parsed["Subject"] == "Your receipt"
    assert parsed["From"] == "shop@example.com"
    assert parsed["To"] == "a@example.com"
    assert parsed["Cc"] == "c@example.com"
    assert parsed["Bcc"] is None  # Bcc is envelope only
    assert parsed.get_content() == "Thanks for your order.\n"


def test_one_invocation_per_message(fake_sendmail):
    messages = [message(to=["a@example.com"]), message(to=["b@example.com"], subject="Second")]
    assert SendmailBackend(sendmail_path=fake_sendmail.path).send_messages(messages) == 2
    calls = fake_sendmail.calls()
    assert [c["recipients"] for c in calls] == [["a@example.com"], ["b@example.com"]]
    assert [parse(c)["Subject"] for c in calls] == ["Your receipt", "Second"]


def test_a_message_without_recipients_is_not_sent(fake_sendmail):
    assert SendmailBackend(sendmail_path=fake_sendmail.path).send_messages([message(to=[])]) == 0
    assert fake_sendmail.calls() == []


def test_default_path_comes_from_the_outbox_settings(fake_sendmail, settings):
    settings.OUTBOX = {**settings.OUTBOX, "SENDMAIL_PATH": fake_sendmail.path}
    assert SendmailBackend().send_messages([message()]) == 1
    assert fake_sendmail.calls()[0]["argv"][0] == fake_sendmail.path


@pytest.mark.parametrize("recipient", ["-oQ/tmp@example.com", '"-oQ/tmp"@example.com'])
def test_a_recipient_that_looks_like_an_option_stays_a_recipient(fake_sendmail, recipient):
    sent = SendmailBackend(sendmail_path=fake_sendmail.path).send_messages(
        [message(to=[recipient])]
    )

    assert sent == 1
    [call] = fake_sendmail.calls()
    assert call["argv"][-2] == "--"
    assert call["argv"][-1].lstrip('"').startswith("-oQ/tmp")
    assert call["options"] == ["-oi", "-f", "shop@example.com"]
    assert call["recipients"] == [call["argv"][-1]]


def test_shell_metacharacters_arrive_literally_and_run_nothing(fake_sendmail, tmp_path):
    marker = tmp_path / "pwned"
    subject = f"$(touch {marker}); `id`"
    body = f"; touch {marker} && echo $HOME | id\n"
    msg = message(subject=subject, body=body, to=["a@example.com"])

    assert SendmailBackend(sendmail_path=fake_sendmail.path).send_messages([msg]) == 1

    [call] = fake_sendmail.calls()
    parsed = parse(call)
    assert parsed["Subject"] == subject
    assert parsed.get_content() == body
    assert "uid=" not in call["message"]
    assert not marker.exists()


def test_display_names_stay_out_of_the_envelope(fake_sendmail):
    # The envelope is addr-specs only, as smtplib's quoteaddr() makes it for SMTP;
    # e.g. BusyBox sendmail puts the -f value verbatim into MAIL FROM:<...>.
    msg = message(from_email="Shop <shop@example.com>", to=["Bob <b@example.com>"])
    assert SendmailBackend(sendmail_path=fake_sendmail.path).send_messages([msg]) == 1

    [call] = fake_sendmail.calls()
    assert call["argv"][1:] == ["-oi", "-f", "shop@example.com", "--", "b@example.com"]
    parsed = parse(call)
    assert parsed["From"] == "Shop <shop@example.com>"
    assert parsed["To"] == "Bob <b@example.com>"


# -- failures ----------------------------------------------------------------------


def test_ex_tempfail_is_a_transient_error_carrying_stderr(fake_sendmail, monkeypatch):
    monkeypatch.setenv("FAKE_SENDMAIL_EXIT", str(EX_TEMPFAIL))
    monkeypatch.setenv("FAKE_SENDMAIL_STDERR", "451 4.3.0 mail queue is full\n")

    with pytest.raises(DeliveryError) as info:
        SendmailBackend(sendmail_path=fake_sendmail.path).send_messages([message()])

    assert info.value.permanent is False
    assert not is_permanent(info.value)
    assert "451 4.3.0 mail queue is full" in str(info.value)
    assert "75" in str(info.value)
    assert len(fake_sendmail.calls()) == 1


def test_ex_nouser_is_a_permanent_error_carrying_stderr(fake_sendmail, monkeypatch):
    monkeypatch.setenv("FAKE_SENDMAIL_EXIT", str(EX_NOUSER))
    monkeypatch.setenv("FAKE_SENDMAIL_STDERR", "a@example.com... User unknown\n")

    with pytest.raises(DeliveryError) as info:
        SendmailBackend(sendmail_path=fake_sendmail.path).send_messages([message()])

    assert info.value.permanent is True
    assert is_permanent(info.value)
    assert "a@example.com... User unknown" in str(info.value)
    assert "67" in str(info.value)


@pytest.mark.parametrize("status", [EX_TEMPFAIL, EX_NOUSER])
def test_fail_silently_returns_zero(fake_sendmail, monkeypatch, status):
    monkeypatch.setenv("FAKE_SENDMAIL_EXIT", str(status))
    monkeypatch.setenv("FAKE_SENDMAIL_STDERR", "refused")
    backend = SendmailBackend(sendmail_path=fake_sendmail.path, fail_silently=True)

    assert backend.send_messages([message(), message(to=["b@example.com"])]) == 0
    assert len(fake_sendmail.calls()) == 2  # a failure does not stop the batch


def test_a_missing_binary_is_a_transient_error(tmp_path):
    missing = tmp_path / "no" / "sendmail"

    with pytest.raises(DeliveryError) as info:
        SendmailBackend(sendmail_path=str(missing)).send_messages([message()])

    assert info.value.permanent is False
    assert not is_permanent(info.value)
    assert str(missing) in str(info.value)


def test_a_binary_that_cannot_be_executed_is_a_transient_error(tmp_path):
    script = tmp_path / "sendmail"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(stat.S_IRUSR | stat.S_IWUSR)
    if os.access(script, os.X_OK):
        pytest.skip("running as a user that may execute anything")

    with pytest.raises(DeliveryError) as info:
        SendmailBackend(sendmail_path=str(script)).send_messages([message()])

    assert info.value.permanent is False


def test_ex_tempfail_and_other_statuses_are_classified_as_before(fake_sendmail, monkeypatch):
    backend = SendmailBackend(sendmail_path=fake_sendmail.path)
    for status, kind in ((EX_TEMPFAIL, FailureKind.TRANSIENT), (EX_NOUSER, FailureKind.PERMANENT)):
        monkeypatch.setenv("FAKE_SENDMAIL_EXIT", str(status))
        with pytest.raises(DeliveryError) as info:
            backend.send_messages([message()])
        assert not isinstance(info.value, AmbiguousDeliveryError)
        assert classify(info.value) is kind


# -- time limit and messages in doubt ---------------------------------------------


def test_a_sendmail_that_hangs_after_reading_the_message_is_killed_and_in_doubt(
    fake_sendmail, monkeypatch
):
    monkeypatch.setenv("FAKE_SENDMAIL_HANG", "1")
    # Long enough for its Python to start and log the message, on a busy machine too.
    backend = SendmailBackend(sendmail_path=fake_sendmail.path, timeout=2.0)
    msg = message(headers={"Message-ID": "<hang-1@example.com>"})

    started = time.monotonic()
    with pytest.raises(AmbiguousDeliveryError) as info:
        backend.send_messages([msg])

    assert time.monotonic() - started < 5
    assert "timed out" in str(info.value)
    assert "<hang-1@example.com>" in str(info.value)
    assert classify(info.value) is FailureKind.AMBIGUOUS
    assert info.value.permanent is False
    assert len(fake_sendmail.calls()) == 1  # it had read the message before hanging


def test_a_sendmail_killed_by_a_signal_after_reading_the_message_is_in_doubt(
    fake_sendmail, monkeypatch
):
    monkeypatch.setenv("FAKE_SENDMAIL_SIGNAL", str(int(signal.SIGKILL)))
    backend = SendmailBackend(sendmail_path=fake_sendmail.path)

    with pytest.raises(AmbiguousDeliveryError) as info:
        backend.send_messages([message(headers={"Message-ID": "<killed-1@example.com>"})])

    assert f"signal {int(signal.SIGKILL)}" in str(info.value)
    assert "<killed-1@example.com>" in str(info.value)
    assert classify(info.value) is FailureKind.AMBIGUOUS
    assert len(fake_sendmail.calls()) == 1


def test_a_sendmail_that_never_reads_the_message_times_out_as_a_transient_error(
    fake_sendmail, monkeypatch
):
    # Bigger than any pipe buffer: the write cannot complete while nobody reads.
    monkeypatch.setenv("FAKE_SENDMAIL_HANG_BEFORE_READ", "1")
    backend = SendmailBackend(sendmail_path=fake_sendmail.path, timeout=0.5)
    big = message(body=("x" * 76 + "\n") * 40_000)  # about 3 MB

    started = time.monotonic()
    with pytest.raises(DeliveryError) as info:
        backend.send_messages([big])

    assert time.monotonic() - started < 5
    assert not isinstance(info.value, AmbiguousDeliveryError)
    assert "timed out" in str(info.value)
    assert classify(info.value) is FailureKind.TRANSIENT
    assert fake_sendmail.calls() == []  # it never got the message


def test_the_worker_s_sendmail_is_bounded_by_send_timeout(fake_sendmail, settings, monkeypatch):
    # No timeout of its own: OUTBOX["SEND_TIMEOUT"] applies.
    monkeypatch.setenv("FAKE_SENDMAIL_HANG", "1")
    settings.OUTBOX = {
        **settings.OUTBOX,
        "EMAIL_BACKEND": "outbox.backends.SendmailBackend",
        "SENDMAIL_PATH": fake_sendmail.path,
        "SEND_TIMEOUT": 1.0,
    }
    settings.OUTBOX.pop("MAILER", None)
    backend = get_delivery_connection()

    started = time.monotonic()
    with pytest.raises(AmbiguousDeliveryError):
        backend.send_messages([message()])

    assert 0.9 <= time.monotonic() - started < 5


# -- through the worker ------------------------------------------------------------


@pytest.fixture
def sendmail_outbox(settings, fake_sendmail: FakeSendmail) -> FakeSendmail:
    settings.OUTBOX = {
        **settings.OUTBOX,
        "EMAIL_BACKEND": "outbox.backends.SendmailBackend",
        "SENDMAIL_PATH": fake_sendmail.path,
        # A retried row is not due again within this test's burst run.
        "RETRY_BACKOFF": (60.0, 60.0),
    }
    return fake_sendmail


def run_worker() -> None:
    # Imported here: the backend tests above do not need the worker.
    from outbox.worker import Worker

    Worker(burst=True).run(install_signal_handlers=False)


@pytest.mark.django_db(transaction=True)
def test_worker_pipes_each_recipient_its_own_copy(sendmail_outbox):
    deliveries = enqueue_email("Hi", "Body", "shop@example.com", ["a@example.com", "b@example.com"])

    run_worker()

    calls = sendmail_outbox.calls()
    assert sorted(c["recipients"] for c in calls) == [["a@example.com"], ["b@example.com"]]
    by_recipient = {c["recipients"][0]: c for c in calls}
    for delivery in deliveries:
        delivery.refresh_from_db()
        call = by_recipient[delivery.recipient]
        assert call["argv"] == [
            sendmail_outbox.path,
            "-oi",
            "-f",
            "shop@example.com",
            "--",
            delivery.recipient,
        ]
        parsed = parse(call)
        assert parsed["Message-ID"] == delivery.message_id
        assert parsed["To"] == delivery.recipient
        assert parsed["Subject"] == "Hi"
        assert parsed.get_content().rstrip("\n") == "Body"
        assert delivery.status == Delivery.Status.SENT
        assert delivery.attempts == 1
        assert delivery.sent_at is not None
        assert delivery.last_error == ""
        assert not delivery.attempt_log.exists()  # a success is recorded on the row
    assert deliveries[0].message_id != deliveries[1].message_id


@pytest.mark.django_db(transaction=True)
def test_worker_requeues_on_ex_tempfail(sendmail_outbox, monkeypatch):
    monkeypatch.setenv("FAKE_SENDMAIL_EXIT", str(EX_TEMPFAIL))
    monkeypatch.setenv("FAKE_SENDMAIL_STDERR", "451 4.3.0 mail queue is full")
    [delivery] = enqueue_email("Hi", "Body", "shop@example.com", ["a@example.com"])

    run_worker()

    delivery.refresh_from_db()
    assert delivery.status == Delivery.Status.QUEUED
    assert delivery.attempts == 1
    assert "451 4.3.0 mail queue is full" in delivery.last_error
    assert delivery.claim_token is None
    assert delivery.not_before > delivery.created_at
    [attempt] = delivery.attempt_log.all()
    assert attempt.outcome == Attempt.Outcome.RETRY
    assert "451 4.3.0 mail queue is full" in attempt.error
    assert attempt.finished_at is not None
    assert len(sendmail_outbox.calls()) == 1


@pytest.mark.django_db(transaction=True)
def test_worker_fails_on_ex_nouser_without_retrying(sendmail_outbox, monkeypatch):
    monkeypatch.setenv("FAKE_SENDMAIL_EXIT", str(EX_NOUSER))
    monkeypatch.setenv("FAKE_SENDMAIL_STDERR", "a@example.com... User unknown")
    [delivery] = enqueue_email("Hi", "Body", "shop@example.com", ["a@example.com"])

    run_worker()

    delivery.refresh_from_db()
    assert delivery.status == Delivery.Status.FAILED
    assert delivery.attempts == 1
    assert "User unknown" in delivery.last_error
    assert [a.outcome for a in delivery.attempt_log.all()] == [Attempt.Outcome.FAILED]
    assert len(sendmail_outbox.calls()) == 1


@pytest.mark.django_db(transaction=True)
def test_worker_gives_up_after_max_attempts_of_ex_tempfail(sendmail_outbox, settings, monkeypatch):
    # No backoff: each retry is due at once, so one burst run makes every attempt.
    settings.OUTBOX = {**settings.OUTBOX, "RETRY_BACKOFF": (0.0, 0.0)}
    monkeypatch.setenv("FAKE_SENDMAIL_EXIT", str(EX_TEMPFAIL))
    monkeypatch.setenv("FAKE_SENDMAIL_STDERR", "451 try later")
    [delivery] = enqueue_email("Hi", "Body", "shop@example.com", ["a@example.com"], max_attempts=3)

    run_worker()

    delivery.refresh_from_db()
    assert delivery.status == Delivery.Status.FAILED
    assert delivery.attempts == 3
    assert "451 try later" in delivery.last_error
    outcomes = [a.outcome for a in delivery.attempt_log.all()]
    assert outcomes == [Attempt.Outcome.RETRY, Attempt.Outcome.RETRY, Attempt.Outcome.FAILED]
    assert len(sendmail_outbox.calls()) == 3
