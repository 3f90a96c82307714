"""The ``OUTBOX`` settings dict, read live with typed defaults.

All of the app's configuration lives in one dict in the project's settings::

    OUTBOX = {
        "REDIS_CACHE": "default",
        "MAX_ATTEMPTS": 5,
    }

Values are read on every access (not cached at import), so ``override_settings``
works in tests and a changed setting is seen without re-importing anything.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured

DEFAULTS: dict[str, Any] = {
    # django-redis cache alias whose connection carries the queue.
    "REDIS_CACHE": "default",
    # Prefix of every Redis key; it is also the Redis Cluster hash tag.
    "KEY_PREFIX": "outbox",
    # Attempts per delivery before it is marked failed (per-call override exists).
    "MAX_ATTEMPTS": 5,
    # Delivery target of the worker. None: settings.EMAIL_BACKEND (Django < 6.1) or
    # the "default" mailer (Django >= 6.1, see MAILER).
    "EMAIL_BACKEND": None,
    # Django >= 6.1: alias in settings.MAILERS the worker sends through.
    "MAILER": None,
    # Retry backoff: seconds for the first retry, and the cap. Jitter is applied.
    "RETRY_BACKOFF": (10.0, 3600.0),
    # Worker liveness.
    "HEARTBEAT_INTERVAL": 5.0,
    "HEARTBEAT_TIMEOUT": 30.0,
    # What the sweeper does with a row that was processing when its worker died:
    # "review" (mark abandoned for a person) or "requeue" (send again).
    "ABANDONED_POLICY": "review",
    # Seconds one send may take, as a whole (connect, dialogue, body and reply;
    # a sendmail child from start to exit). It bounds how long one stalled or
    # trickling server holds a sending thread, and so how long SIGTERM can
    # take; a project's own shorter timeout is kept.
    "SEND_TIMEOUT": 60.0,
    # To an SMTP server that offers PIPELINING (RFC 2920), MAIL, RCPT and DATA
    # go in one write: one round trip before the body instead of three.
    # False: one command at a time, as smtplib sends them.
    "SMTP_PIPELINING": True,
    # Path of the sendmail binary for outbox.backends.SendmailBackend.
    "SENDMAIL_PATH": "/usr/sbin/sendmail",
    # Domain of generated Message-IDs; None: the from address's domain.
    "MESSAGE_ID_DOMAIN": None,
    # The drop-in backend accepts the addresses Django accepts (a bare local
    # part, a non-ASCII local part); True: only full, ASCII-local-part
    # addresses, as enqueue_email always checks.
    "STRICT_ADDRESSES": False,
    # How many ids a worker thread takes from Redis in one round trip.
    "CLAIM_BATCH": 10,
    # Seconds a worker blocks on an empty queue before looking again.
    "BLOCK_TIMEOUT": 1.0,
    # The sweeper re-checks every queued row against Redis at least this often.
    "MIRROR_FULL_SCAN_INTERVAL": 3600.0,
    # Bearer token a Prometheus scrape of outbox.urls' "metrics" must present.
    # None: the endpoint answers 404 (and a system check warns if it is routed).
    "METRICS_TOKEN": None,
    # -- sending control (outbox.queue.ratelimit, outbox.queue.control) --
    # Sending limits shared by every worker: {"*": "14/s", "gmail.com": "20/m"}.
    # "*" is all sending together; any other key is a recipient domain (exact,
    # lower-cased). Units /s /m /h /d; sends are spaced evenly.
    "RATE_LIMITS": {},
    # Seconds a recipient domain waits after its server answered 421 or 450.
    "THROTTLE_PENALTY": 30.0,
    # Seconds ahead a row to a paused domain is rescheduled; resume takes effect
    # within this interval.
    "PAUSED_DOMAIN_RECHECK": 10.0,
    # A mailer whose ESP refused its credential (401/403), or whose backend
    # cannot be created, is paused: the first pause and the cap, in seconds;
    # each refusal after a pause doubles it.
    "MAILER_PAUSE": (30.0, 600.0),
    # -- the failure alarm (outbox.queue.alarm) --
    # Seconds of the sliding window the alarm counts attempts over; also how
    # often the worker repeats its alarm line while the alarm lasts.
    "FAILURE_ALARM_WINDOW": 60.0,
    # A mailer's alarm is on while its failed attempts in the window reach both
    # this many and this share of its attempts (failed ones included).
    "FAILURE_ALARM_MIN": 10,
    "FAILURE_ALARM_SHARE": 0.5,
    # -- automatic settlement of abandoned rows (outbox.sweeper.reconcile) --
    # Dotted paths of outbox.reconcilers.Reconciler classes the sweeper asks
    # about abandoned rows.
    "RECONCILERS": [],
    # Abandoned rows asked about per sweep pass (the oldest first).
    "RECONCILE_BATCH": 100,
    # Seconds before a row the reconcilers could not settle is asked again.
    "RECONCILE_RETRY_AFTER": 900.0,
    # Rows abandoned longer ago than this (seconds) are left to a person.
    "RECONCILE_MAX_AGE": 7 * 86400.0,
    # Postfix's mail log, for outbox.reconcilers.PostfixLogReconciler.
    "POSTFIX_LOG": None,
    # Zone of the log's zone-less ("Nov 23 12:00:01") timestamps, e.g.
    # "Europe/Berlin". None: this host's zone (/etc/localtime), as syslog
    # writes them; never settings.TIME_ZONE.
    "POSTFIX_LOG_TIME_ZONE": None,
    # Templates, bulk mail, expiry and suppression.
    # A permanent 5xx refusal of a recipient at RCPT adds it to the suppression list.
    "SUPPRESS_ON_REFUSAL": True,
    # -- a mailer per email (outbox.mail.mailers) --
    # Delivery backends an email may name with enqueue_email(..., mailer=<key>)
    # when settings.MAILERS is not in use (Django < 6.1, or 6.1 not migrated):
    # {"bulk": "dotted.path.Backend"} or
    # {"bulk": {"BACKEND": "dotted.path.Backend", "OPTIONS": {...}}}.
    "BACKENDS": {},
    # -- the staging valve (outbox.mail.valve) --
    # Address patterns that may receive mail, shell-style and matched without
    # regard to case: ["*@example.com", "qa@shop.test"]. None: everyone.
    # Set (even to []), a copy to any other address is sent to REDIRECT_TO,
    # or cancelled when REDIRECT_TO is None.
    "ALLOWED_RECIPIENTS": None,
    # The one address that gets the copies ALLOWED_RECIPIENTS keeps from their
    # recipients, with an X-Outbox-Original-Recipient header. None: cancel them.
    "REDIRECT_TO": None,
    # -- secrets that do not linger (outbox.sweeper.retention) --
    # Seconds an email's content (texts, headers, structure, attachments) is
    # kept once all its deliveries are settled (sent, failed or cancelled);
    # then the sweeper clears it and the rows stay. None: as long as the rows.
    # Three days: Django's PASSWORD_RESET_TIMEOUT, and a weekend's failures
    # can still be requeued.
    "CONTENT_RETENTION": 3 * 86400.0,
    # URL names (as reverse() takes them, "namespace:name" too): a message whose
    # text or HTML links to a page of one of them is sensitive, its content
    # cleared at the sweeper's first pass after it is settled, e.g.
    # ["password_reset_confirm"] for Django's password reset.
    "SENSITIVE_LINKS": [],
}

PRIORITIES: tuple[str, ...] = ("high", "normal", "low")
# Settings a release has retired, with why: a project that still sets one is
# told so (check outbox.W001) instead of its key being reported as unknown.
RETIRED: dict[str, str] = {
    "POSTGRESQL_FUNCTIONS": "the PostgreSQL functions are always on",
}

ABANDONED_POLICIES: tuple[str, ...] = ("review", "requeue")


class SettingTypeError(ImproperlyConfigured, TypeError):
    """An ``OUTBOX`` number of the wrong type; the text names the key, the value and the type.

    Raised when the setting is read, and reported by check ``outbox.E005`` from
    the same reader, so what the check accepts is exactly what the code reads.
    """


def integer(name: str, value: Any) -> int:
    """``value`` of ``OUTBOX[name]`` if it is an int; 2.5, "5" and True are refused, not coerced."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise SettingTypeError(f"OUTBOX[{name!r}] = {value!r}: expected an integer")


def number(name: str, value: Any) -> float:
    """``value`` of ``OUTBOX[name]`` as a float if it is an int or a float; "60" and True are refused."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise SettingTypeError(f"OUTBOX[{name!r}] = {value!r}: expected a number")


class OutboxSettings:
    """Typed, live view of ``settings.OUTBOX`` merged over :data:`DEFAULTS`."""

    def _get(self, name: str) -> Any:
        user = getattr(django_settings, "OUTBOX", None) or {}
        return user.get(name, DEFAULTS[name])

    def _integer(self, name: str) -> int:
        return integer(name, self._get(name))

    def _number(self, name: str) -> float:
        return number(name, self._get(name))

    @property
    def user_settings(self) -> dict[str, Any]:
        value = getattr(django_settings, "OUTBOX", None)
        return value if isinstance(value, dict) else {}

    @property
    def REDIS_CACHE(self) -> str:
        return str(self._get("REDIS_CACHE"))

    @property
    def KEY_PREFIX(self) -> str:
        return str(self._get("KEY_PREFIX"))

    @property
    def MAX_ATTEMPTS(self) -> int:
        return self._integer("MAX_ATTEMPTS")

    @property
    def EMAIL_BACKEND(self) -> str | None:
        value = self._get("EMAIL_BACKEND")
        return str(value) if value else None

    @property
    def MAILER(self) -> str | None:
        value = self._get("MAILER")
        return str(value) if value else None

    def _pair(self, name: str) -> tuple[float, float]:
        value = self._get(name)
        try:
            base, cap = value
            return number(name, base), number(name, cap)
        except (TypeError, ValueError):
            raise SettingTypeError(
                f"OUTBOX[{name!r}] = {value!r}: expected a pair of numbers (base, cap)"
            ) from None

    @property
    def RETRY_BACKOFF(self) -> tuple[float, float]:
        return self._pair("RETRY_BACKOFF")

    @property
    def HEARTBEAT_INTERVAL(self) -> float:
        return self._number("HEARTBEAT_INTERVAL")

    @property
    def HEARTBEAT_TIMEOUT(self) -> float:
        return self._number("HEARTBEAT_TIMEOUT")

    @property
    def ABANDONED_POLICY(self) -> str:
        return str(self._get("ABANDONED_POLICY"))

    @property
    def SEND_TIMEOUT(self) -> float:
        return float(self._get("SEND_TIMEOUT"))

    @property
    def SMTP_PIPELINING(self) -> bool:
        return bool(self._get("SMTP_PIPELINING"))

    @property
    def SENDMAIL_PATH(self) -> str:
        return str(self._get("SENDMAIL_PATH"))

    @property
    def MESSAGE_ID_DOMAIN(self) -> str | None:
        value = self._get("MESSAGE_ID_DOMAIN")
        return str(value) if value else None

    @property
    def STRICT_ADDRESSES(self) -> bool:
        return bool(self._get("STRICT_ADDRESSES"))

    @property
    def CLAIM_BATCH(self) -> int:
        return self._integer("CLAIM_BATCH")

    @property
    def BLOCK_TIMEOUT(self) -> float:
        return self._number("BLOCK_TIMEOUT")

    @property
    def MIRROR_FULL_SCAN_INTERVAL(self) -> float:
        return self._number("MIRROR_FULL_SCAN_INTERVAL")

    @property
    def METRICS_TOKEN(self) -> str | None:
        # An empty string counts as "not set": it must never match a bare "Bearer".
        value = self._get("METRICS_TOKEN")
        return str(value) if value else None

    # -- sending control --------------------------------------------------------

    @property
    def RATE_LIMITS(self) -> dict[str, Any]:
        value = self._get("RATE_LIMITS")
        return value if isinstance(value, dict) else {}

    @property
    def THROTTLE_PENALTY(self) -> float:
        return float(self._get("THROTTLE_PENALTY"))

    @property
    def PAUSED_DOMAIN_RECHECK(self) -> float:
        return float(self._get("PAUSED_DOMAIN_RECHECK"))

    @property
    def MAILER_PAUSE(self) -> tuple[float, float]:
        return self._pair("MAILER_PAUSE")

    # -- the failure alarm --

    @property
    def FAILURE_ALARM_WINDOW(self) -> float:
        return self._number("FAILURE_ALARM_WINDOW")

    @property
    def FAILURE_ALARM_MIN(self) -> int:
        return self._integer("FAILURE_ALARM_MIN")

    @property
    def FAILURE_ALARM_SHARE(self) -> float:
        return self._number("FAILURE_ALARM_SHARE")

    # -- automatic settlement of abandoned rows --

    @property
    def RECONCILERS(self) -> list[str]:
        return [str(path) for path in self._get("RECONCILERS") or []]

    @property
    def RECONCILE_BATCH(self) -> int:
        return self._integer("RECONCILE_BATCH")

    @property
    def RECONCILE_RETRY_AFTER(self) -> float:
        return float(self._get("RECONCILE_RETRY_AFTER"))

    @property
    def RECONCILE_MAX_AGE(self) -> float:
        return float(self._get("RECONCILE_MAX_AGE"))

    @property
    def POSTFIX_LOG(self) -> str | None:
        value = self._get("POSTFIX_LOG")
        return str(value) if value else None

    @property
    def POSTFIX_LOG_TIME_ZONE(self) -> str | None:
        value = self._get("POSTFIX_LOG_TIME_ZONE")
        return str(value) if value else None

    # -- templates, bulk mail, expiry and suppression ------------------------------

    @property
    def SUPPRESS_ON_REFUSAL(self) -> bool:
        return bool(self._get("SUPPRESS_ON_REFUSAL"))

    # -- a mailer per email ------------------------------------------------------------

    @property
    def BACKENDS(self) -> dict[str, Any]:
        value = self._get("BACKENDS")
        return value if isinstance(value, dict) else {}

    # -- the staging valve -----------------------------------------------------------

    @property
    def ALLOWED_RECIPIENTS(self) -> tuple[str, ...] | None:
        value = self._get("ALLOWED_RECIPIENTS")
        if value is None:
            return None
        if isinstance(value, str):
            # One pattern, not its characters: "*" alone would let everyone through.
            return (value,)
        return tuple(str(pattern) for pattern in value)

    @property
    def REDIRECT_TO(self) -> str | None:
        value = self._get("REDIRECT_TO")
        return str(value) if value else None

    # -- secrets that do not linger --------------------------------------------------

    @property
    def CONTENT_RETENTION(self) -> float | None:
        value = self._get("CONTENT_RETENTION")
        return None if value is None else number("CONTENT_RETENTION", value)

    @property
    def SENSITIVE_LINKS(self) -> tuple[str, ...]:
        value = self._get("SENSITIVE_LINKS")
        if isinstance(value, str):
            return (value,)  # one name, not its characters
        return tuple(str(name) for name in value or ())


outbox_settings = OutboxSettings()
