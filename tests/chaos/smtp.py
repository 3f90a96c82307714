"""The chaos run's SMTP server: records every accepted message, refuses and defers some.

An aiosmtpd handler that appends ``<Message-ID> <envelope recipient> <time>`` to a
file for every message it accepts (``time``: when it recorded it, epoch seconds). A seeded set of recipients is always refused with
550; a seeded fraction of "flaky" recipients is answered 451 on their first one
or two tries (at RCPT or at DATA).

The faults ``stall`` and ``cut`` *arm* a recipient (``arm``): its next message
that would be accepted is, after DATA's final dot, either never answered (the
server waits ``stall_seconds``, longer than the workers' SEND_TIMEOUT, then
drops the connection; it records the message first or not, as armed) or
recorded and then cut off without a reply. Each one played is appended to
``played`` (kind, Message-ID, recipient, whether it was recorded). The fault
``long-send`` arms a ``slow`` one: its reply is held ``slow_seconds`` (longer than
the workers' HEARTBEAT_TIMEOUT, shorter than their SEND_TIMEOUT), then it is
recorded and accepted. ``defer_once`` answers a recipient's next RCPT with 451
(the fault ``lost-push`` needs a worker to push a retry).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any


def _fraction(*parts: Any) -> float:
    """A seeded, reproducible number in [0, 1) for the given parts."""
    digest = hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


MESSAGE_ID = re.compile(rb"^Message-ID:[ \t]*(\S+)", re.IGNORECASE | re.MULTILINE)


class ChaosSMTPHandler:
    """aiosmtpd handler: record accepted messages, refuse some, defer some."""

    def __init__(
        self,
        path: Path,
        *,
        seed: int,
        permanent: set[str],
        transient_fraction: float,
        delay: float,
    ) -> None:
        self.file = path.open("a", buffering=1, encoding="utf-8")
        self.seed = seed
        self.permanent = permanent
        self.transient_fraction = transient_fraction
        self.delay = delay
        self.tries: Counter[str] = Counter()
        self.answers: Counter[str] = Counter()
        self.stall_seconds = 6.0
        self.slow_seconds = 4.5
        self.defer_once: set[str] = set()
        self.armed: dict[str, tuple[str, bool]] = {}  # recipient -> (kind, record it)
        self.played: list[dict[str, Any]] = []

    def arm(self, recipient: str, kind: str, record: bool) -> None:
        """Stall ("stall"), cut ("cut") or slow ("slow") the next accepted message to ``recipient``."""
        self.armed[recipient] = (kind, record)

    def was_played(self, recipient: str) -> dict[str, Any] | None:
        return next((p for p in self.played if p["recipient"] == recipient), None)

    def _deferral(self, address: str, attempt: int) -> str | None:
        """'rcpt' or 'data' when this try of a flaky recipient gets a 451."""
        if _fraction(self.seed, "flaky", address) >= self.transient_fraction:
            return None
        deferred_tries = 1 + int(_fraction(self.seed, "tries", address) * 2)
        if attempt >= deferred_tries:
            return None
        return "rcpt" if _fraction(self.seed, "where", address, attempt) < 0.5 else "data"

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, rcpt_options: Any
    ) -> str:
        if address in self.permanent:
            self.answers["550 at RCPT"] += 1
            return f"550 5.1.1 <{address}>: no such user (chaos)"
        attempt = self.tries[address]
        self.tries[address] += 1
        if address in self.defer_once:
            self.defer_once.discard(address)
            self.answers["451 at RCPT"] += 1
            return "451 4.3.0 try again later (chaos, armed)"
        where = self._deferral(address, attempt)
        if where == "rcpt":
            self.answers["451 at RCPT"] += 1
            return "451 4.3.0 try again later (chaos)"
        envelope.rcpt_tos.append(address)
        if where == "data":
            envelope.chaos_defer = True
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        raw = envelope.original_content or envelope.content or b""
        if isinstance(raw, str):
            raw = raw.encode("utf-8", "surrogateescape")
        head = re.split(rb"\r?\n\r?\n", raw, maxsplit=1)[0]
        found = MESSAGE_ID.search(head)
        message_id = found.group(1).decode("ascii", "replace") if found else "<none>"
        if self.delay:
            await asyncio.sleep(self.delay * 2 * _fraction(self.seed, "delay", message_id))
        if getattr(envelope, "chaos_defer", False):
            self.answers["451 at DATA"] += 1
            return "451 4.3.0 queue full, try again later (chaos)"
        for rcpt in envelope.rcpt_tos:
            armed = self.armed.pop(rcpt, None)
            if armed is not None:
                return await self._play(server, envelope, message_id, rcpt, *armed)
        self._record(envelope, message_id)
        self.answers["250 accepted"] += 1
        return "250 2.0.0 accepted (chaos)"

    async def _play(
        self, server: Any, envelope: Any, message_id: str, rcpt: str, kind: str, record: bool
    ) -> str:
        """No answer to the final dot: a stall past SEND_TIMEOUT, or a cut; or a slow one."""
        self.played.append(
            {"kind": kind, "message_id": message_id, "recipient": rcpt, "recorded": record}
        )
        self.answers[f"{kind} after DATA"] += 1
        if kind == "slow":
            await asyncio.sleep(self.slow_seconds)
            self._record(envelope, message_id)
            self.answers["250 accepted"] += 1
            return "250 2.0.0 accepted, slowly (chaos)"
        if record:
            self._record(envelope, message_id)
        if kind == "stall":
            await asyncio.sleep(self.stall_seconds)
        # Drop the connection without a reply; what is returned is never read.
        server.transport.abort()
        return "421 4.3.0 closing (chaos)"

    def _record(self, envelope: Any, message_id: str) -> None:
        for address in envelope.rcpt_tos:
            self.file.write(f"{message_id} {address} {time.time():.6f}\n")

    def close(self) -> None:
        self.file.close()
