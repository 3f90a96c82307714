"""Django's own mail tests, unmodified, through OutboxBackend and a burst worker (issue 25).

``tests/mail/`` of the installed Django's sdist (fetched by tests/run.sh, see
tests/django_mail.py) runs as a client of the outbox: every message a test sends
goes into the outbox through ``OutboxBackend``, a burst worker delivers it to
Django's locmem backend, and the upstream assertions read what was delivered.

Collected (each a subclass of the upstream class; nothing else of it changes):

- Django 5.2, ``EMAIL_BACKEND`` configuration: ``MailTests`` and
  ``MailTimeZoneTests`` as a fidelity run (``EmailMessage.message()`` answered
  by the delivered copy), ``LocmemBackendTests`` with the outbox as the backend
  under test, ``SendTestEmailManagementCommand``.
- Django 6.1: ``EmailMessageTests`` (fidelity), ``SendMailTests``,
  ``SendMassMailTests`` and ``MailAdminsAndManagersTests`` in the
  ``EMAIL_BACKEND`` configuration (upstream's compatibility classes), their
  ``...WithMailers`` subclasses in the ``MAILERS`` configuration, and
  ``LocmemBackendTests`` and ``SendTestEmailManagementCommand`` with ``MAILERS``.

Not collected, as not about sending through a project's backend: the SMTP,
file, console and dummy backends' own tests, ``get_connection()`` and the
mailers handler (``GetConnectionTests``, test_handler.py), settings
deprecations (test_deprecated.py, ``MailDeprecatedPositionalArgsTests``),
``sanitize_address`` and Python's own email state (``DeprecatedInternalsTests``,
``PythonGlobalState``, ``LegacyAPINotUsedTests``), and in the collected classes
the cases listed in ``NOT_COLLECTED`` (a backend the test names itself, or
argument checks made before any backend is reached).

In the fidelity run, a message without any recipient is sent with one Bcc
recipient added (Django's ``message()`` is the same with or without it), and a
case in which nothing reached the outbox (it checks only the ``EmailMessage``
object) is reported as skipped, "not a fidelity case".

The upstream cases that cannot apply to a queue are skipped with their reason
(``BY_DESIGN``, listed below). Any other failure is a difference from Django.
"""

from __future__ import annotations

import django
import pytest

from outbox.mail.targets import HAS_MAILERS
from tests import django_mail
from tests.cells import only_in_cells

pytestmark = [
    only_in_cells(
        "5.2:sqlite",
        "6.1:sqlite",
        why="the outbox's fidelity to Django's mail API does not depend on the database",
    ),
    # pytest-django creates the test database only for tests that ask for it;
    # for a Django unittest class the mark does nothing else (its
    # ``databases`` lets it in, tests/django_mail.py cleans up).
    pytest.mark.django_db,
]

# Why an upstream case cannot apply to a queue.
SENT_USING = (
    "sent_using is the alias of the mailer the worker delivers through"
    " (OUTBOX['MAILER']), not the alias the message was sent with"
)
COPIES = "one copy per envelope recipient: a message to N recipients is N messages in mail.outbox"
OWN_CLASS = (
    "names the backend class under test: it expects the class to be called"
    " EmailBackend, and BaseEmailBackend's deprecation of fail_silently, which"
    " OutboxBackend keeps as an option of its own (as upstream says a backend may)"
)
IDENTITY = (
    "the delivered copy's parts are rebuilt from the stored email: equal in"
    " content, but not the object the test attached (email.message.Message"
    " compares by identity)"
)
MESSAGE_ID = (
    "every copy carries the outbox's own Message-ID (unique per copy, for"
    " reconciliation), not one made from DNS_NAME"
)
STORED_TEXT = (
    "a body holding lone surrogates (bytes smuggled in with surrogateescape) is"
    " not Unicode text a database column can hold: the outbox refuses it before"
    " anything is written, with InvalidEmailError"
)

# "Class.test_name" -> why it cannot apply to a queue. The class is the
# upstream class that defines or inherits the case: an entry applies to the
# collected classes that have it in their bases. "5.2:" or "6.1:" in front
# limits an entry to one Django version.
BY_DESIGN: dict[str, str] = {
    # Django 5.2
    "5.2:MailTests.test_non_ascii_dns_non_unicode_email": MESSAGE_ID,
    "5.2:MailTests.test_decoded_attachments_MIMEText": IDENTITY,
    "5.2:MailTests.test_nonascii_as_string_with_ascii_charset": STORED_TEXT,
    "5.2:LocmemBackendTests.test_idn_send": COPIES,
    "5.2:LocmemBackendTests.test_lazy_addresses": COPIES,
    "5.2:LocmemBackendTests.test_message_cc_header": COPIES,
    # Django 6.1
    "6.1:EmailMessageTests.test_non_ascii_dns_non_unicode_email": MESSAGE_ID,
    "6.1:EmailMessageTests.test_decoded_attachment_text_MIMEPart": IDENTITY,
    "6.1:EmailMessageTests.test_idn_addresses": COPIES,
    "6.1:EmailMessageTests.test_lazy_addresses": COPIES,
    "6.1:EmailMessageTestsWithMailers.test_send": SENT_USING,
    "6.1:EmailMessageTestsWithMailers.test_send_using": SENT_USING,
    "6.1:SendMailTestsWithMailers.test_sends_using_default_mailer": SENT_USING,
    "6.1:SendMailTestsWithMailers.test_using_arg": SENT_USING,
    "6.1:SendMassMailTests.test_send_mass_mail": COPIES,
    "6.1:SendMassMailTestsWithMailers.test_sends_using_default_mailer": SENT_USING,
    "6.1:SendMassMailTestsWithMailers.test_using_arg": SENT_USING,
    "6.1:MailAdminsAndManagersTests.test_mail_admins_and_managers": COPIES,
    "6.1:MailAdminsAndManagersTests.test_deprecated_admins_managers_tuples": COPIES,
    "6.1:MailAdminsAndManagersTestsWithMailers.test_sends_using_default_mailer": SENT_USING,
    "6.1:MailAdminsAndManagersTestsWithMailers.test_using_arg": SENT_USING,
    "6.1:LocmemBackendTests.test_fail_silently_arg_accepted": OWN_CLASS,
    "6.1:LocmemBackendTests.test_unknown_kwargs_ignored": OWN_CLASS,
    "6.1:SendTestEmailManagementCommand.test_using_default": SENT_USING,
    "6.1:SendTestEmailManagementCommand.test_using_option": SENT_USING,
    "6.1:SendTestEmailManagementCommand.test_using_option_with_admins": f"{COPIES}; {SENT_USING}",
    "6.1:SendTestEmailManagementCommand.test_using_option_with_managers": f"{COPIES}; {SENT_USING}",
    # Both
    "SendTestEmailManagementCommand.test_multiple_receivers": COPIES,
    "SendTestEmailManagementCommand.test_admin_receivers": COPIES,
    "SendTestEmailManagementCommand.test_manager_receivers": COPIES,
    "SendTestEmailManagementCommand.test_manager_and_admin_receivers": COPIES,
}

# Why an upstream case in a collected class is not about sending through the
# project's backend.
NAMES_BACKEND = "sends through a backend the test names itself, not the project's"
ARGUMENTS = "an argument or settings check that Django makes before any backend is used"

# "Class.test_name" -> why it is left out (as BY_DESIGN).
NOT_COLLECTED: dict[str, str] = {
    # Django 5.2
    "5.2:MailTests.test_dummy_backend": NAMES_BACKEND,
    "5.2:MailTests.test_custom_backend": NAMES_BACKEND,
    "5.2:MailTests.test_connection_arg": NAMES_BACKEND,
    "5.2:MailTests.test_backend_arg": "get_connection() with a backend path",
    "5.2:MailTests.test_arbitrary_keyword": "get_connection()'s keyword arguments",
    "5.2:MailTests.test_sanitize_address": "sanitize_address(), a helper of the SMTP backend",
    "5.2:MailTests.test_sanitize_address_invalid": "sanitize_address()",
    "5.2:MailTests.test_sanitize_address_header_injection": "sanitize_address()",
    "5.2:LocmemBackendTests.test_locmem_shared_messages": NAMES_BACKEND,
    "5.2:LocmemBackendTests.test_wrong_admins_managers": ARGUMENTS,
    # Django 6.1
    "6.1:SendMailTests.test_connection_arg": NAMES_BACKEND,
    "6.1:SendMailTests.test_auth_passed_to_backend_init": NAMES_BACKEND,
    "6.1:SendMailTests.test_fail_silently_passed_to_backend_init": NAMES_BACKEND,
    "6.1:SendMailTests.test_fail_silently_conflict": ARGUMENTS,
    "6.1:SendMailTests.test_auth_conflict": ARGUMENTS,
    "6.1:SendMailTests.test_using_connection_conflict": ARGUMENTS,
    "6.1:SendMailTests.test_using_fail_silently_conflict": ARGUMENTS,
    "6.1:SendMailTests.test_using_auth_conflict": ARGUMENTS,
    "6.1:SendMassMailTests.test_connection_arg": NAMES_BACKEND,
    "6.1:SendMassMailTests.test_auth_passed_to_backend_init": NAMES_BACKEND,
    "6.1:SendMassMailTests.test_fail_silently_passed_to_backend_init": NAMES_BACKEND,
    "6.1:SendMassMailTests.test_send_fail_silently_conflict": ARGUMENTS,
    "6.1:SendMassMailTests.test_send_auth_conflict": ARGUMENTS,
    "6.1:SendMassMailTests.test_using_connection_conflict": ARGUMENTS,
    "6.1:SendMassMailTests.test_using_fail_silently_conflict": ARGUMENTS,
    "6.1:MailAdminsAndManagersTests.test_connection_arg_mail_admins": NAMES_BACKEND,
    "6.1:MailAdminsAndManagersTests.test_connection_arg_mail_managers": NAMES_BACKEND,
    "6.1:MailAdminsAndManagersTests.test_mail_admins_fail_silently_conflict": ARGUMENTS,
    "6.1:MailAdminsAndManagersTests.test_mail_managers_fail_silently_conflict": ARGUMENTS,
    "6.1:MailAdminsAndManagersTests.test_wrong_admins_managers": ARGUMENTS,
    "6.1:LocmemBackendTests.test_adds_sent_using_attribute": NAMES_BACKEND,
    # Both
    "SendTestEmailManagementCommand.test_missing_receivers": ARGUMENTS,
    "6.1:SendTestEmailManagementCommand.test_using_nonexistent_mailer": ARGUMENTS,
}

if django_mail.fetched():
    _available = True
elif django_mail.required():
    raise RuntimeError(
        f"Django's mail tests are not in {django_mail.upstream_dir()}:"
        " tests/run.sh fetches them (ensure_django_mail_tests in tests/lib.sh)"
    )
else:
    _available = False
    pytest.skip(
        "Django's mail tests are not fetched: run tests/run.sh, or"
        " `source tests/lib.sh; ensure_django_mail_tests .venv`",
        allow_module_level=True,
    )


def _collected() -> list[tuple[type, str, bool]]:
    """(upstream class, configuration, fidelity) for the installed Django."""
    tests = django_mail.upstream("tests")
    sendtestemail = django_mail.upstream("test_sendtestemail").SendTestEmailManagementCommand
    if not HAS_MAILERS:
        return [
            (tests.MailTests, "email_backend", True),
            (tests.MailTimeZoneTests, "email_backend", True),
            (tests.LocmemBackendTests, "email_backend", False),
            (sendtestemail, "email_backend", False),
        ]
    backends = django_mail.upstream("test_backends")
    return [
        (tests.EmailMessageTests, "email_backend", True),
        (tests.EmailMessageTestsWithMailers, "mailers", True),
        (tests.SendMailTests, "email_backend", False),
        (tests.SendMailTestsWithMailers, "mailers", False),
        (tests.SendMassMailTests, "email_backend", False),
        (tests.SendMassMailTestsWithMailers, "mailers", False),
        (tests.MailAdminsAndManagersTests, "email_backend", False),
        (tests.MailAdminsAndManagersTestsWithMailers, "mailers", False),
        (backends.LocmemBackendTests, "mailers", False),
        (sendtestemail, "mailers", False),
    ]


def _here(table: dict[str, str]) -> dict[str, str]:
    """The entries of ``table`` for the installed Django, without the version."""
    version = ".".join(django.get_version().split(".")[:2])
    here = {}
    for key, why in table.items():
        wanted, _, name = key.rpartition(":")
        if wanted in ("", version):
            here[name] = why
    return here


def _of(upstream_class: type, table: dict[str, str]) -> dict[str, str]:
    """The entries of ``table`` (``_here``) for ``upstream_class``, by test name."""
    bases = {base.__name__ for base in upstream_class.__mro__}
    return {
        name: why
        for key, why in table.items()
        for cls, _, name in [key.partition(".")]
        if cls in bases
    }


_COLLECTED = _collected()
_BY_DESIGN = _here(BY_DESIGN)
_NOT_COLLECTED = _here(NOT_COLLECTED)


def test_every_listed_case_exists():
    """A stale entry in BY_DESIGN or NOT_COLLECTED would hide nothing and say something false."""
    for table in (_BY_DESIGN, _NOT_COLLECTED):
        for key in table:
            cls, _, name = key.partition(".")
            assert any(
                cls in {base.__name__ for base in upstream.__mro__}
                and callable(getattr(upstream, name, None))
                for upstream, _style, _fidelity in _COLLECTED
            ), f"{key} is not a test of a collected upstream class"


for _upstream, _style, _fidelity in _COLLECTED:
    _case = django_mail.case(
        _upstream,
        style=_style,
        fidelity=_fidelity,
        skips=_of(_upstream, _BY_DESIGN),
        not_collected=_of(_upstream, _NOT_COLLECTED),
    )
    globals()[_case.__name__] = _case
del _upstream, _style, _fidelity, _case

__doc__ += "\nCannot apply to a queue (BY_DESIGN):\n\n" + "\n".join(
    f"- {name}: {why}" for name, why in BY_DESIGN.items()
)
