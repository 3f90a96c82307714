"""Putting mail in the outbox: validate, write the rows, push their ids after commit.

``prepare`` (validation, nothing written), ``sql`` (the insert statements),
``api`` (``enqueue_email``, ``enqueue_template``), ``bulk``
(``enqueue_many``) and ``asynchronous`` (the three for async code,
``aenqueue_email`` and so on). Their public names are ``outbox.enqueue_email``
and the others at the package's top.
"""

from .api import enqueue_email, enqueue_template
from .asynchronous import aenqueue_email, aenqueue_many, aenqueue_template
from .bulk import enqueue_many

__all__ = [
    "aenqueue_email",
    "aenqueue_many",
    "aenqueue_template",
    "enqueue_email",
    "enqueue_many",
    "enqueue_template",
]
