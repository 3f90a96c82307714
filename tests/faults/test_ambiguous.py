"""Ambiguous outcomes: the message was handed over, then the connection broke.

A server that records the message and then cuts the connection instead of
replying to the final dot may well deliver it. Such an attempt is in doubt:
:func:`outbox.mail.failures.classify` says AMBIGUOUS, and the worker handles it like
a crash in the send window (``ABANDONED_POLICY``). Failures before the body was
complete keep their meaning.

The first sections are unit tests of outbox/mail/failures.py and
:func:`outbox.backends.watch_handover` with Django's stock SMTP backend against
real aiosmtpd servers on loopback. The last section runs the worker end to end;
it needs the worker to call ``watch_handover()`` after ``backend.open()`` and to
settle with ``classify()``.
"""

from __future__ import annotations

import io
import smtplib
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.mail import EmailMessage
from django.core.management import call_command

from outbox import enqueue_email
from outbox.exceptions import AmbiguousDeliveryError, DeliveryError, OutboxError
from outbox.mail.connection import Server
from outbox.mail.failures import FailureKind, classify, is_ambiguous, is_permanent
from outbox.mail.handover import handover_server, server_of, watch_handover
from outbox.mail.targets import get_delivery_connection
from outbox.models import Attempt, Delivery
from tests.delivery import use_smtp
from tests.servers import SMTPRecorder, free_port
from tests.servers import sample_message as message

Status = Delivery.Status


@pytest.fixture(params=[False, True], ids=["one-at-a-time", "pipelined"])
def cutting_server(request) -> Iterator[SMTPRecorder]:
    """Records each message, then closes the connection instead of replying to the dot;
    once offering PIPELINING (the worker then writes MAIL, RCPT and DATA at once)."""
    server = SMTPRecorder(after_data="cut", pipelining=request.param).start()
    yield server
    server.stop()


def watched_smtp(settings, port: int) -> Any:
    """The worker's delivery backend (Django's SMTP backend), opened and watched."""
    use_smtp(settings, port, SEND_TIMEOUT=5.0)
    backend = get_delivery_connection()
    assert backend.open()
    watch_handover(backend)
    return backend


def send_error(backend: Any, msg: EmailMessage) -> BaseException:
    with pytest.raises(Exception) as info:
        backend.send_messages([msg])
    backend.close()
    return info.value


# -- the exception and classify() ---------------------------------------------------


def test_ambiguous_delivery_error_is_a_delivery_error_a_backend_can_raise():
    exc = AmbiguousDeliveryError("no reply", message_id="<m1@example.com>")
    assert isinstance(exc, DeliveryError) and isinstance(exc, OutboxError)
    assert exc.permanent is False
    assert exc.message_id == "<m1@example.com>"
    assert "<m1@example.com>" in str(exc)
    assert classify(exc) is FailureKind.AMBIGUOUS
    # DeliveryError keeps its signature.
    assert DeliveryError("x", permanent=True).permanent is True


def test_ambiguity_is_found_through_cause_and_context():
    try:
        try:
            raise AmbiguousDeliveryError("no reply")
        except AmbiguousDeliveryError as inner:
            raise RuntimeError("wrapped by a backend") from inner
    except RuntimeError as exc:
        caused = exc
    try:
        try:
            raise AmbiguousDeliveryError("no reply")
        except AmbiguousDeliveryError:
            raise OSError("closing the broken connection failed")  # noqa: B904
    except OSError as exc:
        during = exc
    assert classify(caused) is FailureKind.AMBIGUOUS
    assert classify(during) is FailureKind.AMBIGUOUS
    assert is_ambiguous(caused) and is_ambiguous(during)


def test_a_cyclic_exception_chain_terminates():
    first, second = ValueError("a"), OSError("b")
    first.__context__, second.__context__ = second, first
    assert classify(first) is FailureKind.PERMANENT  # ValueError: as is_permanent says
    assert classify(second) is FailureKind.TRANSIENT


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (smtplib.SMTPRecipientsRefused({"a": (550, b"no")}), FailureKind.PERMANENT),
        (smtplib.SMTPRecipientsRefused({"a": (451, b"later")}), FailureKind.TRANSIENT),
        (smtplib.SMTPSenderRefused(553, b"no", "s"), FailureKind.PERMANENT),
        (smtplib.SMTPDataError(554, b"rejected"), FailureKind.PERMANENT),
        (smtplib.SMTPDataError(421, b"busy"), FailureKind.TRANSIENT),
        (smtplib.SMTPAuthenticationError(535, b"bad auth"), FailureKind.TRANSIENT),
        (smtplib.SMTPServerDisconnected("gone"), FailureKind.TRANSIENT),
        (ConnectionRefusedError(), FailureKind.TRANSIENT),
        (TimeoutError(), FailureKind.TRANSIENT),
        (ValueError("Invalid address"), FailureKind.PERMANENT),
        (DeliveryError("x", permanent=True), FailureKind.PERMANENT),
        (DeliveryError("x"), FailureKind.TRANSIENT),
    ],
)
def test_everything_else_is_classified_as_is_permanent_says(exc, kind):
    assert classify(exc) is kind
    assert is_permanent(exc) is (kind is FailureKind.PERMANENT)


# -- Django's SMTP backend against real servers ---------------------------------------


def test_a_cut_after_the_final_dot_is_ambiguous(settings, cutting_server):
    backend = watched_smtp(settings, cutting_server.port)
    msg = message(headers={"Message-ID": "<cut-1@example.com>"})

    error = send_error(backend, msg)

    assert cutting_server.count() == 1  # the server has it
    assert isinstance(error, AmbiguousDeliveryError)
    assert classify(error) is FailureKind.AMBIGUOUS
    assert "<cut-1@example.com>" in str(error)
    # The original error is kept as the cause.
    assert isinstance(error.__cause__, smtplib.SMTPServerDisconnected)


def test_a_watched_connection_still_sends_several_messages(settings, smtp_server):
    backend = watched_smtp(settings, smtp_server.port)
    watch_handover(backend)  # a second call changes nothing
    assert backend.send_messages([message(), message(to=["b@example.com"])]) == 2
    assert backend.send_messages([message(to=["c@example.com"])]) == 1
    backend.close()
    assert [r.rcpt_tos for r in smtp_server.received] == [
        ["a@example.com"],
        ["b@example.com"],
        ["c@example.com"],
    ]


def test_watch_handover_leaves_other_backends_alone(settings):
    settings.OUTBOX = {
        **settings.OUTBOX,
        "EMAIL_BACKEND": "django.core.mail.backends.locmem.EmailBackend",
    }
    settings.OUTBOX.pop("MAILER", None)
    backend = get_delivery_connection()
    before = dict(vars(backend))
    watch_handover(backend)
    assert vars(backend) == before


def test_a_connection_refused_is_transient(settings):
    use_smtp(settings, free_port(), SEND_TIMEOUT=5.0)
    backend = get_delivery_connection()
    with pytest.raises(OSError) as info:
        backend.open()
    assert classify(info.value) is FailureKind.TRANSIENT


@pytest.mark.parametrize(
    ("reply", "kind"),
    [
        ("550 5.1.1 no such user", FailureKind.PERMANENT),
        ("451 4.3.0 try later", FailureKind.TRANSIENT),
    ],
)
def test_a_refusal_at_rcpt_keeps_its_meaning(settings, reply, kind):
    server = SMTPRecorder(refuse={"a@example.com": reply}, after_data="cut").start()
    try:
        backend = watched_smtp(settings, server.port)
        error = send_error(backend, message())
    finally:
        server.stop()
    assert isinstance(error, smtplib.SMTPRecipientsRefused)
    assert classify(error) is kind
    assert server.count() == 0


@pytest.mark.parametrize(
    ("reply", "kind"),
    [
        ("554 5.7.1 rejected as spam", FailureKind.PERMANENT),
        ("451 4.7.1 greylisted", FailureKind.TRANSIENT),
    ],
)
def test_a_refusal_of_the_final_dot_is_a_clear_answer(settings, reply, kind):
    server = SMTPRecorder(data_reply=reply).start()
    try:
        backend = watched_smtp(settings, server.port)
        error = send_error(backend, message())
    finally:
        server.stop()
    assert isinstance(error, smtplib.SMTPDataError)
    assert classify(error) is kind


# -- end to end through the worker ------------------------------------------------------
#
# NEEDS THE WORKER WIRING: these pass only once the worker calls
# outbox.backends.watch_handover(backend) after every successful backend.open(),
# settles with outbox.mail.failures.classify(), and writes an AMBIGUOUS attempt as
# described in the protocol (a connection cut after the final dot).


def run_worker() -> None:
    from outbox.worker import Worker

    Worker(burst=True).run(install_signal_handlers=False)


@pytest.mark.django_db(transaction=True)
def test_worker_abandons_an_ambiguous_send_under_review(settings, cutting_server):
    use_smtp(
        settings,
        cutting_server.port,
        SEND_TIMEOUT=5.0,
        ABANDONED_POLICY="review",
        RETRY_BACKOFF=(0.0, 0.0),  # a retry, if there were one, would be due at once
    )
    [delivery] = enqueue_email("Hi", "Body", "shop@example.com", ["a@example.com"])

    run_worker()

    delivery.refresh_from_db()
    assert delivery.status == Status.ABANDONED
    assert delivery.attempts == 1
    [attempt] = delivery.attempt_log.all()
    assert attempt.outcome == Attempt.Outcome.AMBIGUOUS
    assert delivery.message_id in attempt.error
    assert cutting_server.by_message_id() == {delivery.message_id: 1}
    # The attempt names where it went; the row does only for a reconciler (none here).
    assert attempt.server_address == f"127.0.0.1:{cutting_server.port}" and attempt.server_host
    assert (delivery.server_host, delivery.server_address) == ("", "")

    # Nothing resends it: not another worker run, not a sweep.
    call_command("outbox_sweep", "--full-mirror-check", stdout=io.StringIO())
    run_worker()
    call_command("outbox_sweep", "--full-mirror-check", stdout=io.StringIO())

    delivery.refresh_from_db()
    assert delivery.status == Status.ABANDONED
    assert cutting_server.by_message_id() == {delivery.message_id: 1}


@pytest.mark.django_db(transaction=True)
def test_worker_abandons_a_send_whose_reply_never_comes_under_review(settings):
    server = SMTPRecorder(after_data="stall").start()
    try:
        use_smtp(settings, server.port, SEND_TIMEOUT=1.0, ABANDONED_POLICY="review")
        [delivery] = enqueue_email("Hi", "Body", "shop@example.com", ["a@example.com"])

        run_worker()

        delivery.refresh_from_db()
        assert delivery.status == Status.ABANDONED
        [attempt] = delivery.attempt_log.all()
        assert attempt.outcome == Attempt.Outcome.AMBIGUOUS
        assert delivery.message_id in attempt.error
        assert server.count() == 1
    finally:
        server.stop()


@pytest.mark.django_db(transaction=True)
def test_worker_retries_an_ambiguous_send_under_requeue(settings, cutting_server):
    use_smtp(
        settings,
        cutting_server.port,
        SEND_TIMEOUT=5.0,
        ABANDONED_POLICY="requeue",
        RETRY_BACKOFF=(60.0, 60.0),  # not due again within this burst run
    )
    [delivery] = enqueue_email("Hi", "Body", "shop@example.com", ["a@example.com"])

    run_worker()

    delivery.refresh_from_db()
    assert delivery.status == Status.QUEUED
    assert delivery.attempts == 1
    assert delivery.not_before > delivery.created_at
    assert delivery.claim_token is None
    [attempt] = delivery.attempt_log.all()
    assert delivery.message_id in attempt.error
    assert cutting_server.by_message_id() == {delivery.message_id: 1}


@pytest.mark.django_db(transaction=True)
def test_a_refusal_at_rcpt_is_still_retried_or_failed_by_the_worker(settings):
    server = SMTPRecorder(
        refuse={"a@example.com": "550 5.1.1 no such user", "b@example.com": "451 4.3.0 later"},
        after_data="cut",
    ).start()
    try:
        use_smtp(
            settings,
            server.port,
            SEND_TIMEOUT=5.0,
            ABANDONED_POLICY="review",
            RETRY_BACKOFF=(60.0, 60.0),
        )
        rows = enqueue_email("Hi", "Body", "shop@example.com", ["a@example.com", "b@example.com"])

        run_worker()

        status = {}
        for row in rows:
            row.refresh_from_db()
            status[row.recipient] = row.status
        assert status == {"a@example.com": Status.FAILED, "b@example.com": Status.QUEUED}
        assert server.count() == 0
    finally:
        server.stop()


# -- where the message went -------------------------------------------------------


@pytest.fixture
def relay_a() -> Iterator[SMTPRecorder]:
    server = SMTPRecorder(greeting_host="relay-a.test").start()
    yield server
    server.stop()


def test_a_watched_connection_names_the_server_of_its_greeting(settings, relay_a):
    backend = watched_smtp(settings, relay_a.port)
    try:
        assert handover_server(backend) == Server("relay-a.test", f"127.0.0.1:{relay_a.port}")
    finally:
        backend.close()


def test_a_connection_opened_elsewhere_is_named_by_its_ehlo_reply(relay_a):
    """No greeting kept (a plain smtplib connection): the EHLO reply's host."""
    with smtplib.SMTP("127.0.0.1", relay_a.port, timeout=5) as client:
        client.ehlo()
        assert server_of(client) == Server("relay-a.test", f"127.0.0.1:{relay_a.port}")


def test_the_sendmail_backend_names_this_host():
    """The local MTA takes the message: its log is this host's."""
    from outbox.backends import SendmailBackend

    assert handover_server(SendmailBackend()) == Server(socket.gethostname())


def test_a_backend_without_an_smtp_connection_names_no_server():
    from django.core.mail.backends.locmem import EmailBackend

    assert handover_server(EmailBackend()) is None


@pytest.mark.django_db(transaction=True)
def test_with_a_reconciler_the_row_names_its_server_before_the_final_dot(
    settings, tmp_path, cutting_server
):
    """The worker writes the server on the row before the hand-over: it is there after a cut."""
    use_smtp(
        settings,
        cutting_server.port,
        SEND_TIMEOUT=5.0,
        ABANDONED_POLICY="review",
        RECONCILERS=["outbox.reconcilers.PostfixLogReconciler"],
        POSTFIX_LOG=str(tmp_path / "mail.log"),
    )
    [delivery] = enqueue_email("Hi", "Body", "shop@example.com", ["a@example.com"])

    run_worker()

    delivery.refresh_from_db()
    [attempt] = delivery.attempt_log.all()
    assert delivery.status == Status.ABANDONED and attempt.outcome == Attempt.Outcome.AMBIGUOUS
    assert delivery.server_address == f"127.0.0.1:{cutting_server.port}"
    assert (delivery.server_host, delivery.server_address) == (
        attempt.server_host,
        attempt.server_address,
    )
