"""Fault: a web host whose clock is 120 s slow enqueues while it cannot reach Redis.

A separate Django process (tests/chaos/worker_main.py, ``shell -c``) runs
under libfaketime with its wall clock 120 s behind, and its Redis URL names a
closed port: every push after a commit fails (the documented warning) while
the rows commit. It enqueues a few deliveries through ``enqueue_email`` and
``enqueue_many``, some to hostile addresses (``plan.hostile_address``), and
prints their Message-IDs, which join the run's committed deliveries and are
checked like every other.

Nobody pushes these ids but the sweeper's incremental mirror check: it must
find them on the database's clock (PostgreSQL) or by their ids (SQLite), not
by the web host's, so every row is tried within seconds. A row still untried
after ``TRIED_WITHIN`` seconds (it would wait for the hourly full check) is a
violation. A full check meanwhile (after a Redis wipe) could hide the bug, so
tests/faults/test_clocks.py checks the same thing without one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING

from tests.chaos.config import ROOT, HarnessError
from tests.chaos.faults.skew import skewed_clock_env
from tests.chaos.plan import hostile_address
from tests.servers import free_port

if TYPE_CHECKING:
    from tests.chaos.child import Child

SLOW = -120.0
TRIED_WITHIN = 30.0

# Run in the slow web host: two single enqueues and one bulk call, then the
# Message-IDs and recipients of what committed.
_ENQUEUE = """
import json
from outbox import enqueue_email, enqueue_many
recipients = json.loads({recipients!r})
rows = []
for address in recipients[:2]:
    rows += enqueue_email("slow web host", "enqueued 120 s behind\\n", None, [address])
for created in enqueue_many(
    [{{"subject": "slow web host", "message": "bulk\\n", "recipient_list": [address]}}
     for address in recipients[2:]]
):
    rows += created
print("OUT", json.dumps({{d.message_id: d.recipient for d in rows}}))
"""


def slow_web_host(child: Child) -> None:
    serial = len(child.committed) + len(child.rolled_back)
    recipients = [
        f"slow{serial}@example.com",
        hostile_address(serial + 1),
        hostile_address(serial + 2),
        hostile_address(serial + 3),
        f"slow{serial + 4}@example.com",
    ]
    env = {
        **os.environ,
        **child.env,
        **skewed_clock_env(SLOW),
        "OUTBOX_TEST_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
    }
    code = _ENQUEUE.format(recipients=json.dumps(recipients))
    stdout = child.logs / f"slow-web-host-{serial}.out"
    stderr = child.logs / f"slow-web-host-{serial}.log"
    with stdout.open("w") as out_file, stderr.open("w") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.chaos.worker_main", "shell", "-c", code],
            cwd=ROOT,
            env=env,
            stdout=out_file,
            stderr=err_file,
            stdin=subprocess.DEVNULL,
        )
    try:
        child.wait_for(lambda: proc.poll() is not None, 120, "the slow web host's enqueue")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = [line[4:] for line in stdout.read_text().splitlines() if line.startswith("OUT ")]
    if proc.returncode != 0 or not out:
        raise HarnessError(f"the slow web host's enqueue failed ({proc.returncode}): see {stderr}")
    if "Redis is unreachable" not in stderr.read_text():
        raise HarnessError("the slow web host's push did not fail")
    written: dict[str, str] = json.loads(out[0])
    child.committed.update(written)
    child.counts["slow web host enqueues"] += 1
    child.counts["slow web host rows"] += len(written)
    child.event(
        f"a web host 120 s slow, its Redis unreachable, enqueued {len(written)} rows; "
        "only the sweeper's incremental mirror check can find them"
    )

    from outbox.models import Delivery

    rows = Delivery.objects.filter(message_id__in=list(written))

    def tried() -> bool:
        return not rows.filter(status="queued", attempts=0).exists()

    child.wait_for(tried, TRIED_WITHIN, "the slow web host's rows to be tried", interval=0.3)
