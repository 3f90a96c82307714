"""The benchmark's side of django-mailer: how it enqueues, seeds, delivers and counts.

Delivery is ``manage.py send_mail``, which sends one message at a time.
"""

from __future__ import annotations

import sys

from tests.benchmark.common import BODY, SENDER, SUBJECT, Sizes

NAME = "mailer"
BULK = "mailer.send_mass_mail(n x 1)"
SINGLE = "mailer.send_mail"


def enqueue_bulk(recipients: list[str]) -> None:
    from mailer import send_mass_mail

    send_mass_mail([(SUBJECT, BODY, SENDER, [r]) for r in recipients])


def enqueue_each(recipients: list[str]) -> None:
    """One call per recipient."""
    from mailer import send_mail

    for r in recipients:
        send_mail(SUBJECT, BODY, SENDER, [r])


def seed(recipients: list[str]) -> None:
    """Queued one-recipient messages, bulk-created in chunks of 1,000."""
    from mailer import get_priority
    from mailer.models import Message, make_message

    priority = get_priority(None)
    for start in range(0, len(recipients), 1000):
        Message.objects.bulk_create(
            [
                make_message(
                    subject=SUBJECT, body=BODY, from_email=SENDER, to=[r], priority=priority
                )
                for r in recipients[start : start + 1000]
            ]
        )


def queued() -> int:
    from mailer.models import Message

    return Message.objects.count()


def delivered() -> int:
    from mailer.models import RESULT_SUCCESS, Message, MessageLog

    left = Message.objects.count()
    return MessageLog.objects.filter(result=RESULT_SUCCESS).count() - left


def delivery_commands(
    sizes: Sizes, vendor: str
) -> list[tuple[str, list[list[str]], dict[str, str]]]:
    return [("send_mail", [[sys.executable, "-m", "django", "send_mail"]], {})]
