"""A database router that gives the outbox a database of its own (tests/models/test_routing.py).

The outbox's tables are written to "routed"; reads of them are sent to
"default", as a project's router may send reads to a replica. "default" has
the outbox's tables but none of its rows: whatever reads the outbox's rows
there, instead of where the outbox writes them, finds nothing.
"""

from __future__ import annotations

from typing import Any

OUTBOX_DATABASE = "routed"
REPLICA = "default"  # the stand-in for a replica that lags forever


class OutboxRouter:
    def db_for_write(self, model: type[Any], **hints: Any) -> str | None:
        return OUTBOX_DATABASE if model._meta.app_label == "outbox" else None

    def db_for_read(self, model: type[Any], **hints: Any) -> str | None:
        return REPLICA if model._meta.app_label == "outbox" else None
