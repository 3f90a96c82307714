"""The built wheel, adopted into a new project as the README's installation section says.

The wheel is built from a copy of the checkout, installed with its dependencies in a
fresh virtual environment (pip picks the Django the install range allows on this
Python), and a project made by ``django-admin startproject`` gets the README's
settings; then ``migrate``, ``check``, one ``send_mail()`` through the drop-in backend
and ``outbox_worker --burst``, against a redis-server and an SMTP server of the
test's own on loopback.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.cells import only_in_cells
from tests.paths import ROOT
from tests.servers import RedisServer, SMTPRecorder

pytestmark = [
    pytest.mark.slow,
    only_in_cells(
        "6.1:sqlite",
        why="the wheel is adopted in a venv of its own; there pip takes Django 6.1 (MAILERS)",
    ),
]

# What the README's installation section adds to a new project's settings.py.
COMMON_SETTINGS = """
INSTALLED_APPS += ["outbox"]

# SQLite as the README's installation section sets it up for a worker beside the site.
DATABASES["default"]["OPTIONS"] = {{"transaction_mode": "IMMEDIATE", "timeout": 20}}

CACHES = {{
    "default": {{
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": "{redis_url}",
    }},
}}
"""

# Django 5.2 and 6.0: EMAIL_BACKEND and OUTBOX["EMAIL_BACKEND"].
EMAIL_SETTINGS = """
EMAIL_BACKEND = "outbox.backends.OutboxBackend"
EMAIL_HOST, EMAIL_PORT, EMAIL_USE_TLS = "127.0.0.1", {smtp_port}, False

OUTBOX = {{
    "REDIS_CACHE": "default",
    "EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend",
}}
"""

# Django 6.1: startproject's MAILERS block replaced by the README's.
MAILERS_SETTINGS = """
MAILERS = {{
    "default": {{"BACKEND": "outbox.backends.OutboxBackend"}},
    "smtp": {{"BACKEND": "django.core.mail.backends.smtp.EmailBackend",
             "OPTIONS": {{"host": "127.0.0.1", "port": {smtp_port}, "use_tls": False}}}},
}}

OUTBOX = {{
    "REDIS_CACHE": "default",
    "MAILER": "smtp",
}}
"""

SEND_ONE = (
    "from django.core.mail import send_mail; "
    "send_mail('Welcome', 'Hello from a new project.', 'shop@example.com', "
    "['ada@customer.test'])"
)


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


def clean_env() -> dict[str, str]:
    """The environment of a new user's shell: none of the test suite's settings."""
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PIP_CACHE_DIR", "PIP_INDEX_URL")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run(args: list[str | Path], cwd: Path, timeout: float = 300) -> str:
    result = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, f"{args}:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def build_wheel(tmp_path: Path) -> Path:
    src = copy_of_the_source(tmp_path)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp_path, src], tmp_path)
    wheel = next(tmp_path.glob("django_email_outbox-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "outbox/migrations/0001_initial.py",
        "outbox/migrations/0001_squashed_0018_delivery_instants.py",
        "outbox/CHANGELOG.md",
        "outbox/queue/lua/claim.lua",
        "outbox/queue/lua/_common.lua",
        "outbox/py.typed",
        "outbox/templates/admin/outbox/dashboard.html",
        "outbox/migrations/0002_attempt_outcomes_worker_id_length.py",
        "outbox/queue/lua/forget_stale.lua",
        "outbox/management/commands/outbox_worker.py",
        "outbox/management/commands/outbox_sweep.py",
        "outbox/transitions/sql/postgresql.sql",
    ):
        assert required in names, required
    assert not any(n.startswith(("tests/", "example_project/")) for n in names)
    return wheel


def configure(settings_py: Path, django_version: str, redis_url: str, smtp_port: int) -> None:
    """Edit startproject's settings.py as the README says."""
    text = settings_py.read_text()
    text += COMMON_SETTINGS.format(redis_url=redis_url)
    if tuple(int(n) for n in django_version.split(".")[:2]) >= (6, 1):
        # "Its startproject writes a MAILERS block with the console backend; replace it."
        text, replaced = re.subn(r"^MAILERS = \{.*?^\}\n", "", text, flags=re.M | re.S)
        assert replaced == 1, "Django 6.1's startproject wrote no MAILERS block"
        text += MAILERS_SETTINGS.format(smtp_port=smtp_port)
    else:
        text += EMAIL_SETTINGS.format(smtp_port=smtp_port)
    settings_py.write_text(text)


def test_the_wheel_adopted_into_a_new_project(tmp_path):
    wheel = build_wheel(tmp_path)

    # pip install /path/to/django_email_outbox-*.whl, in a fresh venv.
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv], tmp_path)
    python = venv / "bin" / "python"
    run([python, "-m", "pip", "install", "-q", wheel], tmp_path, timeout=600)
    django_version = run([python, "-m", "django", "--version"], tmp_path).strip()

    project = tmp_path / "project"
    project.mkdir()
    run([venv / "bin" / "django-admin", "startproject", "mysite", project], tmp_path)

    redis_server = RedisServer().start()
    smtp = SMTPRecorder().start()
    try:
        configure(project / "mysite" / "settings.py", django_version, redis_server.url, smtp.port)
        manage = [python, "manage.py"]
        run([*manage, "migrate", "-v", "0"], project)
        checked = run([*manage, "check"], project)
        assert "ERRORS" not in checked, checked
        run([*manage, "shell", "-c", SEND_ONE], project)
        assert smtp.count() == 0, "the message went out before a worker ran"
        run([*manage, "outbox_worker", "--burst"], project, timeout=120)
    finally:
        redis_server.close()
        smtp.stop()

    assert smtp.count() == 1, django_version
    received = smtp.received[0]
    assert received.rcpt_tos == ["ada@customer.test"]
    assert received.message["Subject"] == "Welcome"
    # The app came from the wheel, not from the checkout.
    installed = run([python, "-c", "import outbox; print(outbox.__file__)"], project)
    assert installed.startswith(str(venv / "lib")), installed
