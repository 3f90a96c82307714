"""Putting mail in the outbox: validate, write the rows, push their ids after commit.

``prepare`` (validation, nothing written), ``sql`` (the insert statements),
``api`` (``enqueue_email``, ``enqueue_template``) and ``bulk``
(``enqueue_many``). Their public names are ``outbox.enqueue_email`` and the
others at the package's top.
"""

from .api import enqueue_email, enqueue_template
from .bulk import enqueue_many

__all__ = ["enqueue_email", "enqueue_many", "enqueue_template"]
