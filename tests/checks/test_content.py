"""System checks of the templates, suppression and retention settings (outbox.E020, W009, E028, E029)."""

from __future__ import annotations

import pytest

from outbox.conf import outbox_settings
from tests.checking import outbox_checks


def ids() -> list[str]:
    return [message.id for message in outbox_checks()]


def test_suppress_on_refusal_defaults_to_true_and_is_clean():
    assert outbox_settings.SUPPRESS_ON_REFUSAL is True
    assert "outbox.E020" not in ids()


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_e020_suppress_on_refusal_must_be_a_bool(settings, value):
    settings.OUTBOX = {**settings.OUTBOX, "SUPPRESS_ON_REFUSAL": value}
    assert "outbox.E020" in ids()


def test_false_is_accepted(settings):
    settings.OUTBOX = {**settings.OUTBOX, "SUPPRESS_ON_REFUSAL": False}
    assert "outbox.E020" not in ids()
    assert outbox_settings.SUPPRESS_ON_REFUSAL is False


def test_w009_without_a_django_templates_engine(settings):
    settings.TEMPLATES = [
        {"BACKEND": "django.template.backends.jinja2.Jinja2", "DIRS": [], "OPTIONS": {}}
    ]
    assert "outbox.W009" in ids()


# -- how long content is kept (outbox/checks/retention.py) --------------------------


def test_content_retention_defaults_to_three_days_and_is_clean():
    assert outbox_settings.CONTENT_RETENTION == 3 * 86400
    assert outbox_settings.SENSITIVE_LINKS == ()
    assert {"outbox.E028", "outbox.E029"}.isdisjoint(ids())


@pytest.mark.parametrize("value", [0, -1, "259200", True, float("inf"), float("nan"), [1]])
def test_e028_content_retention_must_be_positive_seconds_or_none(settings, value):
    settings.OUTBOX = {**settings.OUTBOX, "CONTENT_RETENTION": value}
    assert "outbox.E028" in ids()


@pytest.mark.parametrize("value", [None, 0.5, 86400])
def test_e028_accepts_none_and_positive_numbers(settings, value):
    settings.OUTBOX = {**settings.OUTBOX, "CONTENT_RETENTION": value}
    assert "outbox.E028" not in ids()


@pytest.mark.parametrize("value", ["password_reset_confirm", [""], [3], None, {"a": 1}])
def test_e029_sensitive_links_must_be_a_list_of_url_names(settings, value):
    settings.OUTBOX = {**settings.OUTBOX, "SENSITIVE_LINKS": value}
    assert "outbox.E029" in ids()


def test_e029_accepts_url_names(settings):
    names = ["password_reset_confirm", "accounts:reset"]
    settings.OUTBOX = {**settings.OUTBOX, "SENSITIVE_LINKS": names}
    assert "outbox.E029" not in ids()
