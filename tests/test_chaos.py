"""The chaos run, small: a few hundred deliveries, a few kills of each kind, both policies.

Runs the code of ``chaos/run.py`` (``scripts/chaos.sh`` is the full-size run): each
policy in a child process with its own database on this cell's PostgreSQL server,
its own redis-server and its own SMTP server, with real worker and sweeper
processes that are SIGKILLed, SIGSTOPped, killed inside the send window, lose
their Redis data and have their "mark sent" write refused. The rules asserted
here are the ones the chaos run exits non-zero on.
"""

from __future__ import annotations

import pytest
from django.db import connection

from chaos.run import Config, run_chaos

pytestmark = pytest.mark.slow

SMALL = {
    "deliveries": 300,
    "workers": 3,
    "concurrency": [1, 2, 4],
    "random_kills": 2,
    "stops": 2,
    "window_kills": 2,
    "db_refusals": 1,
    "redis_wipes": 1,
    "time_limit": 120.0,
    "seed": 5,
}


@pytest.mark.parametrize("policy", ["review", "requeue"])
def test_small_chaos_run(policy, tmp_path):
    if connection.vendor != "postgresql":
        pytest.skip(
            "the chaos run needs PostgreSQL: its 'refuse mark sent' step terminates the "
            "workers' database connections with pg_terminate_backend (runs in the postgres cell)"
        )
    result = run_chaos(Config(policy=policy, db="postgres", results_dir=str(tmp_path), **SMALL))
    counts = result["counts"]
    table = result["table"]

    assert result["violations"] == [], table
    assert result["ok"], table
    # Every step of the schedule happened.
    assert counts["random SIGKILL"] == 2, table
    assert counts["SIGSTOP"] == 2, table
    assert counts["SIGKILL after_send"] == 2, table
    assert counts["db refusals"] == 1 and counts["refusals confirmed"] == 1, table
    assert counts["redis wipe"] == 1, table
    # Every email is accounted for.
    assert counts["enqueued"] == counts["rows"] == 300, table
    assert counts["rolled back"] > 0 and counts["rolled-back arrived"] == 0, table
    assert counts["lost"] == counts["not terminal"] == counts["sent without receipt"] == 0, table
    assert counts["unknown receipts"] == counts["misaddressed"] == 0, table
    terminal = sum(counts.get(s, 0) for s in ("sent", "failed", "abandoned", "cancelled"))
    assert terminal == 300, table
    if policy == "review":
        # At most once: each kill in the window leaves an abandoned row that did arrive.
        assert counts.get("delivered twice or more", 0) == 0, table
        assert counts.get("abandoned arrived", 0) >= 2, table
    else:
        # At least once: each kill in the window is sent again, so arrives twice.
        assert counts.get("abandoned", 0) == 0, table
        assert counts.get("delivered twice or more", 0) >= 2, table
        assert counts["extra copies"] <= counts["window hits"], table
        assert counts.get("unexplained duplicates", 0) == 0, table
    assert (tmp_path / f"latest-{policy}.txt").read_text().startswith("chaos run ")
