"""What the queue says about a row: entries, claims, and their encoding in Redis.

Queue entries (id, priority, due time) and claims, the priorities' numbers
in Redis, and how replies and arguments are encoded. ``reliable`` builds the
queue on these; ``client`` says which Redis it talks to.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from ..conf import PRIORITIES

PRIORITY_INDEX: dict[str, int] = {name: i + 1 for i, name in enumerate(PRIORITIES)}
PRIORITY_NAME: dict[int, str] = {i: name for name, i in PRIORITY_INDEX.items()}


class QueueEntry(NamedTuple):
    """What Redis needs to know about a row to place it: id, priority, due time."""

    id: int
    priority: str
    due: float  # epoch seconds


class Claimed(NamedTuple):
    """An id a claim moved into this incarnation's processing list, with its priority."""

    id: int
    priority: str


def entry_args(entries: Iterable[QueueEntry]) -> list[Any]:
    args: list[Any] = []
    for entry in entries:
        args += [entry.id, PRIORITY_INDEX[entry.priority], f"{entry.due:.6f}"]
    return args


def decode(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class ClaimResult(NamedTuple):
    """What one claim round trip returned."""

    now: float  # Redis time, epoch seconds
    registered: bool  # False: this incarnation was declared dead; claim nothing more
    items: list[Claimed]
    # The operator's control hash as the claim saw it (read by control.parse);
    # None when not registered. While it says "paused", items is empty.
    control: dict[str, str] | None = None
    # When nothing was claimed: the earliest scheduled id's due time (Redis
    # time; math.inf when none is scheduled). None: not looked at.
    next_due: float | None = None
