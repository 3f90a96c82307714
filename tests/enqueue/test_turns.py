"""SQLite as ``startproject`` leaves it: the README's dev loop fails no request.

A runserver process (threaded, as in development) takes concurrent enqueue
requests while a real ``outbox_worker --concurrency 4`` delivers beside it,
both with Django's default SQLite options (no ``transaction_mode``, a 5 s
timeout). The outbox's enqueue transactions take their turn
(``outbox/enqueue/turns.py``, ``write_transaction``); before, a few of forty
concurrent requests failed with "database is locked". Check ``outbox.W015``
still tells the project to set the two options for its own transactions.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from outbox import enqueue_email, signals
from outbox.checks.sqlite import check_sqlite_options
from outbox.models import Delivery
from tests.cells import only_in_cells
from tests.servers import runserver, wait_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    only_in_cells("5.2:sqlite", why="SQLite's locking, with real processes"),
    pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite only"),
]

STARTPROJECT = {"OUTBOX_TEST_SQLITE_OPTIONS": "startproject"}
CLIENTS = 40  # concurrent requests, as a page of sign-ups or a load test sends them
REQUESTS_EACH = 3


@pytest.fixture
def web(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """``manage.py runserver`` on a free port, with startproject's SQLite options.

    Yields its URL and the file of its log (a failed request's traceback).
    """
    log = tmp_path / "runserver.log"
    with runserver(log, **STARTPROJECT) as port:
        yield f"http://127.0.0.1:{port}/enqueue/", log


def _post(url: str, to: str) -> int | str:
    """The response's status, or why there was none.

    runserver listens with a short backlog, so under forty clients a
    connection is now and then reset before the server accepts it; that
    request never reached the view and is sent again (the test counts the
    rows, so a request that had reached it would show as one row too many).
    """
    data = urllib.parse.urlencode({"to": to}).encode()
    for _ in range(5):
        try:
            with urllib.request.urlopen(url, data=data, timeout=60) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code
        except ConnectionError:
            continue
        except OSError as exc:
            return repr(exc)
    return "no connection"


def test_concurrent_requests_beside_a_worker_all_succeed(web, worker_process):
    url, log = web
    worker = worker_process("--concurrency", "4", **STARTPROJECT)
    statuses: list[int | str] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        for n in range(REQUESTS_EACH):
            status = _post(url, f"user{index}.{n}@example.com")
            with lock:
                statuses.append(status)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    failed = [s for s in statuses if s != 200]
    assert len(statuses) == CLIENTS * REQUESTS_EACH
    errors = {line for line in log.read_text().splitlines() if "Error: " in line}
    assert failed == [], (
        f"{len(failed)} of {len(statuses)} requests failed: {set(failed)}, {errors}"
    )
    # And the worker, writing beside them all along, delivers every one.
    wait_until(
        lambda: Delivery.objects.filter(status=Delivery.Status.SENT).count() == len(statuses),
        timeout=60,
        interval=0.2,
    )
    assert Delivery.objects.count() == len(statuses)  # none enqueued twice
    assert worker.poll() is None


def test_the_turn_ends_before_the_callbacks_after_the_commit():
    """A slow Redis push or signal receiver holds up no other enqueue, nor its own."""
    seen: list[str] = []

    def other_thread_enqueues() -> None:
        enqueue_email("Other", "Body", None, ["other@example.com"])
        seen.append("other thread")

    def receiver(**kwargs: object) -> None:
        if seen:
            return
        seen.append("receiver")
        enqueue_email("Again", "Body", None, ["again@example.com"])  # the same thread
        thread = threading.Thread(target=other_thread_enqueues)
        thread.start()
        thread.join(timeout=10)  # would wait for ever if the turn were still held

    signals.email_enqueued.connect(receiver, dispatch_uid="test-turn")
    try:
        enqueue_email("First", "Body", None, ["first@example.com"])
    finally:
        signals.email_enqueued.disconnect(dispatch_uid="test-turn")
    assert seen == ["receiver", "other thread"]
    assert Delivery.objects.count() == 3


def test_w013_names_the_two_options_and_why(monkeypatch):
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", {})
    [warning] = check_sqlite_options()
    assert warning.id == "outbox.W015"
    assert "transaction_mode DEFERRED and timeout 5.0 s" in warning.msg
    assert "'database is locked'" in warning.msg
    assert "{'transaction_mode': 'IMMEDIATE', 'timeout': 20}" in warning.hint


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"transaction_mode": "IMMEDIATE"}, "timeout 5.0 s"),
        ({"timeout": 20}, "transaction_mode DEFERRED"),
        ({"transaction_mode": "deferred", "timeout": 60}, "transaction_mode DEFERRED"),
    ],
)
def test_w013_names_what_is_missing(monkeypatch, options, named):
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", options)
    [warning] = check_sqlite_options()
    assert f"SQLite with {named}:" in warning.msg


@pytest.mark.parametrize(
    "options",
    [
        {"transaction_mode": "IMMEDIATE", "timeout": 20},
        {"transaction_mode": "EXCLUSIVE", "timeout": 30},
    ],
)
def test_w013_is_quiet_with_the_options(monkeypatch, options):
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", options)
    assert check_sqlite_options() == []


def test_w013_is_quiet_for_an_in_memory_database(monkeypatch):
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", {})
    monkeypatch.setitem(connection.settings_dict, "NAME", ":memory:")
    assert check_sqlite_options() == []
