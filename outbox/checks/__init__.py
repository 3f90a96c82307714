"""System checks: a misconfigured outbox fails at ``manage.py check``, not at the first email.

One module per concern, each check registered on its own (``settings``,
``redis``, ``database``, ``functions``, ``delivery``, ``mailers``, ``esp``, ``sending``, ``content``,
``reconcilers``, ``retention``, ``sqlite``, ``urls``, ``valve``); importing this package
registers them all (``OutboxConfig.ready``). Every ID, with what it means and how to fix it, is
listed in one table: the README's "System checks" section. Messages are in
English, as Django's own checks are.
"""

from . import (
    content,
    database,
    delivery,
    esp,
    functions,
    mailers,
    reconcilers,
    redis,
    retention,
    sending,
    settings,
    sqlite,
    urls,
    valve,
)

__all__ = [
    "content",
    "database",
    "delivery",
    "esp",
    "functions",
    "mailers",
    "reconcilers",
    "redis",
    "retention",
    "sending",
    "settings",
    "sqlite",
    "urls",
    "valve",
]
