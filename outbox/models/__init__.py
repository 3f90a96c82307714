"""The outbox's tables: the database is the truth about every email.

``Email`` holds the content once per enqueue call, ``Delivery`` is one queue row
per recipient, and ``Attempt`` is the evidence log an operator reads before
settling a row by hand.

Every status change of a ``Delivery`` is a single conditional ``UPDATE``
(``WHERE status = ... AND claim_token = ...``) whose row count decides what
happens next; no code reads a row, changes it in Python and saves it back.

One module per concern, each importing only those above it in this list:

- ``limits``: column widths several tables share;
- ``routing``: ``routing.outbox_alias`` (the database of every row) and ``routing.OutboxManager``;
- ``instants``: ``instants.InstantField`` (times stored in UTC whatever ``USE_TZ`` says),
  ``instants.instant``;
- ``emails``: ``emails.Email`` and ``emails.Attachment``;
- ``deliveries``: ``deliveries.Delivery`` and ``deliveries.DeliveryQuerySet``;
- ``attempts``: ``attempts.Attempt``;
- ``templates``: ``templates.EmailTemplate``;
- ``suppression``: ``suppression.Suppression``.

Import from ``outbox.models``: the modules beneath it may move.
"""

from .attempts import Attempt
from .deliveries import Delivery, DeliveryQuerySet
from .emails import Attachment, Email
from .instants import InstantField, as_django_stores, epoch, instant, stored
from .limits import (
    MAILER_MAX_LENGTH,
    SERVER_ADDRESS_MAX_LENGTH,
    SERVER_HOST_MAX_LENGTH,
    WORKER_ID_MAX_LENGTH,
)
from .routing import OutboxManager, outbox_alias
from .suppression import Suppression
from .templates import EmailTemplate

__all__ = [
    "MAILER_MAX_LENGTH",
    "SERVER_ADDRESS_MAX_LENGTH",
    "SERVER_HOST_MAX_LENGTH",
    "WORKER_ID_MAX_LENGTH",
    "Attachment",
    "Attempt",
    "Delivery",
    "DeliveryQuerySet",
    "Email",
    "EmailTemplate",
    "InstantField",
    "OutboxManager",
    "Suppression",
    "as_django_stores",
    "epoch",
    "instant",
    "outbox_alias",
    "stored",
]
