"""Python's email package: a message copy with a header list of its own.

Each recipient's copy of an email is the email's one built message with its
own Message-ID and Date (``outbox.mail.message``). ``copy.copy`` of an
``email.message.Message`` shares its header list, the private ``_headers``,
so ``replace_header`` on the copy would change every copy. The public way,
``copy.deepcopy``, copies every part and attachment too: as much CPU as
building the message again, for each recipient. A new list of the same
header objects is all that must be the copy's own; the parts stay shared
and are only read.
"""

from __future__ import annotations

import copy
from email.message import Message

__all__ = ["copy_with_own_headers"]


def copy_with_own_headers(message: Message) -> Message:
    """A shallow copy of ``message`` whose header list is its own (its parts are shared)."""
    duplicate = copy.copy(message)
    duplicate._headers = list(message._headers)  # type: ignore[attr-defined]
    return duplicate
