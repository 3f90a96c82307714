"""The chaos run through an ESP: real workers and a sweeper send to the fake ESP.

``tests/esp.py``'s server plays Postmark. Each request gets a random answer:
accepted (most), accepted and answered after the client's timeout, accepted
and reset, accepted and lost by a gateway (502), 429 and 503 with
``Retry-After``, 500, a few refusals of the recipient (422), and the ESP's
Delivery webhook posted before its answer, which is then a 500 or lost (the
ESP's word kept as the attempt's evidence settles it ``sent``). Under
``ABANDONED_POLICY = "review"`` every copy the ESP took whose row is in doubt
(and one in ten of the others) gets its webhook events (Delivery and Open), posted to anymail's real Postmark tracking view
once the worker has settled the row (late), shuffled (out of order) and each
twice. One row in ten of three is part of a drop-in message (``OutboxBackend``:
To, Cc and Bcc, one request for its rows, each settled from its recipient's
status); an accepted copy is matched to its row by the request's metadata and
its recipient. Then every delivery is counted:

- lost: a row not final (``sent`` or ``failed``) at the end; a ``sent`` row
  the ESP never took; a ``failed`` row that was not refused;
- sent twice: a delivery the ESP took more than once;
- in doubt: rows that went ``abandoned``; each must end ``sent`` by its
  webhook (a ``marked_sent`` attempt by ``esp:Postmark``).

Run at size from pytest (it uses the cell's database and Redis)::

    OUTBOX_TEST_ESP_CHAOS_EMAILS=1000 OUTBOX_TEST_ALL_CELLS=1 \\
        OUTBOX_TEST_MATRIX=5.2:postgres tests/run.sh tests/faults/test_esp_chaos.py -s

``tests/faults/test_esp_chaos.py`` runs a small one (100 emails) in the suite.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from subprocess import Popen

from django.core.mail import EmailMessage
from django.test import Client

from outbox import enqueue_many
from outbox.backends import OutboxBackend
from outbox.models import Attempt, Delivery
from tests.esp import POSTMARK_BACKEND, Accepted, FakeESP, basic_auth, postmark_event

Status = Delivery.Status
Outcome = Attempt.Outcome

# How often each answer comes, per request.
ANSWERS = {
    "ok": 70,
    "slow": 8,
    "reset": 6,
    "gateway": 4,
    "429": 3,
    "503": 2,
    "500": 5,
    "422": 2,
    # The ESP's Delivery webhook comes before its answer, which is then a 500 or lost.
    "early500": 3,
    "earlyslow": 3,
}
TIMEOUT = 0.5  # anymail's REQUESTS_TIMEOUT in the workers


@dataclass
class Numbers:
    """What the run counted; :meth:`broken` lists the rules it broke."""

    emails: int = 0
    seconds: float = 0.0
    statuses: Counter[str] = field(default_factory=Counter)
    answers: Counter[str] = field(default_factory=Counter)
    accepted: int = 0
    lost: list[int] = field(default_factory=list)
    sent_twice: list[int] = field(default_factory=list)
    in_doubt: int = 0
    settled_by_webhook: int = 0
    in_doubt_unsettled: list[int] = field(default_factory=list)
    webhooks_posted: int = 0
    webhook_errors: int = 0
    early_events: int = 0
    sent_by_early_event: int = 0

    def broken(self) -> list[str]:
        rules = []
        if self.lost:
            rules.append(f"{len(self.lost)} lost: {self.lost[:10]}")
        if self.sent_twice:
            rules.append(f"{len(self.sent_twice)} sent twice: {self.sent_twice[:10]}")
        if self.in_doubt_unsettled:
            rules.append(
                f"{len(self.in_doubt_unsettled)} in doubt not settled by their webhook: "
                f"{self.in_doubt_unsettled[:10]}"
            )
        if self.webhook_errors:
            rules.append(f"{self.webhook_errors} webhook posts refused")
        return rules

    def table(self) -> str:
        rows = [
            ("emails", self.emails),
            ("seconds", f"{self.seconds:.1f}"),
            ("requests by answer", dict(sorted(self.answers.items()))),
            ("copies the ESP took", self.accepted),
            ("final statuses", dict(sorted(self.statuses.items()))),
            ("lost", len(self.lost)),
            ("sent twice", len(self.sent_twice)),
            ("in doubt (abandoned on the way)", self.in_doubt),
            ("settled sent by their webhook", self.settled_by_webhook),
            ("webhook posts (late, shuffled, each twice)", self.webhooks_posted),
            ("webhook posts refused", self.webhook_errors),
            ("webhooks before the answer", self.early_events),
            ("settled sent by such an early webhook", self.sent_by_early_event),
        ]
        return "\n".join(f"{name:<45} {value}" for name, value in rows)


class Poster(threading.Thread):
    """Posts each accepted copy's events once its row has left the worker's hands."""

    def __init__(self, esp: FakeESP, seed: int) -> None:
        super().__init__(daemon=True)
        self.esp = esp
        self.random = random.Random(seed)
        self.done: set[tuple[str, str]] = set()  # (ESP id, recipient) of copies posted about
        self.stop = threading.Event()
        self.posted = 0
        self.errors = 0

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                if not self.round():
                    self.stop.wait(0.2)
        finally:
            from django.db import connections

            connections.close_all()

    def round(self) -> bool:
        """Post the events of copies whose rows are settled; True if it posted any."""
        with self.esp.lock:
            waiting = [a for a in self.esp.accepted if (a.esp_id, a.to) not in self.done]
        ids = {row_of(a): a for a in waiting}
        settled = set(
            Delivery.objects.filter(pk__in=ids)
            .exclude(status__in=[Status.QUEUED, Status.PROCESSING])
            .values_list("pk", flat=True)
        )
        doubted = set(
            Delivery.objects.filter(pk__in=settled, status=Status.ABANDONED).values_list(
                "pk", flat=True
            )
        )
        events: list[tuple[Accepted, str]] = []
        for pk in settled:
            taken = ids[pk]
            self.done.add((taken.esp_id, taken.to))
            # Every row in doubt gets its events; of the others, one in ten (the
            # evidence path), to keep the run's posts few.
            if pk in doubted or self.random.random() < 0.1:
                events += [(taken, "Delivery"), (taken, "Open")] * 2  # each twice
        self.random.shuffle(events)  # out of order: an Open before its Delivery
        for taken, record in events:
            response = Client().post(
                "/anymail/postmark/tracking/",
                data=json.dumps(postmark_event(taken, record)),
                content_type="application/json",
                HTTP_AUTHORIZATION=basic_auth(),
            )
            self.posted += 1
            self.errors += response.status_code != 200
        return bool(events)


def run_esp_chaos(
    emails: int,
    start_worker: Callable[..., Popen[str]],
    start_sweeper: Callable[..., Popen[str]],
    *,
    workers: int = 2,
    concurrency: int = 4,
    seed: int = 36,
    time_limit: float = 300.0,
    answers: dict[str, int] | None = None,
) -> Numbers:
    """Send ``emails`` through the fake ESP with real processes; count what happened.

    ``answers`` overrides some of :data:`ANSWERS`' weights.
    """
    dice = random.Random(seed)
    esp = FakeESP(answer_after=TIMEOUT + 1.0).start()
    chances = {**ANSWERS, **(answers or {})}
    answers_, weights = list(chances), list(chances.values())
    esp.choose = lambda _recipient: dice.choices(answers_, weights)[0]
    esp.early_hook = _post_early
    numbers = Numbers(emails=emails)
    poster = Poster(esp, seed)
    started = time.monotonic()
    try:
        env = {
            "OUTBOX_TEST_EMAIL_BACKEND": POSTMARK_BACKEND,
            "OUTBOX_TEST_ESP_URL": esp.url,
            "OUTBOX_TEST_ESP_TIMEOUT": str(TIMEOUT),
            "OUTBOX_TEST_ABANDONED_POLICY": "review",
        }
        grouped = emails // 10  # messages of three rows: a third of the rows
        enqueue_many(
            [
                {
                    "subject": f"chaos {n}",
                    "message": "Hello",
                    "recipient_list": [f"r{n}@example.com"],
                }
                for n in range(emails - 3 * grouped)
            ]
        )
        OutboxBackend().send_messages(
            [
                EmailMessage(
                    f"chaos message {n}",
                    "Hello all",
                    "from@example.com",
                    [f"m{n}-to@example.com"],
                    cc=[f"m{n}-cc@example.com"],
                    bcc=[f"m{n}-bcc@example.com"],
                )
                for n in range(grouped)
            ]
        )
        Delivery.objects.update(max_attempts=50)  # 429s and 5xx must not exhaust a row
        for _ in range(workers):
            start_worker("--concurrency", str(concurrency), **env)
        start_sweeper("--loop", "0.5", OUTBOX_TEST_ABANDONED_POLICY="review")
        poster.start()
        deadline = time.monotonic() + time_limit
        while time.monotonic() < deadline:
            open_rows = Delivery.objects.exclude(status__in=[Status.SENT, Status.FAILED]).count()
            if not open_rows and not _unposted(esp, poster):
                break
            time.sleep(0.5)
    finally:
        poster.stop.set()
        poster.join(timeout=30)
        esp.stop()
    numbers.seconds = time.monotonic() - started
    _count(numbers, esp, poster)
    return numbers


def _post_early(taken: Accepted) -> int:
    """The ESP's Delivery webhook about ``taken``, posted before its answer (in its thread)."""
    try:
        return (
            Client()
            .post(
                "/anymail/postmark/tracking/",
                data=json.dumps(postmark_event(taken)),
                content_type="application/json",
                HTTP_AUTHORIZATION=basic_auth(),
            )
            .status_code
        )
    finally:
        from django.db import connections

        connections.close_all()


def _unposted(esp: FakeESP, poster: Poster) -> bool:
    with esp.lock:
        return any((a.esp_id, a.to) not in poster.done for a in esp.accepted)


def row_of(taken: Accepted) -> int:
    """The row a copy the ESP took was for: the request's first row, or its companion."""
    lead = Delivery.objects.only("email_id", "recipient").get(
        pk=int(taken.metadata["outbox_delivery"])
    )
    if lead.recipient.lower() == taken.to.lower():
        return lead.pk
    return Delivery.objects.get(email_id=lead.email_id, recipient__iexact=taken.to).pk


def _count(numbers: Numbers, esp: FakeESP, poster: Poster) -> None:
    numbers.answers = Counter(action for _r, action in esp.requests)
    numbers.accepted = len(esp.accepted)
    numbers.webhooks_posted, numbers.webhook_errors = poster.posted, poster.errors
    numbers.early_events = len(esp.webhook_statuses)
    numbers.webhook_errors += sum(status != 200 for status in esp.webhook_statuses)
    numbers.sent_by_early_event = Attempt.objects.filter(
        outcome=Outcome.SENT, error__contains="the ESP's event for this attempt came first"
    ).count()
    taken = Counter(row_of(a) for a in esp.accepted)
    numbers.sent_twice = sorted(pk for pk, n in taken.items() if n > 1)
    refused = set(
        Attempt.objects.filter(outcome=Outcome.FAILED).values_list("delivery_id", flat=True)
    )
    doubted = set(
        Attempt.objects.filter(outcome__in=[Outcome.AMBIGUOUS, Outcome.ABANDONED]).values_list(
            "delivery_id", flat=True
        )
    )
    by_webhook = set(
        Attempt.objects.filter(outcome=Outcome.MARKED_SENT, actor="esp:Postmark").values_list(
            "delivery_id", flat=True
        )
    )
    numbers.in_doubt = len(doubted)
    numbers.settled_by_webhook = len(by_webhook)
    for pk, status in Delivery.objects.values_list("pk", "status"):
        numbers.statuses[status] += 1
        final = {
            Status.SENT: taken[pk] == 1,  # "sent", and the ESP has it once
            Status.FAILED: not taken[pk] and pk in refused,  # refused, never taken
        }
        if not final.get(status, False):
            numbers.lost.append(pk)
        if pk in doubted and not (status == Status.SENT and pk in by_webhook):
            numbers.in_doubt_unsettled.append(pk)


__all__ = ["ANSWERS", "Numbers", "run_esp_chaos"]
