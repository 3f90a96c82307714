"""The latency part's timeline probe: when each email passed each step, in a worker process.

Installed only when the benchmark's child environment sets BENCH_TIMELINE (a
folder): the benchmark's settings then add :class:`ProbeConfig` to INSTALLED_APPS,
whose ``ready()`` wraps public functions of this process; without it nothing is
imported or wrapped, so the worker's hot path costs what it always does.

What it records, with ``time.time()`` (one clock for every process of the machine):

- the outbox's worker: ``claim`` (``RedisQueue.claim`` returned the id), ``mark``
  (``outbox.worker.attempt.take_marked_row`` called, under the name the loop calls:
  the step that marked the row ``processing`` has committed), ``conn`` (the
  thread's mail connection is open, ``Connection.ensure_open`` returned),
  ``fence`` (each ``Sender.may_hand_over``: the first right before the backend's
  ``send_messages``, the last right before SMTP's final dot);
- Celery: ``start`` (the documented ``task_prerun`` signal), per recipient;
- Django Tasks: ``start``, recorded by the task itself (peer_tasks.py).

A record is a tuple appended to a list (well under a microsecond); a thread of
this process writes the list to ``<folder>/<pid>.tl`` twice a second, one line
per record: ``step key time``. The thread is started by the first record made
in a process, so a forked child (``--processes``, Celery's prefork pool) has its
own.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.apps import AppConfig

FLUSH_SECONDS = 0.5

_records: list[tuple[str, object, float]] = []
_flusher_pid = 0
_folder = ""
_local = threading.local()


def record(step: str, key: object, when: float | None = None) -> None:
    """Note that ``key`` (a delivery id, or a recipient) passed ``step`` now."""
    global _flusher_pid
    if not _folder:
        return
    if _flusher_pid != os.getpid():
        _flusher_pid = os.getpid()
        _records.clear()  # a forked child starts with its parent's unwritten list
        threading.Thread(target=_flush_forever, name="bench-probe", daemon=True).start()
    _records.append((step, key, time.time() if when is None else when))


def _flush_forever() -> None:
    path = Path(_folder) / f"{os.getpid()}.tl"
    with path.open("a") as f:
        while True:
            time.sleep(FLUSH_SECONDS)
            taken = len(_records)
            if taken:
                batch = _records[:taken]
                del _records[:taken]
                f.write("".join(f"{s} {k} {t:.6f}\n" for s, k, t in batch))
                f.flush()


def read(folder: str | Path) -> list[tuple[str, str, float]]:
    """Every record the processes of a run wrote to ``folder``."""
    out = []
    for path in Path(folder).glob("*.tl"):
        for line in path.read_text().splitlines():
            step, key, when = line.split(" ")
            out.append((step, key, float(when)))
    return out


def _after(step: str, key_of: Callable[..., Any]) -> Callable[[Callable[..., Any]], Any]:
    """Wrap a function: record ``step`` for ``key_of(result, *args)`` once it returned."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            result = fn(*args, **kwargs)
            when = time.time()
            for key in key_of(result, *args):
                record(step, key, when)
            return result

        return wrapper

    return wrap


def _install_outbox() -> None:
    from outbox.queue import reliable
    from outbox.worker import attempt, connections, loop

    reliable.RedisQueue.claim = _after("claim", lambda result, *_a: [c.id for c in result.items])(
        reliable.RedisQueue.claim
    )

    take_marked_row = loop.take_marked_row

    @functools.wraps(take_marked_row)
    def marked(worker: Any, flight: Any, *args: Any, **kwargs: Any) -> Any:
        # Called right after the step that marked the row committed.
        record("mark", flight.id)
        _local.current = flight.id
        return take_marked_row(worker, flight, *args, **kwargs)

    loop.take_marked_row = marked  # the name the loop calls

    ensure_open = connections.Connection.ensure_open

    @functools.wraps(ensure_open)
    def opened(self: Any) -> None:
        ensure_open(self)
        record("conn", getattr(_local, "current", None))

    connections.Connection.ensure_open = opened  # type: ignore[method-assign]

    may_hand_over = attempt.Sender.may_hand_over

    @functools.wraps(may_hand_over)
    def fence(self: Any) -> bool:
        record("fence", getattr(_local, "current", None))
        return may_hand_over(self)

    # Before any Sender exists: each binds it for its connections' fence too.
    attempt.Sender.may_hand_over = fence  # type: ignore[method-assign]


def _install_celery() -> None:
    from celery.signals import task_prerun

    def started(sender: Any = None, args: Any = None, **_kw: Any) -> None:
        when = time.time()
        for message in (args or [[]])[0]:
            for to in message.get("to", []):
                record("start", to, when)

    task_prerun.connect(started, weak=False)


class ProbeConfig(AppConfig):
    name = "tests.benchmark.probe"
    label = "bench_probe"

    def ready(self) -> None:
        global _folder
        _folder = os.environ["BENCH_TIMELINE"]
        _install_outbox()
        try:
            import celery  # noqa: F401
        except ImportError:
            return
        _install_celery()
