"""The benchmark's side of django-email-outbox: how it enqueues, seeds, delivers and counts.

Besides the defaults, it has rows with psycopg's prepared statements on
(PostgreSQL only; see ``common.PREPARED``) and a run of two worker processes.
"""

from __future__ import annotations

import sys
from typing import Any

from tests.benchmark.common import BODY, PREPARED, PREPARED_ENV, SENDER, SUBJECT, Sizes

NAME = "outbox"
BULK = "enqueue_email({n} recipients)"
SINGLE = "enqueue_email"


def enqueue_bulk(recipients: list[str]) -> None:
    from outbox import enqueue_email

    enqueue_email(SUBJECT, BODY, SENDER, recipients)


def enqueue_each(recipients: list[str]) -> None:
    """One call per recipient."""
    from outbox import enqueue_email

    for r in recipients:
        enqueue_email(SUBJECT, BODY, SENDER, [r])


def seed(recipients: list[str]) -> None:
    """Queued one-recipient emails: real enqueue calls (one Email per call), one commit.

    The on-commit hooks push every id to Redis.
    """
    from django.db import transaction

    from outbox import enqueue_email

    with transaction.atomic():
        for r in recipients:
            enqueue_email(SUBJECT, BODY, SENDER, [r])


def queued() -> int:
    from outbox.models import Delivery

    return Delivery.objects.filter(status="queued").count()


def in_redis(redis: Any) -> int:
    return int(redis.llen("{outbox}:ready:normal"))


def delivered() -> int:
    from outbox.models import Delivery

    return Delivery.objects.filter(status="sent").count()


def delivery_commands(
    sizes: Sizes, vendor: str
) -> list[tuple[str, list[list[str]], dict[str, str]]]:
    """(configuration, commands run at once, extra environment) per delivery row."""
    py = [sys.executable, "-m", "django"]
    c2 = sizes.two_proc_concurrency
    out: list[tuple[str, list[list[str]], dict[str, str]]] = []
    for c in (1, 4, 16):
        argv = [*py, "outbox_worker", "--burst", "--concurrency", str(c)]
        out.append((f"outbox_worker --concurrency {c}", [argv], {}))
    argv2 = [*py, "outbox_worker", "--burst", "--concurrency", str(c2)]
    if vendor == "postgresql":
        argv = [*py, "outbox_worker", "--burst", "--concurrency", "16"]
        out.append((f"outbox_worker --concurrency 16, {PREPARED}", [argv], PREPARED_ENV))
        out.append(
            (f"2 x outbox_worker --concurrency {c2}, {PREPARED}", [argv2, argv2], PREPARED_ENV)
        )
    else:
        out.append((f"2 x outbox_worker --concurrency {c2}", [argv2, argv2], {}))
    return out
