"""An enqueue's transaction, and on SQLite its turn for the one writer.

``enqueue_email`` and ``enqueue_many`` open their transaction here
(:func:`write_transaction`); the writes inside it are :mod:`outbox.enqueue.sql`'s.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connections, transaction

from ..statements import sqlite

# One lock per database alias: this process's enqueue transactions on SQLite,
# one at a time.
_sqlite_writers: dict[str, threading.Lock] = {}
_sqlite_writers_guard = threading.Lock()


@contextmanager
def write_transaction(using: str) -> Iterator[None]:
    """``transaction.atomic(using=using)`` for an enqueue; on SQLite, made to wait its turn.

    SQLite has one writer at a time, and Django's defaults (``startproject``:
    no ``transaction_mode``, a 5 s busy timeout) let a web process's threads
    compete for it by polling: under a few dozen concurrent requests beside a
    worker, some waited past 5 s and failed with "database is locked". When
    this call opens the transaction (not inside the caller's ``atomic()``),
    this process's enqueues take their turn on a lock instead, so each one
    meets only other processes (the worker, one writer at a time too) in
    SQLite's busy handler, and the transaction takes the write lock first
    (:data:`outbox.statements.sqlite.TAKE_WRITE_LOCK`). Inside the caller's
    transaction the caller's locking applies, whatever it is.

    The turn ends with the commit, before the other on_commit callbacks (the
    Redis push, the signal), so a slow or absent Redis never holds up the
    next enqueue's turn, and a receiver that enqueues again takes a new one.
    """
    connection = connections[using]
    if connection.vendor != "sqlite" or connection.in_atomic_block:
        with transaction.atomic(using=using):
            yield
        return
    lock = _sqlite_writer(using)
    lock.acquire()
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            lock.release()

    try:
        with transaction.atomic(using=using):
            transaction.on_commit(release, using=using)  # the first callback to run
            with connection.cursor() as cursor:
                cursor.execute(sqlite.TAKE_WRITE_LOCK)
            yield
    finally:
        release()  # a rollback runs no callback


def _sqlite_writer(using: str) -> threading.Lock:
    with _sqlite_writers_guard:
        lock = _sqlite_writers.get(using)
        if lock is None:
            lock = _sqlite_writers[using] = threading.Lock()
        return lock
