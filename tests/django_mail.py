"""Running Django's own mail tests through the outbox (see tests/upstream/test_django_mail.py).

The tests are ``tests/mail/`` of the installed Django's sdist, fetched by the test
command into ``<venv>/django-tests/<version>/mail`` (``ensure_django_mail_tests`` in
tests/lib.sh) and imported from there as the package ``mail``, as Django's own test
runner imports them. Nothing of them is changed: the upstream classes are
subclassed, and the subclasses only say where mail goes.

Where mail goes: :class:`DeliveringOutboxBackend` is ``OutboxBackend`` (the
backend a project configures) followed by one burst worker, so that a send
returns once the worker has delivered what it queued, to Django's locmem backend,
where the upstream assertions read ``mail.outbox``. :func:`outbox_mail` configures
it in one of the two ways a project does:

- ``"email_backend"``: ``EMAIL_BACKEND`` is the outbox and the worker delivers
  through ``OUTBOX["EMAIL_BACKEND"]`` (Django 5.2; on 6.1 the deprecated
  configuration without ``MAILERS``, which upstream's compatibility classes test);
- ``"mailers"``: ``MAILERS["default"]`` is the outbox and the worker delivers
  through the mailer ``OUTBOX["MAILER"]`` (Django 6.1 only).

The fidelity run (:class:`FidelityMixin`) answers ``EmailMessage.message()``,
called by a test, with the delivered copy's ``message()``.
"""

from __future__ import annotations

import copy
import email.errors
import importlib
import os
import sys
import unittest
import warnings
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any
from unittest import mock

import django
from django.conf import settings
from django.core import mail
from django.core.mail import EmailMessage
from django.test import override_settings

from outbox.backends import OutboxBackend
from outbox.mail.targets import HAS_MAILERS
from outbox.models import Delivery, Email
from outbox.worker import Worker

LOCMEM = "django.core.mail.backends.locmem.EmailBackend"
DELIVERING_BACKEND = "tests.django_mail.DeliveringOutboxBackend"
# The envelope recipient added to a message without one (FidelityMixin).
FIDELITY_RECIPIENT = "fidelity-check@example.com"
STYLES = ("email_backend", "mailers") if HAS_MAILERS else ("email_backend",)


def upstream_dir() -> Path:
    """Where this Django's ``tests/mail`` was fetched: ``<dir>/mail``."""
    root = os.environ.get("OUTBOX_TEST_DJANGO_MAIL_TESTS") or str(Path(sys.prefix) / "django-tests")
    return Path(root) / django.__version__


def fetched() -> bool:
    return (upstream_dir() / "mail" / "tests.py").is_file()


def required() -> bool:
    """Whether the test command fetched the tests (then missing tests are an error)."""
    return bool(os.environ.get("OUTBOX_TEST_DJANGO_MAIL_TESTS"))


def upstream(name: str) -> ModuleType:
    """The upstream module ``mail.<name>`` (e.g. ``tests``, ``test_backends``)."""
    path = str(upstream_dir())
    if path not in sys.path:
        sys.path.append(path)
    package = importlib.import_module("mail")
    where = Path(package.__file__ or "").resolve().parent
    if where != (upstream_dir() / "mail").resolve():
        raise ImportError(f"the package 'mail' is {where}, not Django's tests/mail")
    if not hasattr(email.errors, "HeaderWriteError"):
        # Python 3.12 before 3.12.5 lacks it; 6.1's test_backends.py imports it
        # for an SMTP backend test (not collected) only.
        email.errors.HeaderWriteError = type(  # type: ignore[attr-defined]
            "HeaderWriteError", (email.errors.MessageError,), {}
        )
    return importlib.import_module(f"mail.{name}")


# -- Where mail goes ----------------------------------------------------------


class DeliveryFailed(AssertionError):
    """The burst worker did not deliver a message the outbox accepted."""


# Above zero while DeliveringOutboxBackend is queueing or delivering: the
# message() calls made then are the outbox's and locmem's own (FidelityMixin).
_delivering = 0


class DeliveringOutboxBackend(OutboxBackend):
    """``OutboxBackend``, then one burst worker: delivered before ``send_messages`` returns.

    Everything is the outbox's own: the messages are queued by
    ``OutboxBackend.send_messages`` (its return value is returned), and a burst
    worker delivers them as ``outbox_worker --burst`` would. A delivery that
    does not end ``sent`` raises :class:`DeliveryFailed` with the row's status
    and last error: in production the sender would never see it, and an
    upstream test would only see a missing message.
    """

    def send_messages(self, email_messages: Iterable[EmailMessage]) -> int:  # type: ignore[override]
        global _delivering
        _delivering += 1
        try:
            count = super().send_messages(list(email_messages))
            deliver_queued()
        finally:
            _delivering -= 1
        return count


def delivering() -> bool:
    """Whether a :class:`DeliveringOutboxBackend` is queueing or delivering right now."""
    return _delivering > 0


def deliver_queued() -> None:
    before = set(Delivery.objects.exclude(status="queued").values_list("pk", flat=True))
    status = Worker(burst=True).run(install_signal_handlers=False)
    if status != 0:
        raise DeliveryFailed(f"the burst worker exited with status {status}")
    undelivered = [
        f"{d.recipient}: {d.status}, {d.last_error or 'no error recorded'}"
        for d in Delivery.objects.exclude(status="sent").exclude(pk__in=before).order_by("pk")
    ]
    if undelivered:
        raise DeliveryFailed("not delivered: " + "; ".join(undelivered))


class outbox_mail(override_settings):
    """The project's mail goes into the outbox; its worker delivers to locmem.

    ``style`` is ``"email_backend"`` or ``"mailers"`` (see the module docstring).
    On Django 6.1, ``"email_backend"`` also hides ``MAILERS`` (tests/settings.py
    defines it), as in a project that has not migrated to mailers.
    """

    def __init__(self, style: str, aliases: Iterable[str] = ("default",)) -> None:
        assert style in STYLES, style
        self.style = style
        outbox = {k: v for k, v in settings.OUTBOX.items() if k not in ("EMAIL_BACKEND", "MAILER")}
        if style == "mailers":
            options: dict[str, Any] = {
                "MAILERS": {
                    **{alias: {"BACKEND": DELIVERING_BACKEND} for alias in {"default", *aliases}},
                    "delivery": {"BACKEND": LOCMEM},
                },
                "OUTBOX": {**outbox, "MAILER": "delivery"},
            }
        else:
            options = {
                "EMAIL_BACKEND": DELIVERING_BACKEND,
                "OUTBOX": {**outbox, "EMAIL_BACKEND": LOCMEM},
            }
        super().__init__(**options)

    def enable(self) -> None:
        with warnings.catch_warnings():
            # Django 6.1 warns when the deprecated setting is set (or restored).
            warnings.filterwarnings("ignore", "The EMAIL_BACKEND setting is deprecated")
            super().enable()
        if self.style == "email_backend" and HAS_MAILERS:
            del settings.MAILERS  # hidden in this override only

    def disable(self) -> None:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "The EMAIL_BACKEND setting is deprecated")
            super().disable()


class OutboxCaseMixin:
    """Put before an upstream ``SimpleTestCase``: its mail goes through the outbox.

    The outbox needs the database: its rows are deleted after each test (Redis
    is emptied before each by tests/conftest.py's autouse fixture).
    """

    databases = {"default"}
    mail_style = "email_backend"
    # The MAILERS aliases the upstream class defines: each is an outbox mailer here.
    mail_aliases: tuple[str, ...] = ("default",)

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()  # type: ignore[misc]
        # After the upstream class's own overrides, so that this one wins;
        # a test's own @override_settings still wins over it.
        cls.enterClassContext(outbox_mail(cls.mail_style, cls.mail_aliases))  # type: ignore[attr-defined]

    def setUp(self) -> None:
        self.addCleanup(Email.objects.all().delete)  # type: ignore[attr-defined]
        super().setUp()  # type: ignore[misc]


class FidelityMixin(OutboxCaseMixin):
    """``EmailMessage.message()``, called by the test, answered by the delivered copy.

    The message is sent through the outbox (``DeliveringOutboxBackend``), and
    ``message()`` of the copy delivered to its first envelope recipient is
    returned, with the same arguments. The delivered copies are taken out of
    ``mail.outbox`` again, so the test sees only what it sent itself.

    Most upstream cases build messages without any recipient, which cannot be
    sent: a copy of such a message is sent with one Bcc recipient,
    :data:`FIDELITY_RECIPIENT`, added. Django's ``message()`` is the same with
    and without a Bcc recipient (it is in no header), so the delivered copy
    must still equal it. A test in which no message reached the outbox (it
    checks only the ``EmailMessage`` object) is skipped once it passed, as not
    a fidelity case.
    """

    def setUp(self) -> None:
        super().setUp()
        self.fidelity_calls = 0
        original = EmailMessage.message
        case = self

        def delivered_message(message: EmailMessage, *args: Any, **kwargs: Any) -> Any:
            if _delivering:  # the outbox's or locmem's own call
                return original(message, *args, **kwargs)
            sent = message
            if not message.recipients():
                sent = copy.copy(message)
                sent.bcc = [FIDELITY_RECIPIENT]
            seen = len(mail.outbox)
            DeliveringOutboxBackend().send_messages([sent])
            copies = mail.outbox[seen:]
            del mail.outbox[seen:]
            if not copies:
                raise DeliveryFailed("the outbox delivered no copy of the message")
            case.fidelity_calls += 1
            return original(first_recipients_copy(sent, copies), *args, **kwargs)

        patcher = mock.patch.object(EmailMessage, "message", delivered_message)
        patcher.start()
        self.addCleanup(patcher.stop)  # type: ignore[attr-defined]

    def _callTestMethod(self, method: Any) -> None:
        # unittest's hook around the test method alone: its outcome so far
        # includes failed subtests (tearDown's does not).
        super()._callTestMethod(method)  # type: ignore[misc]
        outcome = getattr(self, "_outcome", None)
        passed = outcome is None or outcome.success
        if passed and self.fidelity_calls == 0 and not Delivery.objects.exists():
            raise unittest.SkipTest(
                "not a fidelity case: no message of this test reached the outbox"
            )


def first_recipients_copy(message: EmailMessage, copies: list[EmailMessage]) -> EmailMessage:
    """The copy delivered to ``message``'s first envelope recipient (else the first copy)."""
    first = str(message.recipients()[0]).lower()
    for delivered in copies:
        if any(first in str(r).lower() for r in delivered.recipients()):
            return delivered
    return copies[0]


def case(
    upstream_class: type,
    *,
    style: str,
    fidelity: bool = False,
    skips: dict[str, str],
    not_collected: Iterable[str] = (),
) -> type:
    """A subclass of ``upstream_class`` run through the outbox.

    ``skips``: method name -> the reason it cannot apply to a queue.
    ``not_collected``: methods left out (not about sending).
    """
    mixin = FidelityMixin if fidelity else OutboxCaseMixin
    upstream_mailers = (getattr(upstream_class, "_overridden_settings", None) or {}).get(
        "MAILERS", {}
    )
    namespace: dict[str, Any] = {
        "mail_style": style,
        "mail_aliases": tuple(upstream_mailers) or ("default",),
        "__module__": "tests.upstream.test_django_mail",
        "__doc__": f"Upstream {upstream_class.__module__}.{upstream_class.__qualname__}"
        f" through the outbox ({style}{', fidelity' if fidelity else ''}).",
    }
    if getattr(upstream_class, "email_backend", None) is not None:
        namespace["email_backend"] = DELIVERING_BACKEND  # Django 5.2's BaseEmailBackendTests
    if getattr(upstream_class, "backend_class", None) is not None:
        namespace["backend_class"] = DeliveringOutboxBackend  # 6.1's SharedEmailBackendTests
    for name in not_collected:
        if not callable(getattr(upstream_class, name, None)):
            raise AttributeError(f"{upstream_class.__name__} has no test {name}")
        namespace[name] = None  # unittest collects only callables
    for name, reason in skips.items():
        method = getattr(upstream_class, name)  # unittest.skip wraps it, unchanged
        namespace[name] = unittest.skip(f"cannot apply to a queue: {reason}")(method)
    suffix = "Fidelity" if fidelity else ""
    label = "" if style == "email_backend" or "Mailers" in upstream_class.__name__ else "Mailers"
    return type(
        f"Outbox{upstream_class.__name__}{label}{suffix}", (mixin, upstream_class), namespace
    )
