"""The worker's cache of email contents, bounded in bytes, and of their builds, bounded in number.

An ``Email`` and its attachments never change once written, and a
multi-recipient email's deliveries are claimed one after another, so the
worker keeps recently used contents in memory instead of reading them for
every recipient. The bound is in bytes, not entries: a few hundred cached
25 MB attachments must not become gigabytes. An email larger than the whole
budget is simply not cached.

Each email's copies also share one build of its message
(``outbox.mail.message.build_message``): Django's message object, whose parts
hold the texts again and each attachment base64-encoded, plus the objects of
its headers and parts. Those objects cost about 130 KB a build on Django 6.1 (its modern
email API parses every header), 10 KB on 5.2, whatever the email's size,
so the builds are kept for the :data:`MAX_BUILDS` most recently used
emails only: the copies of an email in flight share one, and a process
that has sent a million single-recipient emails holds no more builds than
one that has sent a hundred. The bytes a build holds in proportion to
the email (its texts, base64) are counted in the email's size while its
build is kept.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, NamedTuple

from ..models import Attachment, Email
from .sql import load_email

# Default budget per worker process.
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
# The emails whose build is kept (module docstring): the copies of a
# multi-recipient email are claimed one after another by the threads.
MAX_BUILDS = 16
# Rough per-entry overhead of the objects themselves.
_OVERHEAD = 1024


def email_size(email: Email, attachments: list[Attachment]) -> int:
    """Approximate bytes held by one cached email's contents (its build is counted apart)."""
    size = _OVERHEAD + len(email.subject) + len(email.body) + len(email.html_message or "")
    return size + sum(len(a.content) + len(a.name) + _OVERHEAD for a in attachments)


def build_size(email: Email, attachments: list[Attachment]) -> int:
    """Bytes a build of ``email`` holds in proportion to it: measured, rounded up.

    Its texts twice (Django's object and the encoded part), and each
    attachment as bytes (a copy, when the database returns a memoryview) and
    base64-encoded, a third larger: 2.5 times, measured with tracemalloc on
    Django 5.2 and 6.1.
    """
    texts = len(email.subject) + len(email.body) + len(email.html_message or "")
    return 2 * texts + sum(len(a.content) * 5 // 2 for a in attachments)


class _Entry(NamedTuple):
    email: Email
    attachments: list[Attachment]
    size: int  # the contents'
    build: int  # build_size, counted while the build is kept


class EmailCache:
    """Least-recently-used contents by email id, at most ``max_bytes`` in all.

    ``size`` counts the contents and the kept builds' proportional bytes;
    at most ``max_builds`` builds are kept.
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, max_builds: int = MAX_BUILDS) -> None:
        self.max_bytes = max_bytes
        self.max_builds = max_builds
        self.size = 0
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._builds: OrderedDict[int, dict[Any, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def kept_builds(self) -> int:
        """How many emails' builds are kept (at most ``max_builds``)."""
        with self._lock:
            return len(self._builds)

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
            return entry.email, entry.attachments

    def builds(self, email: Email) -> dict[Any, Any]:
        """Where the message built from ``email`` is kept for its next copies.

        A fresh dict if ``email`` is not the cached instance (too large, or
        dropped since): that copy builds alone. Keeping this email's build may
        drop the least recently used one (a copy being sent keeps its own
        until it is sent).
        """
        with self._lock:
            entry = self._entries.get(email.pk)
            if entry is None or entry.email is not email:
                return {}
            built = self._builds.get(email.pk)
            if built is not None:
                self._builds.move_to_end(email.pk)
                return built
            built = self._builds[email.pk] = {}
            self.size += entry.build
            while len(self._builds) > self.max_builds:
                self._drop_build(next(iter(self._builds)))
            self._shrink()
            return built

    def put(self, email: Email, attachments: list[Attachment]) -> None:
        size = email_size(email, attachments)
        build = build_size(email, attachments)
        if size + build > self.max_bytes:
            return
        with self._lock:
            if email.pk in self._entries:
                self._drop(email.pk)
            self._entries[email.pk] = _Entry(email, attachments, size, build)
            self.size += size
            self._shrink()

    def _shrink(self) -> None:
        while self.size > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def _drop(self, pk: int) -> None:
        self._drop_build(pk)
        self.size -= self._entries.pop(pk).size

    def _drop_build(self, pk: int) -> None:
        if self._builds.pop(pk, None) is not None:
            self.size -= self._entries[pk].build

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
