"""Message-IDs: one per recipient's copy, made at enqueue and stored on the row.

The Message-ID is what an operator looks for in the mail server's log to settle
a row in doubt, and what reconcilers match, so it is fixed before anything is
sent.
"""

from __future__ import annotations

import os
import time
from functools import lru_cache

from ..conf import outbox_settings

# Message-ID is "<" + 32 hex + "@" + domain + ">" in a 255-character column;
# also short enough that no mail library folds it onto a second line.
MAX_MESSAGE_ID_DOMAIN = 60
# Delivery.message_id's column.
MAX_MESSAGE_ID_LENGTH = 255


def make_message_id(domain: str) -> str:
    """A globally unique Message-ID for one recipient's copy (fits its column).

    The 32 hex digits are the host's time in milliseconds (12 digits) and then
    80 random bits (20 digits). Uniqueness comes from the random part alone:
    two ids made in the same millisecond collide with odds of 2**-80, and the
    column's unique index would refuse the second row rather than let two
    copies share an id.

    Why the time first: the unique index on ``Delivery.message_id`` takes one
    entry per recipient. Entries that arrive in order all go to its last page,
    which PostgreSQL keeps at hand and fills before it splits; random ones
    (a UUID4) land on any page, so each insert walks the tree, pages split
    half full, and on a table of millions of rows every insert reads a page
    nobody else wanted and, after each checkpoint, writes a full-page image
    of it to the WAL. The host's clock only orders the ids; nothing decides
    anything by it (see :class:`outbox.queue.clock.RedisClock`), so a host whose clock is off
    merely inserts elsewhere in the index. The time it shows is the enqueue
    time, which the message's Date header tells the recipient anyway.
    """
    if len(domain) > MAX_MESSAGE_ID_DOMAIN:
        domain = "localhost"  # a valid but absurdly long sender domain
    return f"<{_unique_part()}@{domain}>"


def _unique_part() -> str:
    return f"{time.time_ns() // 1_000_000:012x}{os.urandom(10).hex()}"


def message_id_domain(from_email: str) -> str:
    """The domain of the Message-IDs of mail from ``from_email`` (IDNA, or localhost)."""
    return _ascii(outbox_settings.MESSAGE_ID_DOMAIN or from_email.rpartition("@")[2].rstrip(">"))


@lru_cache(maxsize=256)
def _ascii(domain: str) -> str:
    # Cached: a site sends from a handful of domains, and the IDNA codec is
    # slow enough to show in every enqueue call.
    try:
        return domain.encode("idna").decode("ascii") or "localhost"
    except UnicodeError:
        return "localhost"


def copy_message_ids(callers: str | None, count: int, domain: str, *, taken: bool) -> list[str]:
    """The Message-IDs of ``count`` copies of a message whose sender may have set one.

    The sender's own ID (``headers={"Message-ID": ...}``) is kept as it is for
    a message with one recipient, unless a row has it already (``taken``): a
    second row with the same ID would be a second message under one name. For
    several recipients each copy gets the sender's ID with a dot and our own
    unique part added to its left side, ``<left.<32 hex>@right>``: unique,
    and found by searching for the sender's ID's left part. Without a usable
    sender's ID (too long, or not ``<left@right>`` when it must be extended)
    the copies get ours.
    """
    if callers and len(callers) <= MAX_MESSAGE_ID_LENGTH and not any(c.isspace() for c in callers):
        if count == 1 and not taken:
            return [callers]
        left, at, right = callers.removeprefix("<").removesuffix(">").rpartition("@")
        if at and left and right and len(callers) + 33 <= MAX_MESSAGE_ID_LENGTH:
            return [f"<{left}.{_unique_part()}@{right}>" for _ in range(count)]
    return [make_message_id(domain) for _ in range(count)]
