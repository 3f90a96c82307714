"""Checks of what ``outbox.urls`` routes: the metrics endpoint needs its token."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.checks import CheckMessage, Tags, Warning, register
from django.urls import NoReverseMatch, reverse

from ..conf import outbox_settings
from .settings import outbox_dict


@register(Tags.urls)
def check_metrics_token(
    app_configs: Sequence[Any] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """``outbox.urls`` is included, so its metrics are routed, but they have no token."""
    if outbox_dict() is None or outbox_settings.METRICS_TOKEN is not None:
        return []
    try:
        url = reverse("outbox:metrics")
    except NoReverseMatch:
        return []  # not routed: nothing to warn about
    except Exception:  # a broken URLconf is Django's own check's to report
        return []
    return [
        Warning(
            f"The outbox metrics are routed at {url}, but OUTBOX['METRICS_TOKEN'] is not set, "
            "so they answer 404 to every scrape.",
            hint="Set OUTBOX['METRICS_TOKEN'] to a long random string and give it to "
            "Prometheus as a bearer token, or do not include outbox.urls.",
            id="outbox.W004",
        )
    ]
