"""The previous release of the outbox, built from this repository's history, for upgrade tests.

A rolling upgrade runs the previous release's web processes, workers and
sweeper beside the current release's (tests/faults/test_rolling_upgrade.py).
The previous release is taken from git at :data:`PREVIOUS_RELEASE` and put in
a virtual environment of its own, in seconds and without pip: ``git archive``
of its ``outbox/``, ``tests/`` and ``manage.py`` into a folder, and a venv
whose one ``.pth`` file puts that folder first on the path and this cell's
site-packages after it. Its processes so import the OLD ``outbox`` (and its
``tests.settings``) with the same Django, redis-py, psycopg and anymail as the
current one. The ``.pth`` files of this cell's site-packages are not read
there (only a site directory's are), so the current release's editable
install, and coverage's start-up hook, stay out of it.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from tests.paths import ROOT
from tests.servers import subprocess_env

# The previous release: 0.1.0, the last landed submission. It moves forward with each
# release (to the commit or tag of the release before the one under development), so
# that the upgrade test always runs the upgrade a site makes next.
PREVIOUS_RELEASE = "18f5f0ecde0cbfa031b87812e63342bc242078d0"


@dataclass
class Release:
    """An outbox release built into ``root`` (its tree) with the interpreter ``python``."""

    root: Path
    python: Path

    def env(self, **extra: str) -> dict[str, str]:
        """A subprocess environment on the test database, without the current tree's path."""
        env = subprocess_env(**extra)
        env.pop("PYTHONPATH", None)
        return env

    def start(self, *args: str, **env: str) -> subprocess.Popen[str]:
        """``python <args>`` of this release, in its tree (``-m django outbox_worker`` ...)."""
        return subprocess.Popen(
            [str(self.python), *args],
            cwd=self.root,
            env=self.env(**env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def run(self, *args: str, timeout: float = 60, **env: str) -> str:
        """Run ``python <args>`` of this release to its end; its output (failing if it fails)."""
        done = subprocess.run(
            [str(self.python), *args],
            cwd=self.root,
            env=self.env(**env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout


def build_previous_release(where: Path, commit: str = PREVIOUS_RELEASE) -> Release:
    """The release at ``commit`` in ``where``: its tree from git, and a venv that reaches ours."""
    found = subprocess.run(
        ["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True
    )
    if found.returncode != 0:
        raise AssertionError(
            f"the previous release {commit} (tests/releases.py, PREVIOUS_RELEASE) is not in "
            f"this clone's history: the upgrade test needs a full clone (git fetch --unshallow)"
        )
    root = where / "tree"
    root.mkdir(parents=True)
    archive = subprocess.Popen(
        ["git", "archive", commit, "outbox", "tests", "manage.py"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
    )
    subprocess.run(["tar", "-x", "-C", str(root)], stdin=archive.stdout, check=True)
    assert archive.wait() == 0
    venv = where / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60
    )
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    # The old tree first: its outbox and its tests.settings win over anything after it.
    (Path(site) / "previous_release.pth").write_text(
        "\n".join([str(root), *ours]) + "\n", encoding="utf-8"
    )
    return Release(root=root, python=python)


def current_release() -> Release:
    """This checkout, run by this cell's interpreter, as a :class:`Release`."""
    return Release(root=ROOT, python=Path(sys.executable))


__all__ = ["PREVIOUS_RELEASE", "Release", "build_previous_release", "current_release"]
