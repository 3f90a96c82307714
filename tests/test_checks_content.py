"""System checks of the templates / suppression settings (outbox.E020, outbox.W009)."""

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
