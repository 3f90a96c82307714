"""Running django-anymail's own backend tests through the outbox (see tests/upstream/test_anymail_backends.py).

The tests are anymail's own, vendored unchanged in ``tests/anymail_upstream/``
(its README says from where), and imported from there as the package
``tests.anymail_upstream``. They mock anymail's HTTP layer (``requests``, by
their ``mock_requests_backend.py``) or boto3 (their Amazon SES tests), and
assert on the request anymail made.

Where mail goes: every configuration an upstream test writes names the anymail
backend under test as the default mailer (``MAILERS["default"]``, which their
``override_settings`` helper turns into ``EMAIL_BACKEND`` and ``ANYMAIL``
before Django 6.1). :func:`through_the_outbox` moves that backend behind the
outbox, as a project adopting the outbox does:

- Django 5.2: ``EMAIL_BACKEND`` is the outbox and ``OUTBOX["EMAIL_BACKEND"]``
  the anymail backend (its options stay in ``ANYMAIL``);
- Django 6.1: ``MAILERS["default"]`` is the outbox and ``OUTBOX["MAILER"]``
  names a mailer holding the upstream default mailer, its ``OPTIONS`` included.

The outbox backend is :class:`tests.django_mail.DeliveringOutboxBackend`:
``OutboxBackend`` followed by one burst worker in this process, so that the
worker's request reaches the mock the upstream test installed before ``send()``
returns. A message the worker did not deliver (its row not ``sent``) raises
:class:`tests.django_mail.DeliveryFailed` at ``send()``, naming the row's
status and last error: in the outbox an error anymail raises while sending
(the ESP's refusal, an unsupported feature, a serialization error) ends the
row in the worker, and the caller's ``send()`` has already returned. An
upstream test that expects that error from ``send()`` therefore fails, unless
the outbox refuses the message at ``send()`` itself.

The upstream configuration is rewritten where it is written: the vendored
``utils.override_settings`` (which every upstream module imports, for classes
and for single tests) is wrapped before the test modules are imported. The
files stay as anymail wrote them. :class:`OutboxAnymailMixin` checks that no
anymail backend was made outside the worker, so a test that reached anymail
around the outbox fails instead of passing unexamined.
"""

from __future__ import annotations

import importlib
import sys
import unittest
import uuid
from collections.abc import Iterable
from types import ModuleType
from typing import Any
from unittest import mock

import anymail
import requests
from anymail.backends.base import AnymailBaseBackend
from django.conf import settings

from outbox.mail.targets import HAS_MAILERS
from outbox.models import Email, Suppression
from tests import django_mail

# The release tests/anymail_upstream/ was copied from (its README).
VENDORED_VERSION = "15.1"
PACKAGE = "tests.anymail_upstream"
# The mailer the worker delivers through on Django 6.1: the upstream default mailer.
DELIVERY_MAILER = "anymail-under-test"
# The ESPs whose backend tests run: test_postmark_backend.py and its siblings.
ESPS = ("postmark", "sendgrid", "mailgun", "amazon_ses", "brevo")


def installed_version() -> str:
    return str(anymail.__version__)


def check_version() -> None:
    """Refuse to run the vendored tests against another anymail release."""
    if installed_version() != VENDORED_VERSION:
        raise RuntimeError(
            f"tests/anymail_upstream/ holds django-anymail {VENDORED_VERSION}'s tests, but"
            f" {installed_version()} is installed: pin the test extra (pyproject.toml) to"
            f" {VENDORED_VERSION}, or copy the new release's tests (tests/anymail_upstream/README.md)"
        )


_original_override: Any = None
_REAL_UUID4 = uuid.uuid4


def upstream(esp: str) -> ModuleType:
    """The upstream module ``test_<esp>_backend``, its configuration routed through the outbox."""
    global _original_override
    check_version()
    utils = importlib.import_module(f"{PACKAGE}.utils")
    if _original_override is None:
        _original_override = utils.override_settings
        utils.override_settings = through_the_outbox
    return importlib.import_module(f"{PACKAGE}.test_{esp}_backend")


def through_the_outbox(**kwargs: Any) -> Any:
    """Upstream's ``override_settings``, with the default mailer moved behind the outbox."""
    upstream_override = _original_override(**kwargs)
    options = dict(upstream_override.options)
    outbox = {k: v for k, v in settings.OUTBOX.items() if k not in ("EMAIL_BACKEND", "MAILER")}
    if "MAILERS" in options:  # Django 6.1: the upstream helper passes MAILERS on
        mailers = dict(options["MAILERS"])
        mailers[DELIVERY_MAILER] = mailers.pop("default")
        mailers["default"] = {"BACKEND": django_mail.DELIVERING_BACKEND}
        options["MAILERS"] = mailers
        options["OUTBOX"] = {**outbox, "MAILER": DELIVERY_MAILER}
    elif "EMAIL_BACKEND" in options:  # before 6.1: the helper made it of MAILERS
        options["OUTBOX"] = {**outbox, "EMAIL_BACKEND": options["EMAIL_BACKEND"]}
        options["EMAIL_BACKEND"] = django_mail.DELIVERING_BACKEND
    return type(upstream_override)(**options)


def _no_real_request(session: Any, request: Any, **kwargs: Any) -> Any:
    raise AssertionError(f"a real HTTP request to {request.url} (the test mocks none)")


class SentAroundTheOutbox(AssertionError):
    """An anymail backend was made outside the worker: the test did not go through the outbox."""


class OutboxAnymailMixin:
    """Put before an upstream anymail ``TestCase``: its mail goes through the outbox.

    The outbox needs the database: its rows are deleted after each test (Redis
    is emptied before each by tests/conftest.py's autouse fixture).
    """

    databases = {"default"}

    def setUp(self) -> None:
        # A refusal the worker recorded would suppress the next test's recipients.
        self.addCleanup(Suppression.objects.all().delete)  # type: ignore[attr-defined]
        self.addCleanup(Email.objects.all().delete)  # type: ignore[attr-defined]
        self.anymail_made_outside: list[str] = []
        original_init = AnymailBaseBackend.__init__
        case = self

        def watched_init(backend: AnymailBaseBackend, *args: Any, **kwargs: Any) -> None:
            if not django_mail.delivering():
                case.anymail_made_outside.append(type(backend).__name__)
            original_init(backend, *args, **kwargs)

        patcher = mock.patch.object(AnymailBaseBackend, "__init__", watched_init)
        patcher.start()
        self.addCleanup(patcher.stop)  # type: ignore[attr-defined]
        # Upstream mocks requests.Session.request, above this; where a case
        # does not, the worker must not reach the real ESP over the network.
        refused = mock.patch.object(requests.Session, "send", _no_real_request)
        refused.start()
        self.addCleanup(refused.stop)  # type: ignore[attr-defined]
        super().setUp()  # type: ignore[misc]
        self._keep_mocked_uuid4_for_anymail()

    def _keep_mocked_uuid4_for_anymail(self) -> None:
        """A mock of ``uuid.uuid4`` set by the upstream test answers anymail's calls only.

        SendGrid's tests patch ``anymail.backends.sendgrid.uuid.uuid4``, which
        is the ``uuid`` module's own: in this process the outbox's calls (the
        worker's name, claim tokens) would take the test's few values meant
        for anymail's message ids.
        """
        mocked = uuid.uuid4
        if mocked is _REAL_UUID4:
            return

        def uuid4() -> Any:
            caller = sys._getframe(1).f_globals.get("__name__", "")
            return mocked() if caller.startswith("anymail.") else _REAL_UUID4()

        patcher = mock.patch.object(uuid, "uuid4", uuid4)
        patcher.start()
        self.addCleanup(patcher.stop)  # type: ignore[attr-defined]

    def _callTestMethod(self, method: Any) -> None:
        # unittest's hook around the test method alone (an expected failure
        # wraps the method, so this check counts as part of the test).
        super()._callTestMethod(method)  # type: ignore[misc]
        if self.anymail_made_outside:
            raise SentAroundTheOutbox(
                f"{', '.join(self.anymail_made_outside)} made outside the outbox's worker"
            )


def upstream_classes(module: ModuleType) -> list[type]:
    """The ``TestCase`` classes ``module`` defines that have tests of their own or inherited."""
    loader = unittest.TestLoader()
    return [
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, unittest.TestCase)
        and value.__module__ == module.__name__
        and loader.getTestCaseNames(value)
    ]


def case(upstream_class: type, *, expected_failures: dict[str, str], module: str) -> type:
    """A subclass of ``upstream_class`` run through the outbox.

    ``expected_failures``: method name -> why it fails through the outbox;
    each is marked ``unittest.expectedFailure``, so one that passes is
    reported as an unexpected success (a failure under pytest).
    """
    namespace: dict[str, Any] = {
        "__module__": module,
        "__doc__": f"Upstream {upstream_class.__qualname__} (anymail {VENDORED_VERSION})"
        f" through the outbox ({'MAILERS' if HAS_MAILERS else 'EMAIL_BACKEND'}).",
        # Upstream tags each class with its ESP's name, for anymail's own runner;
        # pytest-django would make them markers, which --strict-markers refuses.
        "tags": frozenset(),
    }
    for name in expected_failures:
        method = getattr(upstream_class, name)
        namespace[name] = unittest.expectedFailure(_same_function(method))
    return type(f"Outbox{upstream_class.__name__}", (OutboxAnymailMixin, upstream_class), namespace)


def _same_function(method: Any) -> Any:
    """A wrapper of ``method``: expectedFailure marks a function, which must not be upstream's own."""

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        return method(self, *args, **kwargs)

    wrapper.__name__ = method.__name__
    wrapper.__qualname__ = method.__qualname__
    wrapper.__doc__ = method.__doc__
    return wrapper


def names(classes: Iterable[type]) -> set[str]:
    """``Class.test_name`` of every test of ``classes``."""
    loader = unittest.TestLoader()
    return {f"{cls.__name__}.{name}" for cls in classes for name in loader.getTestCaseNames(cls)}
