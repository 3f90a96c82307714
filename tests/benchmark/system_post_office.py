"""The benchmark's side of django-post-office: how it enqueues, seeds, delivers and counts.

Delivery is ``manage.py send_queued_mail`` with its defaults (batches of 100,
5 threads), with its lock file in BENCH_TMP.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from tests.benchmark.common import BODY, SENDER, SUBJECT, Sizes

NAME = "post_office"
BULK = "mail.send_many(n x 1)"
SINGLE = "mail.send"


def _message(recipient: str) -> dict[str, Any]:
    return {"sender": SENDER, "recipients": [recipient], "subject": SUBJECT, "message": BODY}


def enqueue_bulk(recipients: list[str]) -> None:
    from post_office import mail

    mail.send_many([_message(r) for r in recipients])


def enqueue_each(recipients: list[str]) -> None:
    """One call per recipient."""
    from post_office import mail

    for r in recipients:
        mail.send(recipients=[r], sender=SENDER, subject=SUBJECT, message=BODY)


def seed(recipients: list[str]) -> None:
    """Queued one-recipient emails, written with send_many in chunks of 1,000."""
    from post_office import mail

    for start in range(0, len(recipients), 1000):
        mail.send_many([_message(r) for r in recipients[start : start + 1000]])


def queued() -> int:
    from post_office.models import Email

    return Email.objects.count()


def delivered() -> int:
    from post_office.models import STATUS, Email

    return Email.objects.filter(status=STATUS.sent).count()


def delivery_commands(
    sizes: Sizes, vendor: str
) -> list[tuple[str, list[list[str]], dict[str, str]]]:
    lock = os.path.join(os.environ.get("BENCH_TMP", "/tmp"), "post_office")
    argv = [sys.executable, "-m", "django", "send_queued_mail", "-L", lock]
    return [("send_queued_mail (defaults)", [argv], {})]
