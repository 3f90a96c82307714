"""Django settings of the benchmark project (tests/benchmark/run.sh sets the environment).

- BENCH_DB: "postgres" or "sqlite"; BENCH_PG_HOST / BENCH_PG_PORT / BENCH_PG_USER;
  BENCH_SQLITE_PATH for SQLite (a file, WAL journal, synchronous=FULL).
- BENCH_REDIS_URL: the django-redis cache the outbox queue runs on.
- BENCH_EMAIL: "noop" (django's dummy backend) or "smtp" (BENCH_SMTP_PORT on
  127.0.0.1). All three systems deliver through the same backend.
- BENCH_EMAIL "serialize": serialise every copy, keep nothing (memory.py);
  BENCH_OUTBOX_ONLY: no post_office or mailer (a worker from another virtualenv).
- BENCH_TMP: where django-mailer and django-post-office keep their lock files.
- The latency part's peers (side_by_side.py): Celery + django-celery-email
  (BENCH_CELERY_BROKER_URL, its own redis-server; peer_celery.py) and Django Tasks +
  django-tasks-db (peer_tasks.py); BENCH_CONN_MAX_AGE sets CONN_MAX_AGE (None:
  persistent); BENCH_TIMELINE (a folder) installs the timeline probe (probe.py);
  BENCH_SMTP_PIPELINING=0 turns the outbox's SMTP pipelining off (OUTBOX["SMTP_PIPELINING"]).
"""

import json
import os
import tempfile

SECRET_KEY = "bench-only-not-secret"
DEBUG = False  # DEBUG=True would keep every query in memory
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]
DEFAULT_FROM_EMAIL = "bench@example.com"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    # The admin, sessions and messages serve the dashboard part (dashboard.py).
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "outbox",
    "post_office",
    "mailer",
]
if os.environ.get("BENCH_OUTBOX_ONLY"):
    # A worker run from another virtualenv (the memory part, memory.py) needs only the outbox.
    INSTALLED_APPS = INSTALLED_APPS[:-2]
else:
    # The latency part's peers (side_by_side.py); .venv-bench has them (run.sh).
    INSTALLED_APPS += ["djcelery_email", "django_tasks", "django_tasks_db"]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.benchmark.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
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

if os.environ.get("BENCH_DB", "postgres") == "postgres":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": os.environ.get("BENCH_PG_NAME", "bench"),
            "USER": os.environ.get("BENCH_PG_USER", "postgres"),
            "HOST": os.environ.get("BENCH_PG_HOST", "127.0.0.1"),
            "PORT": os.environ.get("BENCH_PG_PORT", "5432"),
        }
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get(
                "BENCH_SQLITE_PATH", os.path.join(tempfile.gettempdir(), "bench.sqlite3")
            ),
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 60,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL",
            },
        }
    }

# Django's default. The outbox worker keeps one connection per thread anyway.
DATABASES["default"]["CONN_MAX_AGE"] = 0
if os.environ.get("BENCH_CONN_MAX_AGE"):
    # Persistent connections ("none") for the Django Tasks workers of the latency part.
    _age = os.environ["BENCH_CONN_MAX_AGE"]
    DATABASES["default"]["CONN_MAX_AGE"] = None if _age == "none" else int(_age)
_PG = DATABASES["default"]["ENGINE"].endswith("postgresql")
if os.environ.get("BENCH_PREPARE_THRESHOLD") and _PG:
    # Django's switch for psycopg's prepared statements (off by default, for
    # transaction-pooling PgBouncer). Only server-binding cursors use it: the
    # outbox's two one-statement hot paths; nothing of post_office or mailer.
    DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = int(
        os.environ["BENCH_PREPARE_THRESHOLD"]
    )

CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"),
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 2, "SOCKET_TIMEOUT": 10},
    }
}

if os.environ.get("BENCH_EMAIL", "noop") == "smtp":
    DELIVERY_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    EMAIL_HOST = "127.0.0.1"
    EMAIL_PORT = int(os.environ.get("BENCH_SMTP_PORT", "25"))
    EMAIL_TIMEOUT = 30
elif os.environ.get("BENCH_EMAIL") == "serialize":
    # Every copy built and serialised, nothing kept (the memory part, memory.py).
    DELIVERY_BACKEND = "tests.benchmark.memory.SerializingBackend"
else:
    DELIVERY_BACKEND = "django.core.mail.backends.dummy.EmailBackend"

# Every system delivers through the same backend.
EMAIL_BACKEND = DELIVERY_BACKEND
OUTBOX = {"EMAIL_BACKEND": DELIVERY_BACKEND, "METRICS_TOKEN": "bench-only-metrics-token"}
if os.environ.get("BENCH_SMTP_PIPELINING") == "0":
    OUTBOX["SMTP_PIPELINING"] = False
if os.environ.get("BENCH_RATE_LIMITS"):
    # The sending-control part (tests/benchmark/sending.py).
    OUTBOX["RATE_LIMITS"] = json.loads(os.environ["BENCH_RATE_LIMITS"])
MAILER_EMAIL_BACKEND = DELIVERY_BACKEND
_tmp = os.environ.get("BENCH_TMP", tempfile.gettempdir())
MAILER_LOCK_PATH = os.path.join(_tmp, "mailer_send")
POST_OFFICE = {"BACKENDS": {"default": DELIVERY_BACKEND}}  # everything else: defaults

# The latency part's peers (side_by_side.py). Celery + django-celery-email: the
# request's process sets EMAIL_BACKEND to djcelery_email's for its run; the worker
# sends through the same backend as everyone else.
CELERY_BROKER_URL = os.environ.get("BENCH_CELERY_BROKER_URL", "redis://127.0.0.1:6379/15")
CELERY_EMAIL_BACKEND = DELIVERY_BACKEND
CELERY_TASK_IGNORE_RESULT = True
# Django Tasks: the database backend of django-tasks-db, in the same database.
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}

if os.environ.get("BENCH_TIMELINE"):
    # The latency part's per-email timeline: once the apps are ready, wraps a few
    # public functions of the outbox in this process (tests/benchmark/probe.py).
    # Off: not imported, nothing wrapped.
    INSTALLED_APPS += ["tests.benchmark.probe.ProbeConfig"]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
