"""Enqueue from async code: ``aenqueue_email``, ``aenqueue_template``, ``aenqueue_many``.

Each is its sync namesake run the way Django's async ORM runs a query:
``sync_to_async(..., thread_sensitive=True)``, in the thread that runs the
request's sync code (or asgiref's one shared thread). The validation, the
write and the push after commit are the sync ones, not a copy of them.

Async code cannot hold ``transaction.atomic()`` open (Django's rule for its
async ORM too), so each call is a transaction of its own: its rows are
committed when it returns, and their ids go to Redis right after that commit.
To enqueue in one transaction with other writes, put them together in a sync
function and await ``sync_to_async(that_function)()``.

The three are made from the sync functions, not written out again: type
checkers see the sync parameters through a ``ParamSpec`` and
``inspect.signature`` through ``__wrapped__``, so the two can never differ.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from asgiref.sync import sync_to_async

from .api import enqueue_email, enqueue_template
from .bulk import enqueue_many

__all__ = ["aenqueue_email", "aenqueue_many", "aenqueue_template"]

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _awaitable(func: Callable[_P, _R], doc: str) -> Callable[_P, Coroutine[Any, Any, _R]]:
    """``func`` as a coroutine function named ``a<name>``, run in a thread-sensitive sync call."""
    call = sync_to_async(func, thread_sensitive=True)

    @functools.wraps(func)
    async def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        return await call(*args, **kwargs)

    wrapper.__name__ = wrapper.__qualname__ = f"a{func.__name__}"
    wrapper.__module__ = __name__
    wrapper.__doc__ = doc
    return wrapper


aenqueue_email = _awaitable(
    enqueue_email,
    """Await :func:`~outbox.enqueue_email`: the same arguments, checks and result.

    Each call is its own transaction; the ids go to Redis after its commit.
    """,
)

aenqueue_template = _awaitable(
    enqueue_template,
    """Await :func:`~outbox.enqueue_template`: the same arguments, checks and result.

    Each call is its own transaction; the ids go to Redis after its commit.
    """,
)

aenqueue_many = _awaitable(
    enqueue_many,
    """Await :func:`~outbox.enqueue_many`: the same items, checks and result.

    All items are one transaction; the ids go to Redis after its commit.
    """,
)
