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
