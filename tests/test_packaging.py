"""The built wheel is an importable app that carries its migrations and Lua scripts."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.cells import only_in_cells

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.slow,
    only_in_cells(
        "5.2:sqlite", why="building and installing the wheel does not depend on the cell"
    ),
]

MIGRATE_FROM_WHEEL = """
import sys
sys.path.insert(0, sys.argv[1])
import django
from django.conf import settings
settings.configure(
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "outbox"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
    CACHES={"default": {"BACKEND": "django_redis.cache.RedisCache",
                        "LOCATION": "redis://127.0.0.1:1/0"}},
    USE_TZ=True,
)
django.setup()
import outbox, outbox.queue, outbox.queue.scripts
assert outbox.__file__.startswith(sys.argv[1]), outbox.__file__
from django.core.management import call_command
call_command("migrate", "outbox", verbosity=0)
from outbox.models import Delivery
assert Delivery.objects.count() == 0
assert "redis.call" in outbox.queue.scripts._script_source("claim")
print("ok", outbox.__version__)
"""


def copy_of_the_source(tmp_path: Path) -> Path:
    """What the wheel is built from, outside the checkout.

    Building in the checkout would leave build/ and *.egg-info there, and two
    cells of the test command (which run in parallel) would share them.
    """
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "outbox", src / "outbox", ignore=shutil.ignore_patterns("__pycache__"))
    return src


def test_wheel_contains_the_app_and_installs(tmp_path):
    src = copy_of_the_source(tmp_path)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(src)],
        check=True,
        capture_output=True,
    )
    wheel = next(tmp_path.glob("django_email_outbox-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "outbox/migrations/0001_initial.py",
        "outbox/queue/lua/claim.lua",
        "outbox/queue/lua/_common.lua",
        "outbox/py.typed",
        "outbox/templates/admin/outbox/dashboard.html",
        "outbox/migrations/0002_attempt_outcomes_worker_id_length.py",
        "outbox/queue/lua/forget_stale.lua",
        "outbox/management/commands/outbox_worker.py",
        "outbox/management/commands/outbox_sweep.py",
    ):
        assert required in names
    assert not any(n.startswith(("tests/", "example_project/")) for n in names)

    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    result = subprocess.run(
        [sys.executable, "-c", MIGRATE_FROM_WHEEL, str(target)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok ")
