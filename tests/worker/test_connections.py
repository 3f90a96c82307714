"""A sender thread's mail connection: kept open while mail trickles in, closed once idle.

A real worker thread delivers to a real SMTP server on loopback, which counts
the connections it greeted (EHLO) and the ones that said goodbye (QUIT).
"""

from __future__ import annotations

from typing import Any

import pytest

from outbox import enqueue_email
from outbox.models import Delivery
from outbox.worker import attempt
from tests.delivery import use_smtp
from tests.servers import SMTPRecorder, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


class CountingServer(SMTPRecorder):
    """An SMTPRecorder that also counts connections opened and closed by the client."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.greeted = 0
        self.quit = 0

    async def handle_EHLO(
        self, server: Any, session: Any, envelope: Any, hostname: str, responses: list[str]
    ) -> list[str]:
        session.host_name = hostname
        self.greeted += 1
        return responses

    async def handle_QUIT(self, server: Any, session: Any, envelope: Any) -> str:
        self.quit += 1
        return "221 Bye"


@pytest.fixture
def counting_server():
    server = CountingServer().start()
    yield server
    server.stop()


def sent(n: int) -> bool:
    return Delivery.objects.filter(status=Delivery.Status.SENT).count() == n


def test_mail_that_trickles_in_reuses_the_idle_threads_connection(
    settings, counting_server, running, monkeypatch
):
    monkeypatch.setattr(attempt, "KEEP_OPEN_SECONDS", 60.0)
    use_smtp(settings, counting_server.port)
    running(concurrency=1)
    for n in range(1, 4):
        # Each arrives when the thread has gone idle after the one before.
        enqueue_email("s", "b", None, [f"a{n}@example.com"])
        wait_until(lambda n=n: sent(n), 10)
    assert counting_server.count() == 3
    assert (counting_server.greeted, counting_server.quit) == (1, 0)


def test_an_idle_thread_closes_its_connection(settings, counting_server, running, monkeypatch):
    monkeypatch.setattr(attempt, "KEEP_OPEN_SECONDS", 0.0)
    use_smtp(settings, counting_server.port)
    running(concurrency=1)
    enqueue_email("s", "b", None, ["a@example.com"])
    wait_until(lambda: sent(1), 10)
    # Nothing more to send: the connection is closed, not left for the server to time out.
    wait_until(lambda: counting_server.quit == 1, 10)
    enqueue_email("s", "b", None, ["b@example.com"])
    wait_until(lambda: sent(2), 10)
    wait_until(lambda: counting_server.quit == 2, 10)
    assert counting_server.greeted == 2
