"""The chaos run through the fake ESP, small (``tests/chaos/esp.py`` says what it does).

100 emails by default; ``OUTBOX_TEST_ESP_CHAOS_EMAILS`` sets another size
(the full run is 1,000; its last numbers are in
``tests/chaos/results/latest-esp.txt``).
"""

from __future__ import annotations

import os

from outbox.models import Delivery
from tests.cells import slow_processes
from tests.chaos.esp import run_esp_chaos

pytestmark = slow_processes(
    ("6.1:postgres",), why="about 20 s of real worker and sweeper processes against a fake ESP"
)


def test_through_the_esp_nothing_is_lost_or_sent_twice_and_every_doubt_is_settled(
    worker_process, sweeper_process
):
    emails = int(os.environ.get("OUTBOX_TEST_ESP_CHAOS_EMAILS", "100"))
    # Small: fewer 429s and 503s, each of which holds all sending for its Retry-After.
    few_holds = {"429": 1, "503": 1} if emails <= 100 else None
    numbers = run_esp_chaos(
        emails, worker_process, sweeper_process, time_limit=max(60.0, emails * 0.6),
        answers=few_holds,
    )  # fmt: skip
    print(f"\n{numbers.table()}")
    assert not numbers.broken(), f"{numbers.broken()}\n{numbers.table()}"
    assert numbers.statuses[Delivery.Status.SENT] + numbers.statuses["failed"] == emails
    assert numbers.in_doubt and numbers.settled_by_webhook == numbers.in_doubt
