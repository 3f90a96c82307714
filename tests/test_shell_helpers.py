"""tests/lib.sh, the helpers of the test command and of example_project/run.sh."""

from __future__ import annotations

import subprocess

from tests.conftest import ROOT


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
