"""The outbox's system checks as ``manage.py check`` runs them, for tests."""

from __future__ import annotations

from django.core.checks import CheckMessage
from django.core.checks.registry import registry


def outbox_checks(*, deploy: bool = False) -> list[CheckMessage]:
    """The messages of every check the outbox registers (``deploy``: the deploy-only ones too).

    Only the outbox's own: a test that breaks a setting on purpose (no
    DjangoTemplates engine, say) may break other apps' checks as well.
    """
    messages: list[CheckMessage] = []
    for check in registry.get_checks(include_deployment_checks=deploy):
        if check.__module__.startswith("outbox."):
            messages.extend(check(app_configs=None))
    return messages
