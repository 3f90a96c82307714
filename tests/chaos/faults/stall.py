"""Fault: the SMTP server never answers DATA's final dot (longer than SEND_TIMEOUT).

A seeded queued row that was never tried is picked, and the SMTP server is
armed for its recipient (``ChaosSMTPHandler.arm``): when that message is handed
over, the server records it (or, seeded, not), then says nothing for
``stall_seconds``, longer than the workers' ``OUTBOX["SEND_TIMEOUT"]`` (see
tests/chaos/settings.py), and drops the connection. The worker must give up
within SEND_TIMEOUT and treat the attempt as in doubt: under "review" the row
ends ``abandoned`` with an "ambiguous" Attempt and never arrives again (one
receipt if the server recorded it, none otherwise); under "requeue" it is
retried and delivered (at least once). ``play_smtp_fault`` is shared with
cut.py; analysis.py (``check_ambiguous``) checks the rows at the end.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from tests.chaos.config import HarnessError

if TYPE_CHECKING:
    from tests.chaos.child import Child


def stall_after_data(child: Child) -> None:
    play_smtp_fault(child, "stall", record=child.rng.random() < 0.5)


def play_smtp_fault(child: Child, kind: str, record: bool) -> None:
    """Arm the server for a fresh queued row, wait for it to be played and settled."""
    smtp = child.smtp
    assert smtp is not None
    for _ in range(5):
        row, recipient = pick_fresh_row(child)
        smtp.arm(recipient, kind, record)
        played = wait_played(child, row, recipient)
        if played is not None:
            break
        smtp.armed.pop(recipient, None)  # it went out before the server was armed
    else:
        raise HarnessError(f"no {kind} could be played: every armed row went out first")
    child.smtp_fault_rows.append((kind, row))
    child.counts[f"{kind} after DATA"] += 1
    status = wait_settled(child, row)
    what = "never answered" if kind == "stall" else "cut the connection without a reply"
    child.event(
        f"{kind} after DATA: row {row} ({recipient}), the server "
        f"{'recorded' if played['recorded'] else 'did not record'} it and {what}; "
        f"the worker settled it: {status}"
    )


def pick_fresh_row(child: Child) -> tuple[int, str]:
    """A seeded queued row never tried yet, to a recipient the server would accept."""
    from outbox.models import Delivery

    def candidates() -> list[tuple[int, str]]:
        child.ensure_work(child.batch_size, for_fault=True)
        rows = Delivery.objects.filter(status="queued", attempts=0).order_by("pk")
        return [
            (pk, rcpt)
            for pk, rcpt in rows.values_list("pk", "recipient")[:200]
            if rcpt not in child.permanent
        ]

    found = child.wait_for(candidates, 60, "a queued row never tried yet")
    return child.rng.choice(found)


def wait_played(child: Child, row: int, recipient: str) -> dict | None:
    """The server's record of the fault, or None if the row was settled without it."""
    from outbox.models import Delivery

    smtp = child.smtp
    assert smtp is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        played = smtp.was_played(recipient)
        if played is not None:
            return played
        status = Delivery.objects.values_list("status", flat=True).get(pk=row)
        if status in ("sent", "failed", "abandoned"):
            return None
        child.tick()
        time.sleep(0.1)
    raise HarnessError(f"row {row} was neither sent nor reached the armed server in 60s")


def wait_settled(child: Child, row: int) -> str:
    """Wait until the worker gave up on the row (SEND_TIMEOUT); its status then."""
    from outbox.models import Delivery

    config = child.config
    child.wait_for(
        lambda: Delivery.objects.filter(pk=row).exclude(status="processing").exists(),
        config.send_timeout + 4 * config.heartbeat_timeout + 30,
        f"row {row} to leave processing after the server went silent",
    )
    return Delivery.objects.values_list("status", flat=True).get(pk=row)
