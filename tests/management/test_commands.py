"""Every operator command fails loudly and truthfully: exit statuses and messages.

Real ``manage.py`` subprocesses, as cron, CI or systemd run them, against what
goes wrong first in a new project: Redis not running (a closed port on
loopback), a database that does not answer (PostgreSQL on a closed port), and
a database that answers but was never migrated (a fresh SQLite file). Each
must end with the exit status the README's Operations section lists, and say
which of the three it met and where.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cells import only_in_cells
from tests.paths import ROOT
from tests.servers import free_port, subprocess_env, wait_until

# The subprocesses use the test database (its name comes from the connection).
# Their environment, not the cell, says which database they meet, so the
# module runs in two cells only.
pytestmark = [
    pytest.mark.django_db,
    only_in_cells("6.1:postgres", why="the processes' settings, not the cell's, matter"),
]

UNAVAILABLE = 75  # EX_TEMPFAIL: Redis or the database did not answer


# A new database starts with the squashed migration, then any after it (listed up to 3).
NOT_MIGRATED = re.compile(
    r"is not migrated: outbox migrations 0001_squashed_0018_delivery_instants"
    r"(, \d{4}_\w+)*( and \d+ more)? not applied"
)


def manage(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m django ARGS`` on the test settings; its output, status and duration."""
    return subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=ROOT,
        env=subprocess_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def closed_redis() -> tuple[dict[str, str], str]:
    """The environment of a Redis that is not running, and its URL."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    return {"OUTBOX_TEST_REDIS_URL": url}, url


def closed_database() -> tuple[dict[str, str], str]:
    """The environment of a PostgreSQL that is not running, and its address."""
    port = str(free_port())
    env = {"OUTBOX_TEST_DB": "postgres", "OUTBOX_TEST_PG_HOST": "127.0.0.1"}
    return {**env, "OUTBOX_TEST_PG_PORT": port}, f"127.0.0.1:{port}"


def unmigrated_database(tmp_path: Path) -> dict[str, str]:
    """The environment of a SQLite database that exists but was never migrated."""
    return {"OUTBOX_TEST_DB": "sqlite", "OUTBOX_TEST_DB_NAME": str(tmp_path / "fresh.sqlite3")}


# -- outbox_worker --burst -------------------------------------------------------------


def test_a_burst_run_gives_up_on_a_closed_redis_port():
    env, url = closed_redis()
    started = time.monotonic()
    result = manage("outbox_worker", "--burst", "--give-up-after", "2", **env)
    took = time.monotonic() - started
    assert result.returncode == UNAVAILABLE, result.stderr
    assert took < 20, took  # 2 s of patience and the start of a Django process
    [line] = [line for line in result.stderr.splitlines() if "giving up" in line]
    assert f"Redis (cache 'default' at {url}) unreachable for 2s" in line, line
    assert "Connection refused" in line or "ConnectionError" in line, line


def test_a_burst_run_gives_up_on_a_database_that_does_not_answer():
    env, address = closed_database()
    result = manage("outbox_worker", "--burst", "--give-up-after", "2", **env)
    assert result.returncode == UNAVAILABLE, result.stderr
    [line] = [line for line in result.stderr.splitlines() if "giving up" in line]
    assert "database 'default' (postgresql" in line and f"at {address}) unreachable" in line


def test_burst_runs_under_a_supervisor_give_up_alike():
    env, _ = closed_redis()
    result = manage("outbox_worker", "--burst", "--processes", "2", "--give-up-after", "1", **env)
    assert result.returncode == UNAVAILABLE, result.stderr
    assert result.stderr.count("giving up") == 2, result.stderr


def test_a_worker_refuses_an_unmigrated_database_and_migrate_is_not_stopped(tmp_path):
    env = unmigrated_database(tmp_path)
    result = manage("outbox_worker", "--burst", **env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "outbox.E025" in result.stderr
    assert NOT_MIGRATED.search(result.stderr), result.stderr
    assert "run manage.py migrate" in result.stderr
    assert "delivered" not in result.stderr  # it never started
    deploy = manage("check", "--deploy", "--database", "default", **env)
    assert deploy.returncode == 1 and "outbox.E025" in deploy.stderr
    # E025 is a deployment check: `migrate` runs the database checks first, and
    # must not be stopped by the one that says it is needed.
    migrate = manage("migrate", "-v", "0", **env)
    assert migrate.returncode == 0, migrate.stderr


def test_a_worker_logs_how_long_it_ran_when_interrupted(tmp_path):
    """Interrupted while it still waits for Redis: the time it waited counts."""
    env, _ = closed_redis()
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "django", "outbox_worker"],
            cwd=ROOT,
            env=subprocess_env(**env),
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        wait_until(lambda: log.read_text().count("cannot register with Redis") >= 3, 30)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    [seconds] = re.findall(r"stopped after ([\d.]+)s", log.read_text())
    assert float(seconds) >= 2.0, log.read_text()


# -- outbox_sweep ------------------------------------------------------------------------


def test_a_sweep_without_the_database_fails():
    env, address = closed_database()
    result = manage("outbox_sweep", "--json", **env)
    assert result.returncode == UNAVAILABLE, result.stdout + result.stderr
    assert '"failure": "database"' in result.stdout
    assert f"at {address}) failed: OperationalError" in result.stdout


def test_a_sweep_on_an_unmigrated_database_says_so(tmp_path):
    result = manage("outbox_sweep", **unmigrated_database(tmp_path))
    assert result.returncode == 1, result.stdout + result.stderr
    assert NOT_MIGRATED.search(result.stdout), result.stdout
    assert "no such table" not in result.stdout


# -- outbox_status -------------------------------------------------------------------------


def test_status_tells_an_unmigrated_database_from_an_unreachable_one(tmp_path):
    result = manage("outbox_status", **unmigrated_database(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "Database: not migrated (database 'default' (SQLite file" in result.stdout
    assert "unreachable" not in result.stdout


# -- outbox_pause, outbox_resume ---------------------------------------------------------------


def test_pause_says_it_once_on_stdout():
    """Once: not also on stderr as a log line (a fresh project's logging prints warnings)."""
    paused = manage("outbox_pause")
    assert (paused.returncode, paused.stdout, paused.stderr) == (
        0,
        "Paused all sending. Run outbox_resume to send again.\n",
        "",
    )
