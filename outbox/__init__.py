"""django-email-outbox: transactional email through a durable outbox.

``from outbox import enqueue_email`` is the public entry point; it is imported
lazily so that importing the package does not load models before Django is set up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["enqueue_email"]

if TYPE_CHECKING:
    from .api import enqueue_email


def __getattr__(name: str) -> Any:
    if name == "enqueue_email":
        from .api import enqueue_email

        return enqueue_email
    raise AttributeError(f"module 'outbox' has no attribute {name!r}")
