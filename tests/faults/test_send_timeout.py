"""OUTBOX["SEND_TIMEOUT"]: no mail server can hold a send for longer than about that.

Unit level: the setting and its system check, how :func:`get_delivery_connection`
applies it, and Django's stock SMTP backend against real servers on loopback that
accept the connection and then say nothing (no greeting, or no reply after the
final dot). :class:`SendmailBackend`'s time limit is tested in tests/mail/test_sendmail.py.

Then a real SMTP server behind tests/proxy.py, which lets its replies through
one byte at a time: every wait is short, but the send as a whole must still end
within about SEND_TIMEOUT, classified as a timeout at that point would be; at
the backend, and through the worker.

A send that today's code would let hang forever runs in a helper thread
(:func:`bounded`), so that such a test fails after a few seconds instead of
hanging the suite; stopping the server afterwards frees the thread.
"""

from __future__ import annotations

import smtplib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.core.mail.backends import smtp

from outbox import enqueue_email
from outbox.conf import outbox_settings
from outbox.exceptions import AmbiguousDeliveryError
from outbox.mail.bounded import bound_send_time
from outbox.mail.failures import FailureKind, classify
from outbox.mail.handover import watch_handover
from outbox.mail.sendmail import SendmailBackend
from outbox.mail.targets import HAS_MAILERS, get_delivery_connection
from outbox.models import Attempt, Delivery
from tests.checking import outbox_checks
from tests.delivery import SMTP, use_outbox, use_smtp
from tests.proxy import FaultProxy
from tests.servers import SilentServer, SMTPRecorder
from tests.servers import sample_message as message

SEND_TIMEOUT = 1.0
# How long a send bounded by SEND_TIMEOUT may take in these tests: the limit
# plus room for a slow CI machine, far below "forever".
BOUND = SEND_TIMEOUT + 4.0


@dataclass
class Outcome:
    """What a call did in a helper thread: its result or exception, and how long it took."""

    result: Any = None
    error: BaseException | None = None
    elapsed: float = 0.0


def bounded(call: Callable[[], Any], limit: float = BOUND) -> Outcome:
    """Run ``call`` in a daemon thread; fail the test if it is not done within ``limit``."""
    outcome = Outcome()

    def run() -> None:
        started = time.monotonic()
        try:
            outcome.result = call()
        except BaseException as exc:  # reported to the test, not raised in the thread
            outcome.error = exc
        outcome.elapsed = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit)
    if thread.is_alive():
        pytest.fail(f"the send was still waiting after {limit:g}s")
    return outcome


@pytest.fixture
def silent_server() -> Iterator[SilentServer]:
    server = SilentServer().start()
    yield server
    server.stop()


@pytest.fixture
def stalling_server() -> Iterator[SMTPRecorder]:
    """Answers the greeting, MAIL, RCPT and DATA; never answers the final dot."""
    server = SMTPRecorder(after_data="stall").start()
    yield server
    server.stop()


# -- the setting and its check ------------------------------------------------------


def test_send_timeout_defaults_to_60_seconds(settings):
    settings.OUTBOX = {k: v for k, v in settings.OUTBOX.items() if k != "SEND_TIMEOUT"}
    assert outbox_settings.SEND_TIMEOUT == 60.0


def test_send_timeout_is_read_live_as_a_float(settings):
    settings.OUTBOX = {**settings.OUTBOX, "SEND_TIMEOUT": 5}
    assert outbox_settings.SEND_TIMEOUT == 5.0
    assert isinstance(outbox_settings.SEND_TIMEOUT, float)


@pytest.mark.parametrize("value", [0, -1, 0.0, "60", None, True, float("inf"), float("nan")])
def test_e009_send_timeout_must_be_a_positive_number(settings, value):
    settings.OUTBOX = {**settings.OUTBOX, "SEND_TIMEOUT": value}
    [error] = outbox_checks()
    assert error.id == "outbox.E009"
    assert "SEND_TIMEOUT" in error.msg


@pytest.mark.parametrize("value", [0.5, 1, 60, 600.0])
def test_a_positive_send_timeout_passes_the_checks(settings, value):
    settings.OUTBOX = {**settings.OUTBOX, "SEND_TIMEOUT": value}
    assert outbox_checks() == []


# -- get_delivery_connection() applies it ---------------------------------------------


def test_smtp_without_a_timeout_gets_send_timeout(settings):
    use_smtp(settings, 2525, SEND_TIMEOUT=7)
    backend = get_delivery_connection()
    assert backend.timeout == 7.0


def test_a_shorter_project_timeout_is_kept(settings):
    use_smtp(settings, 2525, timeout=3, SEND_TIMEOUT=7)
    assert get_delivery_connection().timeout == 3


def test_a_longer_project_timeout_is_lowered_to_send_timeout(settings):
    use_smtp(settings, 2525, timeout=300, SEND_TIMEOUT=7)
    assert get_delivery_connection().timeout == 7.0


def test_sendmail_backend_gets_send_timeout(settings):
    use_outbox(settings, "outbox.backends.SendmailBackend", SEND_TIMEOUT=7)
    backend = get_delivery_connection()
    assert isinstance(backend, SendmailBackend)
    assert backend.timeout == 7.0
    # Its own default, outside the worker, is the setting too.
    assert SendmailBackend().timeout == 7.0


class TimeoutOnlyInConstructor:
    """A third-party backend that takes ``timeout`` but keeps it somewhere else."""

    def __init__(self, timeout: float | None = None) -> None:
        self.client_options = {"timeout": timeout}


class NoTimeout:
    """A backend with no notion of a timeout."""

    def __init__(self) -> None:
        self.created = True


def test_a_backend_whose_constructor_takes_timeout_gets_it(settings):
    path = f"{__name__}.TimeoutOnlyInConstructor"
    settings.OUTBOX = {**settings.OUTBOX, "EMAIL_BACKEND": path, "SEND_TIMEOUT": 7}
    settings.OUTBOX.pop("MAILER", None)
    backend: Any = get_delivery_connection()
    assert backend.client_options == {"timeout": 7.0}


def test_a_backend_without_a_timeout_is_left_alone(settings):
    settings.OUTBOX = {**settings.OUTBOX, "EMAIL_BACKEND": f"{__name__}.NoTimeout"}
    settings.OUTBOX.pop("MAILER", None)
    backend: Any = get_delivery_connection()
    assert backend.created and not hasattr(backend, "timeout")


# -- a server that never answers ------------------------------------------------------


def test_a_server_that_never_greets_holds_open_for_at_most_send_timeout(settings, silent_server):
    use_smtp(settings, silent_server.port, SEND_TIMEOUT=SEND_TIMEOUT)
    backend = get_delivery_connection()

    outcome = bounded(backend.open)

    assert silent_server.connections() == 1
    assert outcome.error is not None, "open() succeeded against a server that never spoke"
    assert SEND_TIMEOUT * 0.9 <= outcome.elapsed < BOUND
    # Nothing was handed over: an ordinary transient failure, retried.
    assert classify(outcome.error) is FailureKind.TRANSIENT


def test_a_server_that_never_answers_the_final_dot_is_bounded_and_in_doubt(
    settings, stalling_server
):
    use_smtp(settings, stalling_server.port, SEND_TIMEOUT=SEND_TIMEOUT)
    backend = get_delivery_connection()
    backend.open()
    watch_handover(backend)
    message_id = "<stall-1@example.com>"

    outcome = bounded(lambda: backend.send_messages([message(headers={"Message-ID": message_id})]))

    assert outcome.error is not None, f"the send returned {outcome.result!r}"
    assert outcome.elapsed < BOUND
    # The server has the message; only its answer never came.
    assert stalling_server.count() == 1
    assert isinstance(outcome.error, AmbiguousDeliveryError)
    assert classify(outcome.error) is FailureKind.AMBIGUOUS
    assert message_id in str(outcome.error)
    backend.close()


# -- a server that trickles its replies: SEND_TIMEOUT bounds the whole send ------------

TRICKLE = 0.05  # seconds before each byte the proxy lets through from the server
END_OF_DATA = b"\r\n.\r\n"
# A trickled send ends within this (a worker run: with its start and stop). A limit
# on each wait instead lets it go on for as long as the server keeps trickling.
WHOLE = SEND_TIMEOUT + 1.5


@pytest.fixture
def trickled() -> Iterator[tuple[SMTPRecorder, FaultProxy]]:
    """A real SMTP server behind a proxy, for the test to make trickle."""
    server = SMTPRecorder().start()
    proxy = FaultProxy(server.port).start()
    yield server, proxy
    proxy.close()
    server.stop()


@pytest.mark.parametrize("after", [None, b"ehlo"], ids=["from-the-greeting", "from-ehlo"])
def test_a_trickling_server_gets_send_timeout_for_the_whole_send(settings, trickled, after):
    server, proxy = trickled
    use_smtp(settings, proxy.port, SEND_TIMEOUT=SEND_TIMEOUT)
    backend = get_delivery_connection()
    bound_send_time(backend)
    proxy.trickle(TRICKLE, after=after)

    def send() -> int:
        backend.open()
        watch_handover(backend)
        return backend.send_messages([message()])

    outcome = bounded(send, WHOLE)

    assert outcome.error is not None, f"the send returned {outcome.result!r}"
    assert SEND_TIMEOUT * 0.9 <= outcome.elapsed < WHOLE
    # Before the final dot: nothing was handed over, a plain retry.
    assert classify(outcome.error) is FailureKind.TRANSIENT
    assert server.count() == 0
    backend.close()


def test_a_trickled_reply_to_the_final_dot_is_in_doubt_after_send_timeout(settings, trickled):
    server, proxy = trickled
    use_smtp(settings, proxy.port, SEND_TIMEOUT=SEND_TIMEOUT)
    # As the worker does it: open, then watch (which bounds the sends from then on).
    backend = get_delivery_connection()
    backend.open()
    watch_handover(backend)
    proxy.trickle(TRICKLE, after=END_OF_DATA)
    message_id = "<trickle-1@example.com>"

    outcome = bounded(lambda: backend.send_messages([message(headers={"Message-ID": message_id})]))

    assert outcome.error is not None, f"the send returned {outcome.result!r}"
    assert SEND_TIMEOUT * 0.9 <= outcome.elapsed < WHOLE
    assert isinstance(outcome.error, AmbiguousDeliveryError)
    assert classify(outcome.error) is FailureKind.AMBIGUOUS
    assert message_id in str(outcome.error)
    assert server.count() == 1
    backend.close()


class CountingSMTP(smtplib.SMTP):
    """A project's own smtplib class, given by its backend's ``connection_class``."""

    made = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        CountingSMTP.made += 1
        super().__init__(*args, **kwargs)


class ProjectSMTPBackend(smtp.EmailBackend):
    """A project's subclass of Django's SMTP backend, with overrides of its own."""

    opened = 0

    @property
    def connection_class(self) -> Any:
        return CountingSMTP

    def open(self) -> bool | None:
        ProjectSMTPBackend.opened += 1
        return super().open()


def test_a_projects_smtp_backend_subclass_keeps_its_overrides_and_is_bounded(settings, trickled):
    server, proxy = trickled
    use_outbox(
        settings,
        "tests.faults.test_send_timeout.ProjectSMTPBackend",
        {"host": "127.0.0.1", "port": proxy.port},
        SEND_TIMEOUT=SEND_TIMEOUT,
    )
    backend = get_delivery_connection()
    assert isinstance(backend, ProjectSMTPBackend)
    assert type(backend).__name__ == "ProjectSMTPBackend"
    made, opened = CountingSMTP.made, ProjectSMTPBackend.opened
    backend.open()
    watch_handover(backend)
    assert isinstance(backend.connection, CountingSMTP)
    assert (CountingSMTP.made, ProjectSMTPBackend.opened) == (made + 1, opened + 1)
    proxy.trickle(TRICKLE, after=END_OF_DATA)

    outcome = bounded(lambda: backend.send_messages([message()]))

    # Bounded as a whole, and in doubt after the final dot, as Django's own class is.
    assert SEND_TIMEOUT * 0.9 <= outcome.elapsed < WHOLE
    assert isinstance(outcome.error, AmbiguousDeliveryError)
    assert server.count() == 1
    backend.close()


def test_a_bounded_backend_still_sends_and_closes_as_before(settings, smtp_server):
    use_smtp(settings, smtp_server.port, SEND_TIMEOUT=SEND_TIMEOUT)
    backend = get_delivery_connection()
    bound_send_time(backend)
    bound_send_time(backend)  # a second call changes nothing

    assert backend.send_messages([message()]) == 1  # opens and closes its own connection
    assert backend.open()
    watch_handover(backend)
    assert backend.send_messages([message(to=["b@example.com"])]) == 1
    backend.close()

    assert type(backend).__name__ == "EmailBackend"
    assert [r.rcpt_tos for r in smtp_server.received] == [["a@example.com"], ["b@example.com"]]


def add_mailer(settings, alias: str, port: int) -> None:
    entry = {"BACKEND": SMTP, "OPTIONS": {"host": "127.0.0.1", "port": port}}
    if HAS_MAILERS:
        settings.MAILERS = {**settings.MAILERS, alias: entry}
    else:
        settings.OUTBOX = {**settings.OUTBOX, "BACKENDS": {alias: entry}}


def run_worker() -> float:
    """One burst run of an in-process worker; how long it took."""
    from outbox.worker import Worker

    started = time.monotonic()
    Worker(burst=True).run(install_signal_handlers=False)
    return time.monotonic() - started


def trickled_from_the_greeting(settings, trickled, mailer: str) -> None:
    server, proxy = trickled
    use_smtp(settings, proxy.port, SEND_TIMEOUT=SEND_TIMEOUT, RETRY_BACKOFF=(60.0, 60.0))
    if mailer:
        add_mailer(settings, mailer, proxy.port)
    proxy.trickle(TRICKLE)
    [delivery] = enqueue_email(
        "Hi", "Body", "shop@example.com", ["a@example.com"], mailer=mailer or None
    )

    assert run_worker() < WHOLE

    delivery.refresh_from_db()
    assert delivery.status == Delivery.Status.QUEUED  # to be retried
    [attempt] = delivery.attempt_log.all()
    assert attempt.outcome == Attempt.Outcome.RETRY
    assert server.count() == 0


@pytest.mark.django_db(transaction=True)
def test_the_worker_retries_a_send_to_a_trickling_mailer_after_send_timeout(settings, trickled):
    trickled_from_the_greeting(settings, trickled, mailer="slow")


@pytest.mark.django_db(transaction=True)
def test_the_worker_retries_a_send_to_a_trickling_server_after_send_timeout(settings, trickled):
    trickled_from_the_greeting(settings, trickled, mailer="")


@pytest.mark.django_db(transaction=True)
def test_the_worker_abandons_a_send_whose_last_reply_trickles_under_review(settings, trickled):
    server, proxy = trickled
    use_smtp(
        settings,
        proxy.port,
        SEND_TIMEOUT=SEND_TIMEOUT,
        ABANDONED_POLICY="review",
        RETRY_BACKOFF=(0.0, 0.0),  # a retry, if there were one, would be due at once
    )
    proxy.trickle(TRICKLE, after=END_OF_DATA)
    [delivery] = enqueue_email("Hi", "Body", "shop@example.com", ["a@example.com"])

    assert run_worker() < WHOLE

    delivery.refresh_from_db()
    assert delivery.status == Delivery.Status.ABANDONED
    [attempt] = delivery.attempt_log.all()
    assert attempt.outcome == Attempt.Outcome.AMBIGUOUS
    assert delivery.message_id in attempt.error
    # Not sent twice: another run leaves it to a person.
    run_worker()
    delivery.refresh_from_db()
    assert delivery.status == Delivery.Status.ABANDONED
    assert server.by_message_id() == {delivery.message_id: 1}
