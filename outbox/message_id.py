"""Message-IDs: one per recipient's copy, made at enqueue and stored on the row.

The Message-ID is what an operator looks for in the mail server's log to settle
a row in doubt, and what reconcilers match, so it is fixed before anything is
sent.
"""

from __future__ import annotations

import uuid
from functools import lru_cache

from .conf import outbox_settings

# Message-ID is "<" + 32 hex + "@" + domain + ">" in a 255-character column;
# also short enough that no mail library folds it onto a second line.
MAX_MESSAGE_ID_DOMAIN = 60


def make_message_id(domain: str) -> str:
    """A globally unique Message-ID for one recipient's copy (fits its column)."""
    if len(domain) > MAX_MESSAGE_ID_DOMAIN:
        domain = "localhost"  # a valid but absurdly long sender domain
    return f"<{uuid.uuid4().hex}@{domain}>"


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
