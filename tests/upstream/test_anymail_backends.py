"""django-anymail's own backend tests, unmodified, through OutboxBackend and a burst worker (issue 40).

The backend tests of Postmark, SendGrid, Mailgun, Amazon SES and Brevo from
django-anymail's repository (vendored in tests/anymail_upstream/, see its
README) run as clients of the outbox: each message a test sends goes into the
outbox through ``OutboxBackend``, a burst worker in this process sends it
through the anymail backend the test configured, and the upstream assertions
read the request that reached anymail's mocked HTTP layer (boto3 for Amazon
SES). tests/anymail_suite.py says how.

Every test class of those modules is collected, as a subclass that only says
where mail goes. The cases that cannot apply to a queue are expected to fail
(``BY_DESIGN``, listed below, each with its reason): a listed case that passes
is reported as an unexpected success, so the list cannot go stale. Any other
failure is a difference from anymail alone.
"""

from __future__ import annotations

import unittest

import pytest
from anymail.backends.postmark import EmailBackend as PostmarkBackend

from tests import anymail_suite
from tests.cells import only_in_cells

pytestmark = [
    only_in_cells(
        "6.1:sqlite",
        why="the outbox's fidelity to anymail's backends does not depend on the database",
    ),
    # pytest-django creates the test database only for tests that ask for it;
    # for a Django unittest class the mark does nothing else (its
    # ``databases`` lets it in, tests/anymail_suite.py cleans up).
    pytest.mark.django_db,
]

# Why an upstream case cannot apply to a queue.
ESP_ANSWER = (
    "expects the outcome of the ESP's request (a refusal, an error status, an unparsable"
    " answer, a connection that cannot be made) at send(): through the outbox send()"
    " returns once the message is queued, and the outcome settles the row in the worker"
)
ANYMAIL_STATUS = (
    "reads anymail_status as the ESP's answer right after send(): through the outbox"
    " send() returns before any request, and the ESP's message id is on the attempt"
)
CALLER_CONNECTION = (
    "checks the caller's own connection (its construction, open/close, keyword"
    " arguments): the caller's backend is the outbox's, and the worker's connection to"
    " the ESP is made from the settings"
)
IDENTITY = (
    "asserts the exact metadata of the request: the outbox's identity of the row"
    " (outbox_delivery, outbox_token) rides in anymail's metadata beside the caller's"
    ", so that the ESP's webhooks name the row"
)
SEND_AT = (
    "expects send_at in the ESP's request (or the ESP's refusal of it): send_at is the"
    " outbox's own schedule and is not passed on (README, 'Sending through an ESP')"
)
CONFIGURATION = (
    "expects a missing or v2-only ESP credential to raise at send(): the outbox's"
    " send() does not use the ESP's backend; a configuration mistake is the worker's"
    " and the system checks' to report (issue 40, item 5)"
)

CHECKED_IN_WORKER = (
    "anymail's own check of the message (an unsupported feature, an address or a value it"
    " cannot send) runs when anymail builds the request, in the worker: the row ends"
    " failed with anymail's words (README, 'Sending through an ESP'); the test expects"
    " the error from send(). The drop-in raises anymail's error at send() only when it"
    " cannot store the message itself"
)
FAILED_RETRIED = (
    "expects a destination the ESP answered 'failed' for to be reported by send(): the"
    " outbox retries that row alone (README, 'One request per message')"
)
IDNA = (
    "a recipient whose domain IDNA cannot encode is refused at send(): every recipient"
    " is stored in its IDNA form, which the suppression list and idempotency keys match"
)
HEADER_TEXT = (
    "expects anymail's refusal of a Decimal header value: the outbox stores a header"
    " value it cannot keep as JSON as its text, as Django's backends send it"
)

# "Class.test_name" -> why it cannot apply to a queue. The class is the
# collected upstream class (which may inherit the case).
BY_DESIGN: dict[str, str] = {
    "AmazonSESBackendAnymailFeatureTests.test_send_unparsable_response": ESP_ANSWER,
    "AmazonSESBackendAnymailFeatureTests.test_template_failure": ESP_ANSWER,
    "AmazonSESBackendStandardEmailTests.test_api_failure": ESP_ANSWER,
    "AmazonSESBackendStandardEmailTests.test_api_failure_fail_silently": ESP_ANSWER,
    "AmazonSESBackendStandardEmailTests.test_session_failure_fail_silently": ESP_ANSWER,
    "BrevoBackendAnymailFeatureTests.test_send_failed_anymail_status": ESP_ANSWER,
    "BrevoBackendSessionSharingTestCase.test_caller_managed_session_closed_after_exception": ESP_ANSWER,
    "BrevoBackendSessionSharingTestCase.test_session_closed_after_exception": ESP_ANSWER,
    "BrevoBackendSessionSharingTestCase.test_session_closed_after_fail_silently_exception": ESP_ANSWER,
    "BrevoBackendStandardEmailTests.test_api_error_includes_details": ESP_ANSWER,
    "BrevoBackendStandardEmailTests.test_api_failure": ESP_ANSWER,
    "BrevoBackendStandardEmailTests.test_api_failure_fail_silently": ESP_ANSWER,
    "MailgunBackendAnymailFeatureTests.test_magnificent_api": ESP_ANSWER,
    "MailgunBackendAnymailFeatureTests.test_send_failed_anymail_status": ESP_ANSWER,
    "MailgunBackendAnymailFeatureTests.test_send_unparsable_response": ESP_ANSWER,
    "MailgunBackendAnymailFeatureTests.test_unknown_sender_domain": ESP_ANSWER,
    "MailgunBackendRecipientsRefusedTests.test_fail_silently": ESP_ANSWER,
    "MailgunBackendRecipientsRefusedTests.test_invalid_email": ESP_ANSWER,
    "MailgunBackendSessionSharingTestCase.test_caller_managed_session_closed_after_exception": ESP_ANSWER,
    "MailgunBackendSessionSharingTestCase.test_session_closed_after_exception": ESP_ANSWER,
    "MailgunBackendSessionSharingTestCase.test_session_closed_after_fail_silently_exception": ESP_ANSWER,
    "MailgunBackendStandardEmailTests.test_api_error_includes_details": ESP_ANSWER,
    "MailgunBackendStandardEmailTests.test_api_failure": ESP_ANSWER,
    "MailgunBackendStandardEmailTests.test_api_failure_fail_silently": ESP_ANSWER,
    "MailgunBackendStandardEmailTests.test_requests_exception": ESP_ANSWER,
    "MailgunBackendStandardEmailTests.test_requests_exception_fail_silently": ESP_ANSWER,
    "PostmarkBackendAnymailFeatureTests.test_send_failed_anymail_status": ESP_ANSWER,
    "PostmarkBackendAnymailFeatureTests.test_send_unparsable_response": ESP_ANSWER,
    "PostmarkBackendRecipientsRefusedTests.test_errorcode_300": ESP_ANSWER,
    "PostmarkBackendRecipientsRefusedTests.test_fail_silently": ESP_ANSWER,
    "PostmarkBackendRecipientsRefusedTests.test_from_email_invalid": ESP_ANSWER,
    "PostmarkBackendRecipientsRefusedTests.test_recipients_inactive": ESP_ANSWER,
    "PostmarkBackendRecipientsRefusedTests.test_recipients_invalid": ESP_ANSWER,
    "PostmarkBackendRecipientsRefusedTests.test_recipients_parse_error": ESP_ANSWER,
    "PostmarkBackendRecipientsRefusedTests.test_reply_to_invalid": ESP_ANSWER,
    "PostmarkBackendSessionSharingTestCase.test_caller_managed_session_closed_after_exception": ESP_ANSWER,
    "PostmarkBackendSessionSharingTestCase.test_session_closed_after_exception": ESP_ANSWER,
    "PostmarkBackendSessionSharingTestCase.test_session_closed_after_fail_silently_exception": ESP_ANSWER,
    "PostmarkBackendStandardEmailTests.test_api_error_includes_details": ESP_ANSWER,
    "PostmarkBackendStandardEmailTests.test_api_failure": ESP_ANSWER,
    "PostmarkBackendStandardEmailTests.test_api_failure_fail_silently": ESP_ANSWER,
    "SendGridBackendAnymailFeatureTests.test_send_failed_anymail_status": ESP_ANSWER,
    "SendGridBackendSessionSharingTestCase.test_caller_managed_session_closed_after_exception": ESP_ANSWER,
    "SendGridBackendSessionSharingTestCase.test_session_closed_after_exception": ESP_ANSWER,
    "SendGridBackendSessionSharingTestCase.test_session_closed_after_fail_silently_exception": ESP_ANSWER,
    "SendGridBackendStandardEmailTests.test_api_error_includes_details": ESP_ANSWER,
    "SendGridBackendStandardEmailTests.test_api_failure": ESP_ANSWER,
    "SendGridBackendStandardEmailTests.test_api_failure_fail_silently": ESP_ANSWER,
    "AmazonSESBackendAnymailFeatureTests.test_send_attaches_anymail_status": ANYMAIL_STATUS,
    "BrevoBackendAnymailFeatureTests.test_merge_data": ANYMAIL_STATUS,
    "BrevoBackendAnymailFeatureTests.test_send_attaches_anymail_status": ANYMAIL_STATUS,
    "MailgunBackendAnymailFeatureTests.test_send_attaches_anymail_status": ANYMAIL_STATUS,
    "PostmarkBackendAnymailFeatureTests.test_send_attaches_anymail_status": ANYMAIL_STATUS,
    "PostmarkBackendAnymailFeatureTests.test_send_without_to_attaches_anymail_status": ANYMAIL_STATUS,
    "PostmarkBackendRecipientsRefusedTests.test_delivery_delayed_response": ANYMAIL_STATUS,
    "PostmarkBackendRecipientsRefusedTests.test_ignore_recipient_status": ANYMAIL_STATUS,
    "PostmarkBackendRecipientsRefusedTests.test_mixed_response": ANYMAIL_STATUS,
    "SendGridBackendAnymailFeatureTests.test_batch_recipients_get_unique_message_ids": ANYMAIL_STATUS,
    "SendGridBackendAnymailFeatureTests.test_send_attaches_anymail_status": ANYMAIL_STATUS,
    "AmazonSESBackendConfigurationTests.test_client_params_in_connection_init": CALLER_CONNECTION,
    "BrevoBackendSessionSharingTestCase.test_caller_managed_connections": CALLER_CONNECTION,
    "MailgunBackendSessionSharingTestCase.test_caller_managed_connections": CALLER_CONNECTION,
    "PostmarkBackendSessionSharingTestCase.test_caller_managed_connections": CALLER_CONNECTION,
    "SendGridBackendSessionSharingTestCase.test_caller_managed_connections": CALLER_CONNECTION,
    "SendGridBackendStandardEmailTests.test_not_supported_warning": CALLER_CONNECTION,
    "AmazonSESBackendAnymailFeatureTests.test_default_omits_options": IDENTITY,
    "AmazonSESBackendAnymailFeatureTests.test_metadata": IDENTITY,
    "AmazonSESBackendAnymailFeatureTests.test_template_omits_unused_replacement_headers": IDENTITY,
    "BrevoBackendAnymailFeatureTests.test_default_omits_options": IDENTITY,
    "BrevoBackendAnymailFeatureTests.test_merge_headers": IDENTITY,
    "BrevoBackendAnymailFeatureTests.test_merge_metadata": IDENTITY,
    "BrevoBackendStandardEmailTests.test_email_message": IDENTITY,
    "MailgunBackendAnymailFeatureTests.test_default_omits_options": IDENTITY,
    "PostmarkBackendAnymailFeatureTests.test_default_omits_options": IDENTITY,
    "PostmarkBackendAnymailFeatureTests.test_merge_data": IDENTITY,
    "PostmarkBackendAnymailFeatureTests.test_merge_data_no_template": IDENTITY,
    "PostmarkBackendAnymailFeatureTests.test_merge_data_single_recipient": IDENTITY,
    "PostmarkBackendAnymailFeatureTests.test_merge_metadata": IDENTITY,
    "PostmarkBackendAnymailFeatureTests.test_merge_metadata_with_template": IDENTITY,
    "PostmarkBackendAnymailFeatureTests.test_metadata": IDENTITY,
    "SendGridBackendAnymailFeatureTests.test_default_omits_options": IDENTITY,
    "SendGridBackendAnymailFeatureTests.test_metadata": IDENTITY,
    "SendGridBackendAnymailFeatureTests.test_metadata_with_merge_metadata": IDENTITY,
    "AmazonSESBackendAnymailFeatureTests.test_send_at": SEND_AT,
    "BrevoBackendAnymailFeatureTests.test_send_at": SEND_AT,
    "MailgunBackendAnymailFeatureTests.test_send_at": SEND_AT,
    "PostmarkBackendAnymailFeatureTests.test_send_at": SEND_AT,
    "SendGridBackendAnymailFeatureTests.test_send_at": SEND_AT,
    "BrevoBackendImproperlyConfiguredTests.test_missing_auth": CONFIGURATION,
    "MailgunBackendImproperlyConfiguredTests.test_missing_api_key": CONFIGURATION,
    "PostmarkBackendImproperlyConfiguredTests.test_missing_api_key": CONFIGURATION,
    "SendGridBackendDisallowsV2Tests.test_user_pass_auth": CONFIGURATION,
    "SendGridBackendImproperlyConfiguredTests.test_missing_auth": CONFIGURATION,
    "AmazonSESBackendAnymailFeatureTests.test_template": FAILED_RETRIED,
    "AmazonSESBackendStandardEmailTests.test_non_ascii_headers": IDNA,
    "BrevoBackendStandardEmailTests.test_extra_headers_serialization_error": HEADER_TEXT,
    "MailgunBackendStandardEmailTests.test_multiple_from_emails": CHECKED_IN_WORKER,
    "PostmarkBackendStandardEmailTests.test_extra_headers_serialization_error": HEADER_TEXT,
    "PostmarkBackendStandardEmailTests.test_multiple_from_emails": CHECKED_IN_WORKER,
    "SendGridBackendAnymailFeatureTests.test_legacy_unsupported_string_conversion": CHECKED_IN_WORKER,
    "SendGridBackendStandardEmailTests.test_extra_headers_serialization_error": HEADER_TEXT,
    "AmazonSESBackendAnymailFeatureTests.test_amazon_message_tags": CHECKED_IN_WORKER,
    "AmazonSESBackendAnymailFeatureTests.test_merge_data": CHECKED_IN_WORKER,
    "AmazonSESBackendAnymailFeatureTests.test_merge_headers": CHECKED_IN_WORKER,
    "AmazonSESBackendAnymailFeatureTests.test_template_unsupported": CHECKED_IN_WORKER,
    "AmazonSESBackendAnymailFeatureTests.test_tracking": CHECKED_IN_WORKER,
    "AmazonSESBackendStandardEmailTests.test_multiple_from": CHECKED_IN_WORKER,
    "BrevoBackendAnymailFeatureTests.test_envelope_sender": CHECKED_IN_WORKER,
    "BrevoBackendAnymailFeatureTests.test_merge_headers_non_ascii": CHECKED_IN_WORKER,
    "BrevoBackendAnymailFeatureTests.test_merge_metadata_non_ascii": CHECKED_IN_WORKER,
    "BrevoBackendAnymailFeatureTests.test_metadata_non_ascii": CHECKED_IN_WORKER,
    "BrevoBackendAnymailFeatureTests.test_tracking": CHECKED_IN_WORKER,
    "BrevoBackendStandardEmailTests.test_embedded_images": CHECKED_IN_WORKER,
    "BrevoBackendStandardEmailTests.test_extra_headers_non_ascii": CHECKED_IN_WORKER,
    "BrevoBackendStandardEmailTests.test_multiple_html_alternatives": CHECKED_IN_WORKER,
    "BrevoBackendStandardEmailTests.test_non_html_alternative": CHECKED_IN_WORKER,
    "MailgunBackendAnymailFeatureTests.test_conflicting_merge_data_with_merge_metadata_and_template": CHECKED_IN_WORKER,
    "MailgunBackendAnymailFeatureTests.test_invalid_sender_domain": CHECKED_IN_WORKER,
    "MailgunBackendAnymailFeatureTests.test_invalid_sender_domain_setting": CHECKED_IN_WORKER,
    "MailgunBackendStandardEmailTests.test_alternatives_fail_silently": CHECKED_IN_WORKER,
    "MailgunBackendStandardEmailTests.test_eai_from_email_unsupported": CHECKED_IN_WORKER,
    "MailgunBackendStandardEmailTests.test_html_alternative": CHECKED_IN_WORKER,
    "MailgunBackendStandardEmailTests.test_inline_missing_content_id": CHECKED_IN_WORKER,
    "MailgunBackendStandardEmailTests.test_multiple_html_alternatives": CHECKED_IN_WORKER,
    "PostmarkBackendAnymailFeatureTests.test_envelope_sender": CHECKED_IN_WORKER,
    "PostmarkBackendAnymailFeatureTests.test_merge_data_without_template_unsupported": CHECKED_IN_WORKER,
    "PostmarkBackendAnymailFeatureTests.test_merge_global_data_without_template_unsupported": CHECKED_IN_WORKER,
    "PostmarkBackendAnymailFeatureTests.test_tags": CHECKED_IN_WORKER,
    "PostmarkBackendStandardEmailTests.test_alternatives_fail_silently": CHECKED_IN_WORKER,
    "PostmarkBackendStandardEmailTests.test_html_alternative": CHECKED_IN_WORKER,
    "PostmarkBackendStandardEmailTests.test_multiple_html_alternatives": CHECKED_IN_WORKER,
    "SendGridBackendAnymailFeatureTests.test_envelope_sender": CHECKED_IN_WORKER,
    "SendGridBackendDisallowsV2Tests.test_esp_extra_smtpapi": CHECKED_IN_WORKER,
    "BrevoBackendStandardEmailTests.test_multiple_reply_to": CHECKED_IN_WORKER,
}

_CLASSES = [
    cls
    for esp in anymail_suite.ESPS
    for cls in anymail_suite.upstream_classes(anymail_suite.upstream(esp))
]


def test_every_listed_case_exists():
    """A stale entry in BY_DESIGN would hide nothing and say something false."""
    assert not set(BY_DESIGN) - anymail_suite.names(_CLASSES)


def test_a_send_around_the_outbox_fails():
    """The harness's guard: an anymail backend made outside the worker fails the case, named."""
    postmark = anymail_suite.upstream("postmark")

    class AroundTheOutbox(postmark.PostmarkBackendMockAPITestCase):
        def test_direct(self):
            # The backend under test, made by the test itself: no outbox on the way.
            PostmarkBackend(server_token="test_server_token").send_messages([self.message])

    guarded = anymail_suite.case(AroundTheOutbox, expected_failures={}, module=__name__)
    result = unittest.TestResult()
    unittest.TestSuite([guarded("test_direct")]).run(result)
    assert result.testsRun == 1
    [(_test, trace)] = result.failures
    assert "SentAroundTheOutbox: EmailBackend made outside the outbox's worker" in trace


def test_vendored_release_is_installed():
    """The vendored tests are those of the installed anymail (pyproject.toml pins it)."""
    assert anymail_suite.installed_version() == anymail_suite.VENDORED_VERSION


for _upstream in _CLASSES:
    _case = anymail_suite.case(
        _upstream,
        expected_failures={
            key.partition(".")[2]: why
            for key, why in BY_DESIGN.items()
            if key.partition(".")[0] == _upstream.__name__
        },
        module=__name__,
    )
    globals()[_case.__name__] = _case
del _upstream, _case

__doc__ += "\nCannot apply to a queue (BY_DESIGN):\n\n" + "\n".join(
    f"- {name}: {why}" for name, why in BY_DESIGN.items()
)
