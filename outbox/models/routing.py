"""Which database the outbox's rows live in, and the manager that queries it."""

from __future__ import annotations

from typing import TypeVar

from django.apps import apps
from django.db import models, router

_Row = TypeVar("_Row", bound=models.Model)


def outbox_alias() -> str:
    """The database of the outbox's rows: the project's routers' write database for ``Delivery``.

    Every process uses it, for reads as well as writes: enqueue, the worker,
    the sweeper, operations and the admin's actions, status, metrics and the
    checks. Reads go to the write database on purpose: a router may send
    reads to a replica, and a replica lags, while the outbox decides what to
    send, retry or repair from its own rows. Read from a stale copy, a claim
    or a repair would act on a state the row has left. All of the outbox's
    tables live in this one database: an outcome, its Attempt row and its
    suppressions are one transaction.

    Asked each time, never cached: routers are settings. Without routers,
    ``DEFAULT_DB_ALIAS``.
    """
    # By the registry, not an import: the tables' modules import this one.
    return router.db_for_write(apps.get_model("outbox", "Delivery"))


class OutboxManager(models.Manager[_Row]):
    """The manager of the outbox's tables: every query on :func:`outbox_alias`.

    So that ORM code reads and writes the rows where the worker and enqueue do,
    whatever a router says for reads; ``.using(alias)`` after it still wins.
    Related lookups (``delivery.email``) follow the instance's database
    unless a router says otherwise.
    """

    def get_queryset(self) -> models.QuerySet[_Row]:
        return super().get_queryset().using(outbox_alias())
