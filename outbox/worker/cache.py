"""The worker's cache of email contents, bounded in bytes.

An ``Email`` and its attachments never change once written, and a
multi-recipient email's deliveries are claimed one after another, so the
worker keeps recently used contents in memory instead of reading them for
every recipient. The bound is in bytes, not entries: a few hundred cached
25 MB attachments must not become gigabytes. An email larger than the whole
budget is simply not cached.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from ..models import Attachment, Email
from .sql import load_email

# Default budget per worker process.
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
# Rough per-entry overhead of the objects themselves.
_OVERHEAD = 1024


def email_size(email: Email, attachments: list[Attachment]) -> int:
    """Approximate bytes held by one cached email, with the message built from it.

    The build (see ``build_message``) holds the texts again and each
    attachment base64-encoded, a third larger than the raw bytes.
    """
    size = _OVERHEAD + 2 * (len(email.subject) + len(email.body) + len(email.html_message or ""))
    return size + sum(len(a.content) * 7 // 3 + len(a.name) + _OVERHEAD for a in attachments)


class EmailCache:
    """Least-recently-used contents by email id, at most ``max_bytes`` in all."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self._entries: OrderedDict[int, tuple[Email, list[Attachment], int, dict[Any, Any]]] = (
            OrderedDict()
        )
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def recent(self) -> int:
        """The id of the most recently used email (0 if none).

        The next claim is most likely for the same email, whose content the
        claim statement then need not read.
        """
        with self._lock:
            return next(reversed(self._entries), 0)

    def get(self, email_id: int) -> tuple[Email, list[Attachment]] | None:
        with self._lock:
            entry = self._entries.get(email_id)
            if entry is None:
                return None
            self._entries.move_to_end(email_id)
            return entry[0], entry[1]

    def builds(self, email: Email) -> dict[Any, Any]:
        """Where the message built from ``email`` is kept for its next copies.

        A fresh dict if ``email`` is not the cached instance (too large, or
        dropped since): that copy builds alone.
        """
        with self._lock:
            entry = self._entries.get(email.pk)
            return entry[3] if entry is not None and entry[0] is email else {}

    def put(self, email: Email, attachments: list[Attachment]) -> None:
        size = email_size(email, attachments)
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(email.pk, None)
            if old is not None:
                self.size -= old[2]
            self._entries[email.pk] = (email, attachments, size, {})
            self.size += size
            while self.size > self.max_bytes:
                _pk, (_e, _a, dropped, _b) = self._entries.popitem(last=False)
                self.size -= dropped

    def content(self, email_id: int) -> tuple[Email, list[Attachment]]:
        """The email and its attachments: from the cache, or read (and cached)."""
        cached = self.get(email_id)
        if cached is not None:
            return cached
        return self.remember(*load_email(email_id))

    def remember(self, email: Email, has_attachments: bool) -> tuple[Email, list[Attachment]]:
        """Cache ``email`` (read with its claim), reading its attachments if it has any."""
        attachments = (
            list(Attachment.objects.filter(email_id=email.pk).order_by("pk"))
            if has_attachments
            else []
        )
        self.put(email, attachments)
        return email, attachments
