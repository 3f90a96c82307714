"""The admin of email templates (preview, syntax check on save) and of the suppression list."""

from __future__ import annotations

import html

import pytest
from django.urls import reverse

from outbox import suppress
from outbox.models import EmailTemplate, Suppression

pytestmark = pytest.mark.django_db


def form(**values: str) -> dict[str, str]:
    data = {
        "name": "welcome",
        "language": "",
        "description": "",
        "subject": "Hi {{ name }}",
        "text": "Hello {{ name }}",
        "html": "",
        "sample_context": '{"name": "Ann"}',
    }
    data.update(values)
    return data


def test_a_syntax_error_is_a_form_error_with_its_line(admin_client):
    url = reverse("admin:outbox_emailtemplate_add")
    response = admin_client.post(url, form(text="one\ntwo\n{% if %}"))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert "text" in errors and "line 3" in errors["text"][0]
    assert not EmailTemplate.objects.exists()


def test_the_change_page_previews_with_the_sample_context(admin_client):
    template = EmailTemplate.objects.create(
        name="w",
        subject="Hi {{ name }}",
        text="Text for {{ name }} <script>alert(1)</script>",
        html="<p>{{ name }}</p>",
        sample_context={"name": "<Ann>"},
    )
    response = admin_client.get(reverse("admin:outbox_emailtemplate_change", args=[template.pk]))
    page = response.content.decode()
    assert "Hi &lt;Ann&gt;" in page
    assert "Text for &lt;Ann&gt; &lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script>alert(1)" not in page
    # The HTML body, autoescaped by the template, sits in a sandboxed frame.
    assert "<iframe sandbox" in page
    assert html.escape("<p>&lt;Ann&gt;</p>") in page


def test_a_preview_that_fails_to_render_says_why(admin_client):
    template = EmailTemplate.objects.create(name="w", subject="s", text="{{ x.y }}", html="")
    template.text = "{% if %}"  # saved without clean(): the preview reports it
    template.save()
    response = admin_client.get(reverse("admin:outbox_emailtemplate_change", args=[template.pk]))
    assert "errornote" in response.content.decode()


def test_template_list_search(admin_client):
    EmailTemplate.objects.create(name="invoice", subject="Your invoice", text="x")
    EmailTemplate.objects.create(name="welcome", subject="Hello", text="x")
    response = admin_client.get(reverse("admin:outbox_emailtemplate_changelist"), {"q": "invoice"})
    assert [t.name for t in response.context["cl"].result_list] == ["invoice"]


def test_suppression_admin_searches_filters_and_lowercases(admin_client):
    suppress("bounced@example.com", "hard bounce")
    Suppression.objects.create(address="refused@example.com", source="refusal")
    url = reverse("admin:outbox_suppression_changelist")
    found = admin_client.get(url, {"q": "bounced"}).context["cl"].result_list
    assert [s.address for s in found] == ["bounced@example.com"]
    refused = admin_client.get(url, {"source__exact": "refusal"}).context["cl"].result_list
    assert [s.address for s in refused] == ["refused@example.com"]
    add = reverse("admin:outbox_suppression_add")
    response = admin_client.post(
        add, {"address": "Ops@Example.com", "reason": "", "source": "operator"}
    )
    assert response.status_code == 302
    assert Suppression.objects.filter(address="ops@example.com", source="operator").exists()
    again = admin_client.post(
        add, {"address": "OPS@example.com", "reason": "", "source": "operator"}
    )
    assert again.status_code == 200 and "address" in again.context["adminform"].form.errors
