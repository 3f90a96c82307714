"""Settings for the test suite.

The test command (tests/run.sh) starts redis-server and PostgreSQL on
loopback and passes their addresses in the environment. It runs its cells in
parallel, so each cell has its own redis-server, SQLite folder and PostgreSQL
database names:

- OUTBOX_TEST_DB: "sqlite" (default) or "postgres"
- OUTBOX_TEST_PG_HOST / OUTBOX_TEST_PG_PORT / OUTBOX_TEST_PG_USER
- OUTBOX_TEST_PG_NAME: the database name (default "outbox"; the test database is
  "test_<name>")
- OUTBOX_TEST_SQLITE_DIR: the folder of the SQLite databases
- OUTBOX_TEST_SQLITE_OPTIONS: "startproject" for Django's default SQLite OPTIONS (none)
- OUTBOX_TEST_PG_PREPARE_THRESHOLD: set OPTIONS["prepare_threshold"] (prepared statements)
- OUTBOX_TEST_PG_BOUNCER: set ("1") when OUTBOX_TEST_PG_PORT is a transaction-pooling
  PgBouncer (tests/pgbouncer.py): DISABLE_SERVER_SIDE_CURSORS, as Django asks
- OUTBOX_TEST_REDIS_URL: e.g. redis://127.0.0.1:6390/0; under pytest-xdist (the fast lane),
  one URL per worker, separated by spaces (below)
- OUTBOX_TEST_REDIS_TOPOLOGY: a Sentinel or Cluster instead (tests/topologies.py)
- OUTBOX_TEST_DB_NAME: set for worker subprocesses so they use the test database
- OUTBOX_TEST_EMAIL_BACKEND / OUTBOX_TEST_SMTP_PORT / OUTBOX_TEST_EMAIL_FILE_PATH:
  where a worker subprocess delivers (see "Email" below)
- OUTBOX_TEST_RATE_LIMITS: OUTBOX["RATE_LIMITS"] as JSON, for worker subprocesses
- OUTBOX_TEST_POSTFIX_LOG: configure PostfixLogReconciler on that log, for worker subprocesses
- OUTBOX_TEST_ROUTED: set ("1") for subprocesses of tests/models/test_routing.py: tests/routers.py
  sends the outbox's tables to the second PostgreSQL database, "routed" (defined, and
  created only for the tests that ask for it, whenever OUTBOX_TEST_DB is "postgres");
  OUTBOX_TEST_ROUTED_DB_NAME is then its test database's name
- OUTBOX_TEST_ESP_URL / OUTBOX_TEST_ESP_TIMEOUT: anymail's API URLs and its requests'
  timeout, for worker subprocesses sending to the fake ESP (tests/esp.py)
- OUTBOX_TEST_POSTMARK_TOKEN: with OUTBOX_TEST_ESP_URL, the Postmark server token instead
  of the tests' own ("" leaves the setting out)
- OUTBOX_TEST_BULK_BACKEND: a second mailer, "bulk", delivering through that backend
- OUTBOX_TEST_MAILER_PAUSE: OUTBOX["MAILER_PAUSE"] as "base,cap"
- OUTBOX_TEST_FAILURE_ALARM: OUTBOX["FAILURE_ALARM_WINDOW"], ["FAILURE_ALARM_MIN"] and
  ["FAILURE_ALARM_SHARE"] as "window,min,share"
- OUTBOX_TEST_TIME_ZONE: USE_TZ = False and TIME_ZONE = that zone, for subprocesses
  of tests/faults/test_clocks.py (a zone compiled so that its clocks go back in minutes:
  tests/zones.py)
"""

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import django
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent
SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
if os.environ.get("OUTBOX_TEST_TIME_ZONE"):
    USE_TZ = False
    TIME_ZONE = os.environ["OUTBOX_TEST_TIME_ZONE"]
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "tests.urls"
DEFAULT_FROM_EMAIL = "outbox-tests@example.com"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# Fast hashing: tests log users in (password reset flow, admin).
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "outbox",
    # The ESP event hook (tests/contrib/test_anymail.py) is fed by anymail's own webhook view.
    "anymail",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # Email templates of tests/test_rendering.py (outbox_test/...).
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

_db = os.environ.get("OUTBOX_TEST_DB", "sqlite")
_name_override = os.environ.get("OUTBOX_TEST_DB_NAME")
if _db == "postgres":
    _pg_name = os.environ.get("OUTBOX_TEST_PG_NAME", "outbox")
    DATABASES: dict[str, dict[str, Any]] = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": _name_override or _pg_name,
            "USER": os.environ.get("OUTBOX_TEST_PG_USER", "postgres"),
            "HOST": os.environ.get("OUTBOX_TEST_PG_HOST", "127.0.0.1"),
            "PORT": os.environ.get("OUTBOX_TEST_PG_PORT", "5432"),
            "TEST": {"NAME": f"test_{_pg_name}"},
        }
    }
    if os.environ.get("OUTBOX_TEST_PG_PREPARE_THRESHOLD"):
        # psycopg's prepared statements (off by default in Django): one cell
        # runs the worker's prepared hot path.
        DATABASES["default"]["OPTIONS"] = {
            "prepare_threshold": int(os.environ["OUTBOX_TEST_PG_PREPARE_THRESHOLD"])
        }
    if os.environ.get("OUTBOX_TEST_PG_BOUNCER"):
        # Transaction pooling: a server-side cursor (QuerySet.iterator()) would
        # outlive the transaction that holds its server connection.
        DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
    # A project that routes the outbox to a database of its own (tests/models/test_routing.py).
    DATABASES["routed"] = {
        **DATABASES["default"],
        "NAME": os.environ.get("OUTBOX_TEST_ROUTED_DB_NAME") or f"{_pg_name}_routed",
        "TEST": {"NAME": f"test_{_pg_name}_routed"},
    }
    if os.environ.get("OUTBOX_TEST_ROUTED"):
        DATABASE_ROUTERS = ["tests.routers.OutboxRouter"]
else:
    # A file, not :memory:, so that worker subprocesses and threads share it.
    _sqlite_dir = os.environ.get("OUTBOX_TEST_SQLITE_DIR", tempfile.gettempdir())
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": _name_override or os.path.join(_sqlite_dir, "outbox.sqlite3"),
            "TEST": {"NAME": os.path.join(_sqlite_dir, "test_outbox.sqlite3")},
            "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 30},
        }
    }
    if os.environ.get("OUTBOX_TEST_SQLITE_OPTIONS") == "startproject":
        # Django's defaults, as startproject leaves them (tests/enqueue/test_turns.py).
        del DATABASES["default"]["OPTIONS"]

# The fast lane runs pytest-xdist workers (gw0, gw1, ...), one redis-server each: its
# OUTBOX_TEST_REDIS_URL is their URLs, separated by spaces, and each worker (and the
# subprocesses it starts, which inherit PYTEST_XDIST_WORKER) takes its own by number.
# A server of its own, not a database number of a shared one: tests read the server's
# clients (CLIENT LIST), which database numbers do not separate.
_redis_urls = os.environ.get("OUTBOX_TEST_REDIS_URL", "redis://127.0.0.1:6379/0").split()
_xdist_worker = int((os.environ.get("PYTEST_XDIST_WORKER") or "gw0").removeprefix("gw"))
if len(_redis_urls) > 1 and _xdist_worker >= len(_redis_urls):
    raise ImproperlyConfigured(
        f"pytest-xdist worker gw{_xdist_worker} has no redis-server: OUTBOX_TEST_REDIS_URL names"
        f" {len(_redis_urls)} (tests/run.sh --fast starts OUTBOX_TEST_JOBS of them: set that"
        " rather than -n)"
    )
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": _redis_urls[_xdist_worker] if len(_redis_urls) > 1 else _redis_urls[0],
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 2, "SOCKET_TIMEOUT": 5},
    }
}

if os.environ.get("OUTBOX_TEST_REDIS_TOPOLOGY"):
    from tests.topologies import cache_from_env

    CACHES["default"] = cache_from_env(os.environ["OUTBOX_TEST_REDIS_TOPOLOGY"])

OUTBOX = {
    "HEARTBEAT_INTERVAL": float(os.environ.get("OUTBOX_TEST_HEARTBEAT_INTERVAL", "0.5")),
    "HEARTBEAT_TIMEOUT": float(os.environ.get("OUTBOX_TEST_HEARTBEAT_TIMEOUT", "3")),
    "RETRY_BACKOFF": (0.2, 1.0),
    "BLOCK_TIMEOUT": 0.2,
    # tests/urls.py routes the metrics, which need a token (else outbox.W004).
    "METRICS_TOKEN": "tests-only-metrics-token",
}
if os.environ.get("OUTBOX_TEST_ABANDONED_POLICY"):
    OUTBOX["ABANDONED_POLICY"] = os.environ["OUTBOX_TEST_ABANDONED_POLICY"]
if os.environ.get("OUTBOX_TEST_SEND_TIMEOUT"):
    OUTBOX["SEND_TIMEOUT"] = float(os.environ["OUTBOX_TEST_SEND_TIMEOUT"])
if os.environ.get("OUTBOX_TEST_POSTFIX_LOG"):
    # A worker with a log reconciler configured names each row's server before the send.
    OUTBOX["RECONCILERS"] = ["outbox.reconcilers.PostfixLogReconciler"]
    OUTBOX["POSTFIX_LOG"] = os.environ["OUTBOX_TEST_POSTFIX_LOG"]
if os.environ.get("OUTBOX_TEST_RATE_LIMITS"):
    OUTBOX["RATE_LIMITS"] = json.loads(os.environ["OUTBOX_TEST_RATE_LIMITS"])
if os.environ.get("OUTBOX_TEST_MAILER_PAUSE"):
    _base, _cap = os.environ["OUTBOX_TEST_MAILER_PAUSE"].split(",")
    OUTBOX["MAILER_PAUSE"] = (float(_base), float(_cap))
if os.environ.get("OUTBOX_TEST_FAILURE_ALARM"):
    _window, _least, _share = os.environ["OUTBOX_TEST_FAILURE_ALARM"].split(",")
    OUTBOX["FAILURE_ALARM_WINDOW"] = float(_window)
    OUTBOX["FAILURE_ALARM_MIN"] = int(_least)
    OUTBOX["FAILURE_ALARM_SHARE"] = float(_share)

# Email, configured as a project using the outbox would be: the project's own
# mail goes into the outbox (OutboxBackend), and the worker delivers through a
# second backend: locmem, or what a worker subprocess is told by
#   OUTBOX_TEST_EMAIL_BACKEND   a backend path
#   OUTBOX_TEST_SMTP_PORT       SMTP to 127.0.0.1:<port> (a test's SMTPRecorder)
#   OUTBOX_TEST_EMAIL_FILE_PATH the file backend's directory
# Django 6.1 is configured with MAILERS (the worker uses the "delivery" mailer),
# Django 5.2 with EMAIL_BACKEND and OUTBOX["EMAIL_BACKEND"]: neither warns.
# In the pytest process Django's test runner replaces EMAIL_BACKEND (5.2), or
# every mailer (6.1), with locmem; tests that send through the outbox backend
# set it themselves (see tests/backends/test_outbox.py).
_USE_MAILERS = django.VERSION >= (6, 1)
_delivery_backend = os.environ.get(
    "OUTBOX_TEST_EMAIL_BACKEND", "django.core.mail.backends.locmem.EmailBackend"
)
_delivery_options: dict[str, object] = {}
if os.environ.get("OUTBOX_TEST_SMTP_PORT"):
    _delivery_backend = "django.core.mail.backends.smtp.EmailBackend"
    _delivery_options = {"host": "127.0.0.1", "port": int(os.environ["OUTBOX_TEST_SMTP_PORT"])}
if os.environ.get("OUTBOX_TEST_EMAIL_FILE_PATH"):
    _delivery_options["file_path"] = os.environ["OUTBOX_TEST_EMAIL_FILE_PATH"]

if _USE_MAILERS:
    MAILERS = {
        "default": {"BACKEND": "outbox.backends.OutboxBackend"},
        "delivery": {"BACKEND": _delivery_backend, "OPTIONS": _delivery_options},
    }
    OUTBOX["MAILER"] = "delivery"
    if os.environ.get("OUTBOX_TEST_BULK_BACKEND"):
        MAILERS["bulk"] = {"BACKEND": os.environ["OUTBOX_TEST_BULK_BACKEND"]}
else:
    EMAIL_BACKEND = "outbox.backends.OutboxBackend"
    OUTBOX["EMAIL_BACKEND"] = _delivery_backend
    if "host" in _delivery_options:
        EMAIL_HOST = _delivery_options["host"]
        EMAIL_PORT = _delivery_options["port"]
    if "file_path" in _delivery_options:
        EMAIL_FILE_PATH = _delivery_options["file_path"]
    if os.environ.get("OUTBOX_TEST_BULK_BACKEND"):
        OUTBOX["BACKENDS"] = {"bulk": os.environ["OUTBOX_TEST_BULK_BACKEND"]}

LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"outbox": {"handlers": ["console"], "level": "INFO"}},
}
if os.environ.get("OUTBOX_TEST_SQLITE_OPTIONS") == "startproject":
    # The runserver of tests/enqueue/test_turns.py says why a request failed.
    LOGGING["loggers"]["django.request"] = {"handlers": ["console"], "level": "ERROR"}

# anymail's Mailgun tracking webhook (tests/contrib/test_anymail.py): the requests
# are signed with this key and carry this basic-auth secret, as Mailgun's would.
ANYMAIL = {
    "MAILGUN_WEBHOOK_SIGNING_KEY": "tests-only-mailgun-signing-key",
    "WEBHOOK_SECRET": "tests:only-webhook-secret",
}
# The fake ESP (tests/esp.py): anymail's backends send to it, for worker subprocesses.
if os.environ.get("OUTBOX_TEST_ESP_URL"):
    from tests.esp import anymail_settings

    ANYMAIL = anymail_settings(
        os.environ["OUTBOX_TEST_ESP_URL"], float(os.environ.get("OUTBOX_TEST_ESP_TIMEOUT", "1"))
    )
    if "OUTBOX_TEST_POSTMARK_TOKEN" in os.environ:
        ANYMAIL["POSTMARK_SERVER_TOKEN"] = os.environ["OUTBOX_TEST_POSTMARK_TOKEN"]
        if not ANYMAIL["POSTMARK_SERVER_TOKEN"]:
            del ANYMAIL["POSTMARK_SERVER_TOKEN"]
