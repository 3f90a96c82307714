"""Start ``manage.py outbox_worker`` so that Python keeps working under libfaketime.

The skewed-clock worker (faults/skew.py, and the one-clock test in
tests/faults/test_promise_edges.py) runs under libfaketime with
``DONT_FAKE_MONOTONIC=1``: its wall clock is off, its monotonic clock is real.
(With the monotonic clock faked too, Python's ``threading.Event.wait`` never
returns: it waits with ``sem_clockwait`` on CLOCK_MONOTONIC, which libfaketime
0.9.10 does not intercept.) That library's ``clock_nanosleep`` then fails an
absolute monotonic deadline with EINVAL, so ``time.sleep`` raises ``OSError``;
with OUTBOX_CHAOS_SLEEP_FIX=1 this module makes ``time.sleep`` wait on an
Event instead, before anything else is imported.

    python -m tests.chaos.worker_main outbox_worker --concurrency 1 ...
"""

from __future__ import annotations

import sys
import threading


def _sleep_without_clock_nanosleep() -> None:
    import os
    import time

    def sleep(seconds: float) -> None:
        if seconds <= 0:
            os.sched_yield()
        else:
            threading.Event().wait(seconds)

    time.sleep = sleep


def main(argv: list[str]) -> None:
    import os

    if os.environ.get("OUTBOX_CHAOS_SLEEP_FIX") == "1":
        _sleep_without_clock_nanosleep()
    import django
    from django.core.management import execute_from_command_line

    django.setup()
    execute_from_command_line(["manage.py", *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
