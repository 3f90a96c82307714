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


# The worker configurations the README recommends ("Which configuration") for this
# benchmark's machine (2 cores, the database on the same host), per database:
# the targets are judged on the best of them, and name it.
DOCUMENTED = {
    "postgres": ("outbox_worker --concurrency 16", "outbox_worker --processes 2 --concurrency 16"),
    "sqlite": ("outbox_worker --concurrency 16",),
}


def delivery_commands(
    sizes: Sizes, vendor: str
) -> list[tuple[str, list[list[str]], dict[str, str]]]:
    """(configuration, commands run at once, extra environment) per delivery row."""
    worker = [sys.executable, "-m", "django", "outbox_worker", "--burst"]
    configs = ["--concurrency 1", "--concurrency 4", "--concurrency 16"]
    if vendor == "postgresql":
        configs += ["--processes 2 --concurrency 8", "--processes 2 --concurrency 16"]
    else:
        configs += ["--processes 2 --concurrency 4"]
    out: list[tuple[str, list[list[str]], dict[str, str]]] = [
        (f"outbox_worker {c}", [[*worker, *c.split()]], {}) for c in configs
    ]
    if vendor == "postgresql":
        for c in ("--concurrency 16", "--processes 2 --concurrency 16"):
            out.append((f"outbox_worker {c}, {PREPARED}", [[*worker, *c.split()]], PREPARED_ENV))
    return out
