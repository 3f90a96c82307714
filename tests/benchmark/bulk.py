"""The benchmark's bulk part (PostgreSQL): personalised template mail, 10,000 emails.

Ours: ``outbox.enqueue_many`` with one item per recipient, each with its own
context, rendering a database template (``outbox.models.EmailTemplate``),
timed end to end: validation, rendering, the INSERTs, the commit and the Redis
push after it. Theirs: ``post_office.mail.send_many`` with a post_office
database template and the same contexts, priority ``medium`` (queued, not
sent at once). The targets: under 3 s, and at least 3x post_office.
"""

from __future__ import annotations

from typing import Any

from tests.benchmark.common import SENDER, Row, rcpt

SUBJECT = "Your order #{{ order }} has shipped, {{ name }}"
TEXT = (
    "Hello {{ name }},\n\nyour order #{{ order }} with {{ items|length }} items is on its way:\n"
    "{% for item in items %}- {{ item }}\n{% endfor %}\n-- \nThe shop\n"
)
HTML = (
    "<p>Hello {{ name }},</p><p>your order #{{ order }} is on its way:</p>"
    "<ul>{% for item in items %}<li>{{ item }}</li>{% endfor %}</ul>"
)
NAME = "order_shipped"


def context(i: int) -> dict[str, Any]:
    return {"name": f"Customer {i}", "order": 100_000 + i, "items": [f"item {i}", "socks"]}


def enqueue_ours(n: int) -> None:
    from outbox import enqueue_many

    enqueue_many(
        [
            {
                "template": NAME,
                "context": context(i),
                "from_email": SENDER,
                "recipient_list": [rcpt(i)],
            }
            for i in range(n)
        ]
    )


def enqueue_post_office(n: int) -> None:
    from post_office import mail

    mail.send_many(
        [
            {
                "sender": SENDER,
                "recipients": [rcpt(i)],
                "template": NAME,
                "context": context(i),
                "priority": "medium",
            }
            for i in range(n)
        ]
    )


def create_templates() -> None:
    from post_office.models import EmailTemplate as PostOfficeTemplate

    from outbox.models import EmailTemplate

    EmailTemplate.objects.create(name=NAME, subject=SUBJECT, text=TEXT, html=HTML)
    PostOfficeTemplate.objects.create(name=NAME, subject=SUBJECT, content=TEXT, html_content=HTML)


class BulkMixin:
    """The bulk part of the benchmark's ``Child`` (see child.py for the attributes)."""

    db: str
    repeat: int
    extra: dict[str, Any]

    def bench_bulk(self) -> None:
        # Import costs outside the timing.
        from post_office.mail import send_many  # noqa: F401

        from outbox.enqueue.bulk import enqueue_many  # noqa: F401

        n = self.sizes.bulk_templates
        rows = [
            self.add(Row("bulk", self.db, "outbox", "enqueue_many (template)", n, ours=True)),
            self.add(Row("bulk", self.db, "post_office", "mail.send_many (template)", n)),
        ]
        calls = [lambda: enqueue_ours(n), lambda: enqueue_post_office(n)]
        for _ in range(self.repeat):
            for row, call in zip(rows, calls, strict=True):
                self.reset()
                create_templates()
                row.times.append(self.timed(call))
                self.check_bulk(row)
                self.log(f"bulk {row.system}: {row.times[-1]:.3f}s")
        ours_row, po_row = rows
        ratio = ours_row.rate / po_row.rate
        self.extra["bulk"] = {
            "emails": n,
            "outbox_s": ours_row.median,
            "post_office_s": po_row.median,
            "ratio": ratio,
        }
        self.log(
            f"bulk: outbox {ours_row.median:.3f}s ({ours_row.rate:,.0f}/s), post_office "
            f"{po_row.median:.3f}s ({po_row.rate:,.0f}/s), ratio {ratio:.2f}x; "
            f"< 3 s: {'met' if ours_row.median < 3 else 'NOT MET'}, "
            f">= 3x: {'met' if ratio >= 3 else 'NOT MET'}"
        )

    def check_bulk(self, row: Row) -> None:
        """Every email was written (and, for ours, rendered and pushed to Redis)."""
        if row.system == "outbox":
            from outbox.models import Delivery

            written = Delivery.objects.filter(status="queued").count()
            waiting = int(self.redis.llen("{outbox}:ready:normal"))
            sample = Delivery.objects.select_related("email").order_by("pk").last()
            if written != row.n or waiting != row.n:
                row.note = f"queued {written}, Redis holds {waiting} of {row.n}!"
            elif sample is None or f"Customer {row.n - 1}" not in sample.email.subject:
                row.note = "not rendered per recipient!"
        else:
            from post_office.models import Email

            written = Email.objects.count()
            if written != row.n:
                row.note = f"queued {written} of {row.n}!"
