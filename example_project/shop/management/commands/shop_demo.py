"""The example's walk-through: `shop_demo enqueue` then `shop_demo show`."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction
from django.utils import timezone

from outbox import enqueue_email, enqueue_many, enqueue_template, suppress
from outbox.models import Delivery, EmailTemplate
from outbox.queue import RedisQueue


class Command(BaseCommand):
    help = "Enqueue a few emails the way a shop would (enqueue), or show where they are (show)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("step", choices=["enqueue", "show"])

    def handle(self, *args: Any, step: str, **options: Any) -> None:
        if step == "enqueue":
            self.enqueue()
        self.show_rows()
        self.show_redis()
        if step == "show":
            self.show_mail()

    def enqueue(self) -> None:
        self.stdout.write(self.style.MIGRATE_HEADING("1. An order is placed: one transaction"))
        with transaction.atomic():
            # ... the order row would be saved here ...
            deliveries = enqueue_email(
                "Your order #1001",
                "Thanks for your order! It ships tomorrow.",
                None,  # DEFAULT_FROM_EMAIL
                ["alice@example.com", "Bob <bob@example.com>", "ALICE@example.com"],
                html_message="<p>Thanks for your order! It ships <b>tomorrow</b>.</p>",
                attachments=[("receipt.txt", "Order #1001: 1 teapot, 19.00 EUR", "text/plain")],
                idempotency_key="order-1001-confirmation",
            )
            self.stdout.write(
                f"   enqueued {len(deliveries)} deliveries (the duplicate Alice is one recipient);"
                " Redis gets their ids only when this transaction commits"
            )
        enqueue_email(
            "Reset your password",
            "Click the link to reset your password.",
            None,
            ["carol@example.com"],
            priority="high",
            sensitive=True,  # its content leaves the database at the first sweep after it is sent
        )
        self.stdout.write(
            "   a password reset, priority high, sensitive (content cleared once sent),"
            " in its own transaction"
        )
        enqueue_email(
            "Our autumn newsletter",
            "New teapots have arrived.",
            None,
            ["dave@example.com"],
            priority="low",
            send_at=timezone.now() + timedelta(hours=1),
        )
        self.stdout.write("   a newsletter scheduled for an hour from now")

        self.enqueue_templates()

        self.stdout.write(self.style.MIGRATE_HEADING("3. A failed checkout rolls back"))
        try:
            with transaction.atomic():
                enqueue_email("Your order #1002", "...", None, ["erin@example.com"])
                raise RuntimeError("payment declined")
        except RuntimeError as exc:
            self.stdout.write(f"   {exc}: the rollback took its email with it, nothing was queued")

    def enqueue_templates(self) -> None:
        self.stdout.write(
            self.style.MIGRATE_HEADING("2. Templates, bulk mail, expiry, suppression")
        )
        # English comes from files (shop/templates/shop/order_confirmation/), German
        # from the database: an operator edits it in the admin, with a preview.
        EmailTemplate.objects.update_or_create(
            name="shop/order_confirmation",
            language="de",
            defaults={
                "subject": "Ihre Bestellung #{{ order }}",
                "text": "Hallo {{ name }},\n\ndanke für Ihre Bestellung #{{ order }}.\n",
                "html": "<p>Hallo {{ name }},</p><p>danke für Ihre Bestellung #{{ order }}.</p>",
                "description": "Order confirmation, German",
                "sample_context": {"name": "Greta", "order": 1003},
            },
        )
        context = {"name": "Frank", "order": 1003, "items": ["teapot", "2 cups"]}
        enqueue_template("shop/order_confirmation", context, None, ["frank@example.com"])
        context = {"name": "Greta", "order": 1004, "items": ["teapot"]}
        enqueue_template(
            "shop/order_confirmation", context, None, ["greta@example.com"], language="de"
        )
        self.stdout.write(
            "   two order confirmations: English from files, German from the database"
        )
        suppress("bounced@example.com", "hard bounce", source="operator")
        sale_ends = timezone.now() + timedelta(hours=6)
        enqueue_many(
            [
                {
                    "template": "shop/order_confirmation",
                    "context": {"name": name, "order": 2000 + i, "items": ["a sale teapot"]},
                    "recipient_list": [f"{name.lower()}@example.com"],
                    "priority": "low",
                    "expires_at": sale_ends,  # not sent by then: never sent
                }
                for i, name in enumerate(["Heidi", "Ivan", "Bounced"])
            ]
        )
        self.stdout.write(
            "   three personalised emails in one enqueue_many call, expiring in 6 hours;"
            " bounced@example.com is suppressed, so its row is cancelled at once"
        )

    def show_rows(self) -> None:
        self.stdout.write(self.style.MIGRATE_HEADING("Deliveries in the database (the truth)"))
        rows = Delivery.objects.select_related("email").order_by("pk")
        for d in rows:
            self.stdout.write(
                f"   #{d.pk:<3} {d.status:<10} {d.priority:<6} attempts {d.attempts}  "
                f"{d.recipient:<24} {d.email.subject!r:<26} {d.message_id}"
            )
        if not rows:
            self.stdout.write("   (none)")

    def show_redis(self) -> None:
        self.stdout.write(
            self.style.MIGRATE_HEADING("Redis (only ids; a fast, rebuildable mirror)")
        )
        queue = RedisQueue()
        for key in queue.ready_keys:
            ids = [int(x) for x in queue.redis.lrange(key, 0, -1)]
            self.stdout.write(f"   {key:<24} {ids}")
        scheduled = queue.redis.zrange(queue.scheduled_key, 0, -1, withscores=True)
        self.stdout.write(
            f"   {queue.scheduled_key:<24} "
            + str(
                [
                    (m.decode(), timezone.datetime.fromtimestamp(s).isoformat(timespec="seconds"))
                    for m, s in scheduled
                ]
            )
        )

    def show_mail(self) -> None:
        folder = Path(settings.EXAMPLE_MAIL_DIR)
        self.stdout.write(self.style.MIGRATE_HEADING(f"Delivered mail, written to {folder}/"))
        files = sorted(folder.glob("*.log")) if folder.exists() else []
        count = 0
        for path in files:
            for line in path.read_text().splitlines():
                if line.startswith(("To:", "Subject:", "Message-ID:")):
                    self.stdout.write(f"   {line}")
                    if line.startswith("Message-ID:"):
                        count += 1
                        self.stdout.write("")
        self.stdout.write(f"   {count} messages in {len(files)} file(s)")
