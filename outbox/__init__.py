"""django-email-outbox: transactional email through a durable outbox.

``from outbox import enqueue_email`` is the public entry point, with
``enqueue_template``, ``enqueue_many``, their awaitable twins for async code
(``aenqueue_email``, ``aenqueue_template``, ``aenqueue_many``), ``suppress``
and ``unsuppress``; they are imported lazily so that importing the package
does not load models before Django is set up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = [
    "aenqueue_email",
    "aenqueue_many",
    "aenqueue_template",
    "enqueue_email",
    "enqueue_many",
    "enqueue_template",
    "suppress",
    "unsuppress",
]

if TYPE_CHECKING:
    from .enqueue.api import enqueue_email, enqueue_template
    from .enqueue.asynchronous import aenqueue_email, aenqueue_many, aenqueue_template
    from .enqueue.bulk import enqueue_many
    from .suppression import suppress, unsuppress

# Public name -> the module that defines it.
_HOMES = {
    "aenqueue_email": "enqueue",
    "aenqueue_template": "enqueue",
    "aenqueue_many": "enqueue",
    "enqueue_email": "enqueue",
    "enqueue_template": "enqueue",
    "enqueue_many": "enqueue",
    "suppress": "suppression",
    "unsuppress": "suppression",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'outbox' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{home}", __name__), name)
