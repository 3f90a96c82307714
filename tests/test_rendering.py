"""enqueue_template: the lookup order, the per-language fallback, the rendering rules.

Template files live in tests/templates/outbox_test/ (found through the test
settings' TEMPLATES DIRS); database templates are EmailTemplate rows.
"""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from outbox import enqueue_template
from outbox.models import Delivery, Email, EmailTemplate
from outbox.rendering import TemplateCache, render

pytestmark = pytest.mark.django_db(transaction=True)

NAME = "outbox_test/welcome"
CONTEXT = {"name": "<Ann & Bob>", "note": "a < b"}


def sent_email(deliveries: list[Delivery]) -> Email:
    return Email.objects.get(pk=deliveries[0].email_id)


def test_files_render_text_unescaped_html_escaped_subject_on_one_line(queue):
    rows = enqueue_template(NAME, CONTEXT, None, ["a@example.com", "b@example.com"])
    assert len(rows) == 2
    email = sent_email(rows)
    # Written over two lines in subject.txt, rendered as one; not escaped.
    assert email.subject == "Welcome, <Ann & Bob>! [en-us]"
    assert email.body == "Hello <Ann & Bob> & friends: a < b\n"
    assert email.html_message == "<p>Hello &lt;Ann &amp; Bob&gt;: a &lt; b</p>\n"
    assert queue.waiting_ids() == {d.pk for d in rows}


def test_a_language_file_wins_per_part_and_the_language_is_active(queue):
    email = sent_email(enqueue_template(NAME, CONTEXT, None, ["a@example.com"], language="de"))
    assert email.subject == "Willkommen, <Ann & Bob>!"
    # No de/body.txt: the plain file is used for that part.
    assert email.body == "Hello <Ann & Bob> & friends: a < b\n"


def test_the_active_language_is_the_one_asked_for():
    EmailTemplate.objects.create(
        name="lang", subject="{% load i18n %}{% get_current_language as L %}{{ L }}", text="x"
    )
    email = sent_email(enqueue_template("lang", {}, None, ["a@example.com"], language="fr"))
    assert email.subject == "fr"


def test_database_language_row_wins_over_default_row_and_files():
    EmailTemplate.objects.create(name=NAME, language="", subject="DB default {{ name }}", text="d")
    EmailTemplate.objects.create(name=NAME, language="de", subject="DB de {{ name }}", text="de")
    assert (
        sent_email(
            enqueue_template(NAME, {"name": "x"}, None, ["a@example.com"], language="de")
        ).subject
        == "DB de x"
    )
    # No row for fr: the default row, not the files.
    fr = sent_email(enqueue_template(NAME, {"name": "x"}, None, ["a@example.com"], language="fr"))
    assert (fr.subject, fr.body, fr.html_message) == ("DB default x", "d", "")


def test_files_are_used_when_the_database_has_no_row_for_the_name():
    EmailTemplate.objects.create(name="other", subject="nope", text="nope")
    email = sent_email(enqueue_template(NAME, CONTEXT, None, ["a@example.com"], language="de"))
    assert email.subject.startswith("Willkommen")


def test_database_html_autoescapes_and_subject_whitespace_collapses():
    EmailTemplate.objects.create(
        name="t",
        subject="Hi\n {{ name }}\r\n  there",
        text="T {{ name }}",
        html="<b>{{ name }}</b>",
    )
    email = sent_email(enqueue_template("t", {"name": "<x>\nnext"}, None, ["a@example.com"]))
    assert email.subject == "Hi <x> next there"
    assert email.body == "T <x>\nnext"
    assert email.html_message == "<b>&lt;x&gt;\nnext</b>"


def error_of(excinfo: pytest.ExceptionInfo[ValidationError]) -> str:
    return " ".join(excinfo.value.messages)


def test_a_missing_template_names_it_and_writes_nothing():
    with pytest.raises(ValidationError) as info:
        enqueue_template("no/such", {}, None, ["a@example.com"])
    assert "no/such" in error_of(info) and "subject" in error_of(info)
    assert not Email.objects.exists() and not Delivery.objects.exists()


def test_a_syntax_error_names_the_template_part_and_line():
    EmailTemplate.objects.create(name="bad", subject="ok", text="line one\n{% if %}\n")
    with pytest.raises(ValidationError) as info:
        enqueue_template("bad", {}, None, ["a@example.com"])
    message = error_of(info)
    assert "bad" in message and "text" in message and "line 2" in message
    assert not Delivery.objects.exists()


def test_a_render_error_names_the_template_and_part():
    EmailTemplate.objects.create(name="boom", subject="ok", text="x", html="{{ thing.explode }}")

    class Exploding:
        def explode(self) -> str:
            raise RuntimeError("kaboom")

    with pytest.raises(ValidationError) as info:
        enqueue_template("boom", {"thing": Exploding()}, None, ["a@example.com"])
    assert "boom" in error_of(info) and "html" in error_of(info) and "kaboom" in error_of(info)
    assert not Delivery.objects.exists()


def test_a_template_without_body_is_refused():
    EmailTemplate.objects.create(name="empty", subject="s")
    with pytest.raises(ValidationError, match="neither text nor HTML"):
        enqueue_template("empty", {}, None, ["a@example.com"])


def test_encoded_line_breaks_in_a_rendered_subject_are_still_refused():
    EmailTemplate.objects.create(name="inj", subject="{{ s }}", text="x")
    with pytest.raises(ValidationError) as info:
        enqueue_template(
            "inj", {"s": "=?utf-8?q?a=0D=0ABcc:_x@evil.com?="}, None, ["a@example.com"]
        )
    assert "subject" in info.value.message_dict
    assert not Delivery.objects.exists()


def test_a_template_is_compiled_once_per_call(django_assert_num_queries):
    EmailTemplate.objects.create(name="once", subject="{{ n }}", text="{{ n }}")
    cache = TemplateCache()
    with django_assert_num_queries(1):
        compiled = cache.get("once", "en")
        assert cache.get("once", "en") is compiled
    assert [render(compiled, {"n": i})[0] for i in range(3)] == ["0", "1", "2"]


def test_model_clean_reports_the_syntax_error_with_its_line():
    template = EmailTemplate(name="x", subject="{{ a|nosuchfilter }}", text="ok\n\n{% for %}")
    with pytest.raises(ValidationError) as info:
        template.full_clean()
    errors = info.value.message_dict
    assert set(errors) >= {"subject", "text"}
    assert "line 3" in errors["text"][0]
