"""The worker's email cache (outbox/worker/cache.py): what it holds is what it counts.

Contents are bounded in bytes; the build of each email's message (Django's
message object, which on Django 6.1 alone holds about 130 KB of header and
part objects whatever the email's size) is kept for the most recently used
emails only, and its bytes in proportion to the email are counted while it
is kept.
"""

from __future__ import annotations

import gc
import os
import tracemalloc
import weakref
from email.message import Message

from outbox.mail.message import build_message
from outbox.models import Attachment, Delivery, Email
from outbox.worker.cache import EmailCache, build_size, email_size


def email(pk: int, attachment: int = 0) -> tuple[Email, list[Attachment]]:
    content = Email(
        pk=pk,
        subject=f"Order {pk}",
        body="Your order has shipped. " * 40,
        html_message="<p>Your order has shipped.</p>" * 100,
        from_email="shop@example.com",
        headers={},
        reply_to=[],
    )
    files = [Attachment(name="r.pdf", content=os.urandom(attachment), mimetype="application/pdf")]
    return content, files if attachment else []


def send_copy(cache: EmailCache, content: Email, files: list[Attachment]) -> Message:
    """Build one copy through the cache, as the worker's sender does; its built message."""
    delivery = Delivery(pk=content.pk, recipient=f"u{content.pk}@example.com")
    delivery.message_id = f"<{content.pk}@example.com>"
    copy = build_message(delivery, content, files, cache.builds(content))
    copy.message().as_bytes()
    [built] = [v for v in cache.builds(content).values() if isinstance(v, Message)]
    return built


def test_only_the_most_recent_emails_builds_are_kept():
    cache = EmailCache(max_builds=3)
    alive = []
    for pk in range(1, 11):
        cache.put(*email(pk))
        alive.append(weakref.ref(send_copy(cache, *email_in(cache, pk))))
    gc.collect()
    # Every email's contents are still cached; only three builds are alive.
    assert len(cache) == 10
    assert cache.kept_builds() == 3
    assert [ref() is not None for ref in alive] == [False] * 7 + [True] * 3


def email_in(cache: EmailCache, pk: int) -> tuple[Email, list[Attachment]]:
    found = cache.get(pk)
    assert found is not None
    return found


def test_a_kept_build_is_counted_until_it_is_dropped():
    cache = EmailCache(max_builds=1)
    one, files = email(1, attachment=10_000)
    cache.put(one, files)
    assert cache.size == email_size(one, files)
    send_copy(cache, one, files)
    assert cache.size == email_size(one, files) + build_size(one, files)
    two, none = email(2)
    cache.put(two, none)
    send_copy(cache, two, none)  # the only build kept is now two's
    assert cache.kept_builds() == 1
    assert cache.size == email_size(one, files) + email_size(two, none) + build_size(two, none)


def traced_build(content: Email, files: list[Attachment]) -> int:
    """Bytes allocated to build one copy's message through a fresh cache."""
    cache = EmailCache()
    cache.put(content, files)
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        built = send_copy(cache, content, files)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    assert built is not None
    return sum(stat.size_diff for stat in after.compare_to(before, "filename"))


def test_a_builds_bytes_in_proportion_to_the_email_are_counted():
    # What an attachment adds to a build (bytes, base64, Django's objects of
    # them), measured on this Django, is within what the cache counts for it.
    plain, none = email(1)
    attached, files = email(1, attachment=1_000_000)
    added = traced_build(attached, files) - traced_build(plain, none)
    assert added > 1_000_000  # the attachment is held, encoded
    assert added <= build_size(attached, files) - build_size(plain, none)
