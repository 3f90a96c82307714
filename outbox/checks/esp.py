"""Check of the delivery backends that are django-anymail's: each has the settings it needs.

anymail reads an ESP's settings (``POSTMARK_SERVER_TOKEN``, ``MAILGUN_API_KEY``,
...) when its backend is created, and raises ``AnymailConfigurationError`` (an
``ImproperlyConfigured``) naming the one missing. The check creates each such
backend the worker may deliver through (the default target and every mailer an
email may name) the way the worker does
(:func:`outbox.mail.mailers.get_connection`), and reports that error. Creating an anymail backend
reads settings only: its HTTP session (or boto3 client) is made by ``open()``,
which the check never calls, so nothing goes over the network. Other backends
are not created here (an SMTP backend is checked by its first connection).

Registered with the tag ``mail`` and not as a deployment check: ``manage.py
check`` reports it, and so does ``outbox_worker`` before it starts (Django runs
a command's checks first), which then refuses to start.
"""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Error
from django.utils.module_loading import import_string

from ..conf import outbox_settings
from ..mail.mailers import backend_path, delivery_mailers, get_connection
from ..mail.targets import delivery_backend_path, uses_mailers
from .settings import outbox_check


def is_anymail_class(backend_class: Any) -> bool:
    """Whether ``backend_class`` is one of django-anymail's, or a subclass of one."""
    return any(
        str(getattr(k, "__module__", "")).startswith("anymail.")
        for k in getattr(backend_class, "__mro__", ())
    )


@outbox_check("mail")
def check_esp_settings(raw: dict[str, Any]) -> list[CheckMessage]:
    """E027: an anymail delivery backend the worker cannot create (a setting is missing)."""
    errors: list[CheckMessage] = []
    for alias, where in _anymail_targets():
        try:
            get_connection(alias)
        except Exception as exc:  # ImproperlyConfigured, mostly; whatever stops the worker
            errors.append(
                Error(
                    f"The worker cannot create {where}: {type(exc).__name__}: {exc}",
                    hint="Set what it names (anymail reads ANYMAIL = {'<ESP>_<SETTING>': ...}, "
                    "or the mailer's OPTIONS), on every host that runs outbox_worker.",
                    id="outbox.E027",
                )
            )
    return errors


def _anymail_targets() -> list[tuple[str, str]]:
    """(mailer alias, how to name it) of each anymail backend the worker may deliver through."""
    found: list[tuple[str, str]] = []
    try:
        if is_anymail_class(import_string(delivery_backend_path())):
            found.append(("", _default_target()))
    except Exception:  # unresolvable: outbox.E007 says so
        pass
    default_alias = (outbox_settings.MAILER or "default") if _default_is_a_mailer() else None
    for alias in delivery_mailers():
        if alias == default_alias:
            continue  # named once, as the default
        try:
            anymail = is_anymail_class(import_string(backend_path(alias)))
        except Exception:  # outbox.E012 says so
            continue
        if anymail:
            found.append((alias, f"the mailer {alias!r}"))
    return found


def _default_is_a_mailer() -> bool:
    return not outbox_settings.EMAIL_BACKEND and uses_mailers()


def _default_target() -> str:
    if outbox_settings.EMAIL_BACKEND:
        return f"its delivery backend OUTBOX['EMAIL_BACKEND'] ({outbox_settings.EMAIL_BACKEND})"
    if _default_is_a_mailer():
        return f"its delivery mailer {outbox_settings.MAILER or 'default'!r}"
    return "its delivery backend EMAIL_BACKEND"
