"""The three systems the benchmark compares, in the order of every table: ours first."""

from __future__ import annotations

from types import ModuleType

from tests.benchmark import system_mailer, system_outbox, system_post_office

SYSTEMS: dict[str, ModuleType] = {
    "outbox": system_outbox,
    "post_office": system_post_office,
    "mailer": system_mailer,
}
