"""The chaos run, small: a few hundred deliveries, one or two faults of each kind, both policies.

Runs the code of ``tests/chaos/`` (``tests/chaos/run.sh`` is the full-size run): each
policy in a child process with its own database on this cell's PostgreSQL server,
its own redis-server and its own SMTP server, with real worker and sweeper
processes that are SIGKILLed, SIGSTOPped, killed inside the send window, lose
their Redis data, have their "mark sent" write refused, are restarted under a
reused ``--worker-id``, run with a clock 90 s behind (faketime), enqueue from a
web host 120 s behind whose pushes fail, send to hostile but legal addresses (long
IDN domains, mixed case, display names), and meet an SMTP server that stalls or cuts the connection after DATA; two of them reach
their servers through fault proxies that lose the replies to a claim, a step
and a push and refuse connections for a few seconds; a worker whose step waits
on a row lock is SIGSTOPped, and one is SIGTERMed during a send held longer
than the heartbeat timeout. The rules asserted here are the ones the chaos
run exits non-zero on.

Each policy's run takes over a minute, so each runs in ONE cell of
tests/run.sh: "review" in the Django 6.1 PostgreSQL cell (with psycopg's
prepared statements), "requeue" in the Django 5.2 one; both in any PostgreSQL
run outside tests/run.sh (OUTBOX_TEST_PG_NAME unset), or wherever
OUTBOX_TEST_CHAOS=1.
"""

from __future__ import annotations

import os
import shutil

import pytest
from django.db import connection

from tests.chaos.config import SMALL
from tests.chaos.run import Config, run_chaos

pytestmark = pytest.mark.slow

# The cell (OUTBOX_TEST_PG_NAME) that runs each policy's chaos run.
CHAOS_CELL = {"review": "outbox_61_postgres", "requeue": "outbox_52_postgres"}


def skip_unless_chaos_cell(policy: str) -> None:
    if connection.vendor != "postgresql":
        pytest.skip(
            "the chaos run needs PostgreSQL: its 'refuse mark sent' step terminates the "
            "workers' database connections with pg_terminate_backend"
        )
    cell = os.environ.get("OUTBOX_TEST_PG_NAME")
    if cell not in (None, CHAOS_CELL[policy]) and os.environ.get("OUTBOX_TEST_CHAOS") != "1":
        pytest.skip(f"the chaos run is slow: it runs in the {CHAOS_CELL[policy]} cell only")
    if shutil.which("faketime") is None:
        pytest.skip("faketime is not installed (tests/run.sh installs it)")


@pytest.mark.parametrize("policy", ["review", "requeue"])
def test_small_chaos_run(policy, tmp_path):
    skip_unless_chaos_cell(policy)
    result = run_chaos(Config(policy=policy, db="postgres", results_dir=str(tmp_path), **SMALL))
    counts = result["counts"]
    table = result["table"]

    assert result["violations"] == [], table
    assert result["ok"], table
    # Every step of the schedule happened.
    assert counts["random SIGKILL"] == 1, table
    assert counts["SIGSTOP"] == 1, table
    assert counts["SIGKILL after_send"] == 2, table
    assert counts["db refusals"] == 1 and counts["refusals confirmed"] == 1, table
    assert counts["redis wipe"] == 1, table
    assert counts["restart under reused id"] == counts["restart rows"] == 1, table
    assert counts["restart rows not settled by the sweeper"] == 0, table
    assert counts["skewed workers"] == 1 and counts["skew delivered"] > 0, table
    assert counts["skew problems"] == 0, table
    # A web host 120 s slow whose pushes failed: its rows were tried within seconds
    # (else the step is a violation), hostile recipients among them and in the plan.
    assert counts["slow web host enqueues"] == 1 and counts["slow web host rows"] == 5, table
    assert counts["hostile recipients"] >= 10, table
    assert counts["stall after DATA"] == counts["stalls played"] == 1, table
    assert counts["cut after DATA"] == counts["cuts played"] == 1, table
    assert counts["lost claim reply"] == counts["lost step reply"] == 1, table
    assert counts["lost push reply"] == 1, table
    assert counts["redis outage"] == counts["postgres outage"] == 1, table
    assert counts["SIGSTOP blocked on a row lock"] == 1 and counts["lock rows"] >= 1, table
    assert counts["lock rows not as documented"] == 0, table
    assert counts["SIGTERM during a long send"] == counts["long-send rows"] == 1, table
    assert counts["long-send rows not as documented"] == 0, table
    assert counts["abandoned not in doubt"] == counts["receipt after abandonment"] == 0, table
    # Every email is accounted for (a fault may have needed a few extra deliveries).
    assert counts["enqueued"] == counts["rows"] >= 300, table
    assert counts["rolled back"] > 0 and counts["rolled-back arrived"] == 0, table
    assert counts["lost"] == counts["not terminal"] == counts["sent without receipt"] == 0, table
    assert counts["unknown receipts"] == counts["misaddressed"] == 0, table
    terminal = sum(counts.get(s, 0) for s in ("sent", "failed", "abandoned", "cancelled"))
    assert terminal == counts["rows"], table
    if policy == "review":
        # At most once: each kill in the window and the cut leave an abandoned row that
        # did arrive; the stall and the cut leave an "ambiguous" attempt each.
        assert counts.get("delivered twice or more", 0) == 0, table
        assert counts.get("abandoned arrived", 0) >= 3, table
        assert counts["ambiguous rows"] >= 2 and counts["in-doubt retries"] == 0, table
    else:
        # At least once: each kill in the window is sent again, so arrives twice, and
        # so does the cut message (the server kept the first copy). Copies, not rows:
        # the second kill in the window may land on the row the first one left behind.
        assert counts.get("abandoned", 0) == 0, table
        assert counts["extra copies"] >= 3, table
        assert counts["in-doubt retries"] >= 2, table
        assert counts["extra copies"] <= counts["window hits"] + counts["in-doubt retries"], table
        assert counts.get("unexplained duplicates", 0) == 0, table
    assert (tmp_path / f"latest-{policy}.txt").read_text().startswith("chaos run ")
