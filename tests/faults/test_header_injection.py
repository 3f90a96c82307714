"""Hostile text in every field of ``enqueue_email``: no input smuggles a header into a message.

Subjects, bodies, HTML, header values (those Django parses as addresses too),
file names and MIME types, huge values and RFC 2047 encoded words: every call
is refused and writes nothing, or writes one delivery per recipient whose
message has only the headers asked for (``tests/faults/hostile.py``).
"""

from __future__ import annotations

import email
import email.policy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from outbox.mail.message import build_message
from outbox.models import Email
from tests.cells import only_in_cells
from tests.faults.hostile import (
    ENCODED_INJECTION,
    GOOD,
    HYPOTHESIS,
    INJECTIONS,
    attempt,
    check_written,
    hostile_text,
    skip_encoded_words,
)
from tests.servers import empty_outbox

pytestmark = [
    pytest.mark.django_db(transaction=True),
    only_in_cells(
        "6.1:postgres", why="PostgreSQL enforces the column lengths; Django's newest version"
    ),
]


# -- free text: subject, body, HTML, header values, file names ----------------------


@settings(max_examples=200, **HYPOTHESIS)
@given(subject=hostile_text, body=hostile_text, html=st.none() | hostile_text)
def test_text_fields(subject, body, html):
    skip_encoded_words(subject)
    empty_outbox()
    result = attempt(subject, body, None, ["to@example.com"], html_message=html)
    single_line_bad = any(c in subject for c in "\r\n\x00\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
    if result is None:
        return
    assert not single_line_bad, f"subject {subject!r} with a line break was accepted"
    assert "\x00" not in body
    check_written(result)
    stored = Email.objects.get()
    assert stored.subject == subject and stored.body == body
    assert stored.html_message == (html or "")


# Headers whose value Django parses as addresses: see test_address_headers_* below.
ADDRESS_HEADERS = {
    "from",
    "sender",
    "reply-to",
    "to",
    "cc",
    "bcc",
    "resent-from",
    "resent-sender",
    "resent-to",
    "resent-cc",
    "resent-bcc",
}
header_names = st.one_of(
    st.sampled_from(
        ["X-Tag", "Bcc", "bcc", "BCC", "Message-ID", "message-id", "Content-Type", "Subject"]
    ),
    st.text(max_size=12),
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=12),
)


@settings(max_examples=200, **HYPOTHESIS)
@given(
    headers=st.dictionaries(
        header_names,
        hostile_text,
        max_size=4,
    )
)
def test_extra_headers(headers):
    skip_encoded_words(headers)
    empty_outbox()
    result = attempt("s", "b", None, ["to@example.com"], headers=headers)
    if result is None:
        return
    for name, value in headers.items():
        assert name.lower() not in {"bcc", "message-id", "content-type"}
        assert ":" not in name and name.isascii() and name.isprintable() and " " not in name
        assert not any(c in value for c in "\r\n\x00")
    check_written(result, headers=headers)


@settings(max_examples=150, **HYPOTHESIS)
@given(
    name=st.none() | hostile_text,
    content=st.one_of(st.binary(max_size=200), hostile_text),
    # "type/subtype" shapes only: other strings are test_mimetype_is_validated_at_enqueue.
    mimetype=st.none()
    | st.sampled_from(["text/plain", "application/pdf", "image/png", "message/rfc822"])
    | st.from_regex(r"[a-z0-9.+-]{1,20}/[a-z0-9.+-]{1,20}", fullmatch=True),
)
def test_attachments(name, content, mimetype):
    skip_encoded_words(name, mimetype)
    empty_outbox()
    result = attempt("s", "b", None, ["to@example.com"], attachments=[(name, content, mimetype)])
    if result is None:
        return
    check_written(result, attachments=1)


@settings(max_examples=6, **HYPOTHESIS)
@given(
    size=st.integers(100_000, 400_000),
    tail=st.sampled_from([*INJECTIONS, "", "é", "\U0001f600"]),
    where=st.sampled_from(["subject", "body", "html", "header"]),
)
def test_huge_fields(size, tail, where):
    if where in ("subject", "header"):
        skip_encoded_words(tail)
    empty_outbox()
    text = ("Lorem ipsum é " * (size // 14 + 1))[:size] + tail
    kwargs: dict[str, Any] = {"subject": "s", "message": "b"}
    headers = None
    if where == "subject":
        kwargs["subject"] = text
    elif where == "body":
        kwargs["message"] = text
    elif where == "html":
        kwargs["html_message"] = text
    else:
        headers = {"X-Big": text}
        kwargs["headers"] = headers
    result = attempt(from_email=None, recipient_list=["to@example.com"], **kwargs)
    if result is None:
        # Body and HTML take any text but NUL; single-line fields refuse line breaks.
        assert where in ("subject", "header") or "\x00" in tail
        return
    check_written(result, headers=headers)


@settings(max_examples=40, **HYPOTHESIS)
@given(
    name=st.sampled_from(["To", "Cc"]),  # Reply-To comes from the reply_to argument
    value=st.lists(st.emails().map(str), min_size=1, max_size=3).map(", ".join),
)
def test_address_headers_with_addresses(name, value):
    empty_outbox()
    result = attempt("s", "b", None, ["to@example.com"], headers={name: value})
    assert result is not None
    check_written(result, headers={name: value})


@pytest.mark.parametrize("name", ["To", "Cc", "Reply-To", "From"])
def test_address_headers_are_validated_at_enqueue(name):
    # Django 5.2 cannot build "\x80" or "é"; Django 6.1 cannot build "a@" or '"'.
    for value in ["\x80", "é", "a@", '"']:
        empty_outbox()
        result = attempt("s", "b", None, ["to@example.com"], headers={name: value})
        if result is None:
            continue  # refused up front: fine
        build_message(result[0], Email.objects.get()).message().as_bytes()


@pytest.mark.parametrize("name", ["Subject", "subject"])
def test_subject_in_headers_gives_one_subject(name):
    empty_outbox()
    result = attempt("s", "b", None, ["to@example.com"], headers={name: "other"})
    if result is None:
        return
    raw = build_message(result[0], Email.objects.get()).message().as_bytes()
    parsed = email.message_from_bytes(raw, policy=email.policy.default)
    assert len(parsed.get_all("Subject")) == 1


@pytest.mark.parametrize(("filename", "mimetype"), [("a.txt", "text"), (None, "")])
def test_mimetype_is_validated_at_enqueue(filename, mimetype):
    empty_outbox()
    result = attempt("s", "b", None, ["to@example.com"], attachments=[(filename, b"x", mimetype)])
    if result is None:
        return
    email_row = Email.objects.get()
    build_message(result[0], email_row, list(email_row.attachments.all())).message()


@pytest.mark.parametrize("field", ["subject", "header"])
def test_encoded_word_cannot_inject_a_header(field):
    empty_outbox()
    headers = {"X-Note": ENCODED_INJECTION} if field == "header" else None
    subject = ENCODED_INJECTION if field == "subject" else "s"
    result = attempt(subject, "b", None, ["to@example.com"], headers=headers)
    if result is None:
        return  # refused up front: fine
    check_written(result, headers=headers)


@pytest.mark.parametrize("field", ["from_name", "to_name", "reply_to_name", "filename"])
def test_encoded_word_in_names_injects_nothing(field):
    empty_outbox()
    named = f"{ENCODED_INJECTION} <to@example.com>"
    kwargs: dict[str, Any] = {**GOOD}
    if field == "from_name":
        kwargs["from_email"] = named
    elif field == "to_name":
        kwargs["recipient_list"] = [named]
    elif field == "reply_to_name":
        kwargs["reply_to"] = [named]
    else:
        kwargs["attachments"] = [(ENCODED_INJECTION, b"x", "text/plain")]
    result = attempt(**kwargs)
    if result is None:
        return
    check_written(
        result, reply_to=kwargs.get("reply_to"), attachments=len(kwargs.get("attachments", []))
    )


def test_non_ascii_mimetype_is_validated_at_enqueue():
    empty_outbox()
    result = attempt("s", "b", None, ["to@example.com"], attachments=[(None, b"x", "/;\x80")])
    if result is None:
        return
    email_row = Email.objects.get()
    build_message(result[0], email_row, list(email_row.attachments.all())).message().as_bytes()
