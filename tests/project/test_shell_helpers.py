"""tests/lib.sh, the helpers of the test command and of example_project/run.sh; the fast lane's
redis-server per pytest-xdist worker (tests/settings.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.paths import ROOT


def test_log_lines_hold_no_escape_sequences_when_redirected(tmp_path):
    """A log written to a file (CI, ``run.sh > log``) reads as plain text; bold only on a tty."""
    log = tmp_path / "log"
    with log.open("w") as err:
        subprocess.run(
            ["bash", "-c", "source tests/lib.sh && log 'manage.py migrate'"],
            cwd=ROOT,
            stderr=err,
            check=True,
            timeout=30,
        )
    assert log.read_text() == "==> manage.py migrate\n"


def test_a_cells_expected_failures_are_counted_per_module(tmp_path):
    """tests/run.sh prints one XFAIL line per module, not one per listed case; the rest stays."""
    log = tmp_path / "log"
    log.write_text(
        "=========================== short test summary info ============================\n"
        "XFAIL suite/test_a.py::Case::test_one\n"
        "XFAIL suite/test_a.py::Case::test_two\n"
        "XFAIL suite/test_b.py::test_three - why\n"
        "FAILED suite/test_a.py::Case::test_four - Unexpected success\n"
        "============= 1 failed, 3 xfailed in 1.00s =============\n"
    )
    function = subprocess.run(
        ["sed", "-n", "/^without_expected_skips() {/,/^}/p", "tests/run.sh"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    out = subprocess.run(
        ["bash", "-c", f'{function}\nwithout_expected_skips "$1"', "bash", str(log)],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=30,
    ).stdout  # fmt: skip
    assert out.splitlines()[1:] == [
        "FAILED suite/test_a.py::Case::test_four - Unexpected success",
        "XFAIL [2] suite/test_a.py: expected failures, listed in the module",
        "XFAIL [1] suite/test_b.py: expected failures, listed in the module",
        "============= 1 failed, 3 xfailed in 1.00s =============",
    ]


def _missing(path: str, *tools: str) -> subprocess.CompletedProcess[str]:
    """``missing_packages TOOLS`` with ``path`` as the only PATH (bash found by its own path)."""
    return subprocess.run(
        ["/bin/bash", "-c", 'source tests/lib.sh && PATH="$0" missing_packages "$@"', path, *tools],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def test_only_the_tools_a_machine_lacks_are_installed(tmp_path):
    """tests/run.sh installs, with one apt-get, the packages of the selected cells' missing tools."""
    empty = tmp_path / "empty"
    empty.mkdir()
    lacking = _missing(str(empty), "redis", "faketime", "chromium")
    assert lacking.returncode == 0
    assert lacking.stdout.split() == ["redis-server", "faketime", "chromium", "chromium-driver"]
    have = tmp_path / "have"
    have.mkdir()
    for name in ("redis-server", "redis-cli", "faketime"):
        (have / name).write_text("#!/bin/sh\n")
        (have / name).chmod(0o755)
    assert _missing(str(have), "redis", "faketime").stdout.split() == []
    unknown = _missing(str(have), "sendmial")
    assert unknown.returncode == 1
    assert "unknown tool: sendmial" in unknown.stderr


def test_each_cell_prints_its_slowest_modules(tmp_path):
    """tests/run.sh ends with each cell's test time and slowest modules (tests/durations.py)."""
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_a" name="t1" time="3.2"/>'
        '<testcase classname="tests.test_a.TestCase" name="t2" time="1.0"/>'
        '<testcase classname="tests.test_b" name="t3" time="6.0"/>'
        '<testcase classname="mail.tests.MailTests" name="t4" time="0.4"/>'
        "</testsuite></testsuites>"
    )
    out = subprocess.run(
        ["python3", "-m", "tests.durations", "5.2:sqlite", str(junit)],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=30,
    ).stdout  # fmt: skip
    assert out == (
        "5.2:sqlite: 11 s in tests; slowest modules: test_b 6 s, test_a 4 s, mail.tests 0 s\n"
    )


def _cache_location(redis_urls: str, worker: str | None) -> subprocess.CompletedProcess[str]:
    """The Redis URL tests/settings.py gives a pytest-xdist ``worker`` (None: no xdist)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}
    env.update(DJANGO_SETTINGS_MODULE="tests.settings", OUTBOX_TEST_REDIS_URL=redis_urls)
    if worker is not None:
        env["PYTEST_XDIST_WORKER"] = worker
    return subprocess.run(
        [sys.executable, "-c",
         "from django.conf import settings; print(settings.CACHES['default']['LOCATION'])"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def test_each_fast_lane_worker_has_a_redis_server_of_its_own():
    """tests/run.sh --fast starts one redis-server per pytest-xdist worker; each (and each
    subprocess it starts) takes its own, by number; a test's own server, passed alone, stays."""
    two = "redis://127.0.0.1:7001/0 redis://127.0.0.1:7002/0"
    assert _cache_location(two, None).stdout == "redis://127.0.0.1:7001/0\n"
    assert _cache_location(two, "gw0").stdout == "redis://127.0.0.1:7001/0\n"
    assert _cache_location(two, "gw1").stdout == "redis://127.0.0.1:7002/0\n"
    assert _cache_location("redis://127.0.0.1:7003/0", "gw1").stdout == "redis://127.0.0.1:7003/0\n"
    third = _cache_location(two, "gw2")
    assert third.returncode != 0
    assert "ImproperlyConfigured: pytest-xdist worker gw2 has no redis-server" in third.stderr
