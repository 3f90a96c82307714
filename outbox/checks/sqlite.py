"""W015: a SQLite database left with Django's default options, beside a worker.

SQLite has one writer at a time. With ``startproject``'s settings Django
begins every transaction DEFERRED and waits 5 s for a lock. The outbox's own
enqueue transactions take their turn and the write lock at once
(:func:`outbox.enqueue.turns.write_transaction`), but the project's other
transactions, and an enqueue inside one of them, still meet the worker's
writes: one that read before it writes fails at once with "database is
locked", and one that waits longer than the timeout fails too. The two
options below make every transaction wait its turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.checks import CheckMessage, Warning, register
from django.db import DEFAULT_DB_ALIAS, connections

from ..models import outbox_alias
from .settings import outbox_dict

# What the README, the example project and the test settings set.
RECOMMENDED: dict[str, Any] = {"transaction_mode": "IMMEDIATE", "timeout": 20}
_LOCKING_MODES = ("IMMEDIATE", "EXCLUSIVE")
_DEFAULT_TIMEOUT = 5.0  # Python's sqlite3.connect()
_TIMEOUT = 20


@register()
def check_sqlite_options(
    app_configs: Sequence[Any] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """W015: the outbox's SQLite database lacks ``transaction_mode`` IMMEDIATE or a 20 s ``timeout``."""
    if outbox_dict() is None:
        return []
    warnings: list[CheckMessage] = []
    for alias in sorted({DEFAULT_DB_ALIAS, outbox_alias()}):
        settings_dict = connections[alias].settings_dict
        if "sqlite3" not in str(settings_dict.get("ENGINE", "")):
            continue
        name = str(settings_dict.get("NAME", ""))
        if name == ":memory:" or "mode=memory" in name:
            continue  # no worker process can share it
        missing = _missing(settings_dict.get("OPTIONS") or {})
        if missing:
            warnings.append(
                Warning(
                    f"Database {alias!r} is SQLite with {' and '.join(missing)}: beside the "
                    "worker, a transaction that reads before it writes fails at once with "
                    "'database is locked', and one that waits for the single write lock "
                    "longer than the timeout fails too.",
                    hint=f"Set DATABASES[{alias!r}]['OPTIONS'] = {RECOMMENDED!r}: each "
                    "transaction then takes the write lock when it begins, and waits up to "
                    "20 s for it.",
                    id="outbox.W015",
                )
            )
    return warnings


def _missing(options: dict[str, Any]) -> list[str]:
    missing = []
    mode = str(options.get("transaction_mode") or "DEFERRED").upper()
    if mode not in _LOCKING_MODES:
        missing.append(f"transaction_mode {mode}")
    timeout = options.get("timeout", _DEFAULT_TIMEOUT)
    if not isinstance(timeout, int | float) or timeout < _TIMEOUT:
        missing.append(f"timeout {timeout!r} s")
    return missing
