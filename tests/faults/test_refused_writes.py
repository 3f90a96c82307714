"""Outcome writes the database refuses for good (``outbox/worker/settling.py``).

A real worker process (``--concurrency 1``: one sender thread, so a thread
that stops taking mail stops the whole worker), a real SMTP server and the
test database. The database's refusals are real: a recipient whose IDNA form
is longer than the suppression list's column (PostgreSQL raises DataError;
SQLite does not enforce a varchar's length and stores it), and triggers that
refuse one row's write as a constraint would (``DataError`` on PostgreSQL,
``IntegrityError`` on SQLite), or as a site's own trigger does (a plain
``RAISE EXCEPTION``, or a code of its own). In every case the row is settled, the operator
is told, and the same thread sends the next message.
"""

from __future__ import annotations

import re
import signal
import subprocess
from collections.abc import Callable, Iterator

import pytest
from django.db import connection

from outbox import enqueue_email
from outbox.models import Attempt, Delivery, Suppression
from outbox.validation import suppression_key
from tests.addresses import TOO_LONG_ON_THE_WIRE
from tests.cells import BOTH_DATABASES, slow_processes
from tests.servers import SMTPRecorder, wait_until

pytestmark = slow_processes(BOTH_DATABASES, why="worker processes against each database")

Status = Delivery.Status
WorkerProcess = Callable[..., subprocess.Popen[str]]


@pytest.fixture
def smtp() -> Iterator[SMTPRecorder]:
    server = SMTPRecorder().start()
    yield server
    server.stop()


@pytest.fixture
def refusing() -> Iterator[Callable[..., None]]:
    """Install a trigger that refuses writes to a table matching a condition.

    On PostgreSQL it raises ``code`` ("22001", a value too long, as a
    constraint would, by default; None: a plain ``RAISE EXCEPTION``, P0001).
    """
    installed: list[tuple[str, str]] = []

    def install(table: str, when: str, timing: str, code: str | None = "22001") -> None:
        name = f"refuse_{len(installed)}"
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                using = "" if code is None else f" USING ERRCODE = '{code}'"
                cursor.execute(
                    f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                    f"RAISE EXCEPTION 'value too long for this test'{using}; END $$"
                )
                cursor.execute(
                    f"CREATE TRIGGER {name} {timing} ON {table} FOR EACH ROW "
                    f"WHEN ({when}) EXECUTE FUNCTION {name}()"
                )
            else:
                cursor.execute(
                    f"CREATE TRIGGER {name} {timing} ON {table} FOR EACH ROW WHEN {when} "
                    "BEGIN SELECT RAISE(ABORT, 'refused for this test'); END"
                )
        installed.append((name, table))

    yield install
    with connection.cursor() as cursor:
        for name, table in installed:
            if connection.vendor == "postgresql":
                cursor.execute(f"DROP TRIGGER {name} ON {table}")
                cursor.execute(f"DROP FUNCTION {name}()")
            else:
                cursor.execute(f"DROP TRIGGER {name}")


def start(
    worker_process: WorkerProcess, smtp: SMTPRecorder, policy: str = "review"
) -> subprocess.Popen:
    return worker_process(
        "--concurrency",
        "1",
        OUTBOX_TEST_SMTP_PORT=str(smtp.port),
        OUTBOX_TEST_ABANDONED_POLICY=policy,
    )


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert proc.stdout is not None
    return proc.stdout.read()


def settled(pk: int) -> bool:
    return Delivery.objects.get(pk=pk).status not in (Status.QUEUED, Status.PROCESSING)


def the_thread_sends_the_next(proc: subprocess.Popen[str]) -> Delivery:
    """Enqueue one more message; the worker's one thread must send it."""
    [row] = enqueue_email("Next", "Body", "shop@example.com", ["next@example.com"])
    try:
        wait_until(lambda: Delivery.objects.get(pk=row.pk).status == Status.SENT, 20)
    except AssertionError:
        proc.kill()
        assert proc.stdout is not None
        raise AssertionError(f"the next message was not sent:\n{proc.stdout.read()}") from None
    return row


def test_a_refused_recipient_the_suppression_list_cannot_hold_is_logged_and_the_row_failed(
    worker_process, smtp
):
    """The issue's case: 848 octets on the wire, a 5xx at RCPT, a 320-character column."""
    wire = suppression_key(TOO_LONG_ON_THE_WIRE)
    # The server refuses it at RCPT by itself: "500 Command line too long" (a
    # command line has at most 512 octets, RFC 5321 4.5.3.1.4), a 5xx like any.
    [row] = enqueue_email("Hi", "Body", "shop@example.com", ["placeholder@example.com"])
    # Written around enqueue's checks, as a row from before them or from raw SQL would be.
    Delivery.objects.filter(pk=row.pk).update(recipient=TOO_LONG_ON_THE_WIRE)
    proc = start(worker_process, smtp)
    wait_until(lambda: settled(row.pk), 20)
    the_thread_sends_the_next(proc)
    output = stop(proc)
    failed = Delivery.objects.get(pk=row.pk)
    assert failed.status == Status.FAILED
    assert re.search(r"SMTPRecipientsRefused: .*\(5\d\d, ", failed.last_error)
    assert Attempt.objects.filter(delivery_id=row.pk, outcome="failed").count() == 1
    if connection.vendor == "postgresql":
        # DataError in a savepoint: logged, and the outcome written without it.
        assert not Suppression.objects.exists()
        assert f"delivery {row.pk}: could not put {wire[:80]} on the suppression list" in output
    else:
        # SQLite does not enforce a varchar's length: the entry is stored whole.
        assert list(Suppression.objects.values_list("address", flat=True)) == [wire]


def test_a_failure_whose_outcome_is_refused_for_good_is_settled_failed_with_the_refusal(
    worker_process, smtp, refusing
):
    smtp.refuse["refused@example.com"] = "550 5.1.1 unstorable-marker"
    refusing(Attempt._meta.db_table, "NEW.error LIKE '%unstorable-marker%'", "BEFORE INSERT")
    [row] = enqueue_email("Hi", "Body", "shop@example.com", ["refused@example.com"])
    proc = start(worker_process, smtp)
    wait_until(lambda: settled(row.pk), 20)
    the_thread_sends_the_next(proc)
    output = stop(proc)
    failed = Delivery.objects.get(pk=row.pk)
    assert failed.status == Status.FAILED
    # In full: the server's refusal, and the database's.
    assert "550" in failed.last_error and "unstorable-marker" in failed.last_error
    assert "the database refused to record the outcome (failed) for good" in failed.last_error
    assert "refused for this test" in failed.last_error or "too long" in failed.last_error
    assert not Attempt.objects.filter(delivery_id=row.pk).exists()
    assert f"delivery {row.pk} (Message-ID {row.message_id}): the database refused" in output


def test_a_success_whose_sent_write_is_refused_is_abandoned_and_never_sent_again(
    worker_process, smtp, refusing
):
    refusing(
        Delivery._meta.db_table,
        "NEW.status = 'sent' AND NEW.recipient = 'unrecordable@example.com'",
        "BEFORE UPDATE",
    )
    rows = enqueue_email("Hi", "Body", "shop@example.com", ["unrecordable@example.com"])
    row = rows[0]
    proc = start(worker_process, smtp)
    wait_until(lambda: settled(row.pk), 20)
    the_thread_sends_the_next(proc)
    output = stop(proc)
    abandoned = Delivery.objects.get(pk=row.pk)
    # The server has it: under "review" a person decides, nothing sends it again.
    assert abandoned.status == Status.ABANDONED
    assert abandoned.last_error.startswith(
        f"accepted by the mail server (Message-ID {row.message_id})"
    )
    assert smtp.by_message_id()[row.message_id] == 1
    assert f"delivery {row.pk} (Message-ID {row.message_id}): the database refused" in output


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="SQLite's RAISE() has one code: the test above"
)
@pytest.mark.parametrize(
    "code", [None, "OB001"], ids=["a plain RAISE EXCEPTION (P0001)", "a code of the site's own"]
)
def test_a_site_trigger_refusing_sent_with_any_code_is_a_refusal_and_the_thread_goes_on(
    worker_process, smtp, refusing, code
):
    """The issue's case: a trigger's plain exception on the change to `sent`.

    Before, the thread retried the write for ever (P0001 is psycopg's
    ProgrammingError, a code of the site's own its DatabaseError): the row
    stayed `processing` and the next message was never sent.
    """
    refusing(
        Delivery._meta.db_table,
        "NEW.status = 'sent' AND NEW.recipient = 'audited@example.com'",
        "BEFORE UPDATE",
        code,
    )
    [row] = enqueue_email("Hi", "Body", "shop@example.com", ["audited@example.com"])
    proc = start(worker_process, smtp)
    try:
        wait_until(lambda: settled(row.pk), 20)
    except AssertionError:
        proc.kill()
        assert proc.stdout is not None
        raise AssertionError(f"the row stayed processing:\n{proc.stdout.read()}") from None
    the_thread_sends_the_next(proc)
    output = stop(proc)
    abandoned = Delivery.objects.get(pk=row.pk)
    # As for any success the database will not record: the server has it, a person decides.
    assert abandoned.status == Status.ABANDONED
    assert abandoned.last_error.startswith(
        f"accepted by the mail server (Message-ID {row.message_id})"
    )
    assert "value too long for this test" in abandoned.last_error
    assert smtp.by_message_id()[row.message_id] == 1
    assert f"delivery {row.pk} (Message-ID {row.message_id}): the database refused" in output


def test_a_success_whose_attempt_row_is_refused_is_recorded_sent_without_it(
    settings, outbox_mail, refusing, running
):
    """A redirected copy's success writes an Attempt row too; that part alone is refused."""
    settings.OUTBOX = {
        **settings.OUTBOX,
        "ALLOWED_RECIPIENTS": ["*@staging.example"],
        "REDIRECT_TO": "inbox@staging.example",
    }
    refusing(Attempt._meta.db_table, "NEW.outcome = 'sent'", "BEFORE INSERT")
    [row] = enqueue_email("Hi", "Body", "shop@example.com", ["customer@example.com"])
    running(concurrency=1)  # in this process, for its settings; stopped by the fixture
    wait_until(lambda: settled(row.pk), 10)
    sent = Delivery.objects.get(pk=row.pk)
    # Accepted by the server: recorded sent, never a retry; the redirect's note is lost.
    assert sent.status == Status.SENT
    assert not Attempt.objects.filter(delivery_id=row.pk).exists()
    assert [m.to for m in outbox_mail] == [["inbox@staging.example"]]
