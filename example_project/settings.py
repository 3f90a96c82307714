"""A small Django project that sends its mail through the outbox.

Environment: REDIS_URL (default redis://127.0.0.1:6379/0), EXAMPLE_DB_PATH,
EXAMPLE_MAIL_DIR (where the worker writes delivered mail, one file per message).
"""

import os
from pathlib import Path

import django

BASE_DIR = Path(__file__).resolve().parent
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "example_project.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DEFAULT_FROM_EMAIL = "Example Shop <shop@example.com>"
STATIC_URL = "static/"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "outbox",
    "example_project.shop",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
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

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("EXAMPLE_DB_PATH", str(BASE_DIR / "example.sqlite3")),
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20},
    }
}

CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
    }
}

OUTBOX: dict[str, object] = {"REDIS_CACHE": "default"}
# Django's password-reset mail links to this page: its content is cleared as
# soon as it is sent, not after CONTENT_RETENTION (README, "Secrets").
OUTBOX["SENSITIVE_LINKS"] = ["password_reset_confirm"]

# On a host whose mail goes through Postfix, the sweeper can settle abandoned
# rows from Postfix's log: EXAMPLE_POSTFIX_LOG=/var/log/mail.log
if os.environ.get("EXAMPLE_POSTFIX_LOG"):
    OUTBOX["RECONCILERS"] = ["outbox.reconcilers.PostfixLogReconciler"]
    OUTBOX["POSTFIX_LOG"] = os.environ["EXAMPLE_POSTFIX_LOG"]

# The worker writes each delivered message to a file here, for you to read.
EXAMPLE_MAIL_DIR = os.environ.get("EXAMPLE_MAIL_DIR", str(BASE_DIR / "sent_mail"))

# Mail the project sends with Django's API (send_mail, password reset, error
# reports to ADMINS) goes into the outbox too; the worker delivers through the
# file backend. Django 6.1 is configured with MAILERS, 5.2 with EMAIL_BACKEND,
# so that neither version warns.
if django.VERSION >= (6, 1):
    MAILERS = {
        "default": {"BACKEND": "outbox.backends.OutboxBackend"},
        "delivery": {
            "BACKEND": "django.core.mail.backends.filebased.EmailBackend",
            "OPTIONS": {"file_path": EXAMPLE_MAIL_DIR},
        },
    }
    OUTBOX["MAILER"] = "delivery"
else:
    EMAIL_BACKEND = "outbox.backends.OutboxBackend"
    EMAIL_FILE_PATH = EXAMPLE_MAIL_DIR
    OUTBOX["EMAIL_BACKEND"] = "django.core.mail.backends.filebased.EmailBackend"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {"outbox": {"handlers": ["console"], "level": "INFO"}},
}
