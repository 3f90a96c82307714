"""A delivery in flight: one claimed id in a sender thread, from its claim to its ack.

It is made from the queue's ``Claimed`` (its id and priority) when the loop
takes the ids of a claim (``loop.SenderLoop.pending``), and carries its own
state from there, in the protocol's words:

1. claimed: the id and its priority, nothing else known yet;
2. the mark issued: its claim token, drawn at the first try
   (:meth:`InFlight.draw_token`) and kept across the retries (a step that may
   have committed unseen is retried, or set back, under the same token:
   :attr:`InFlight.tried`), and the incarnation and time of the latest try
   (``worker_id``, whose lease fences the send, and ``issued``);
3. marked: the row the mark returned, with its email and attachments
   (:meth:`InFlight.take_row`); only now may :attr:`InFlight.delivery` and
   :attr:`InFlight.email` be read;
4. its outcome: a ``Settlement`` naming it (``outcomes.Settlement.flight``),
   the thread's outcome in hand (held by ``settling.Settling``) until it is
   settled;
5. acked: its id rides on the thread's next claim (``loop.SenderLoop.acks``),
   and the flight is gone (so is a flight held or dropped as stale).

A companion (the other rows of one ESP request) is a flight of its own, made
marked (:meth:`InFlight.companion`): in no processing list, never claimed.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from ..models import Attachment, Delivery, Email


@dataclass(eq=False, slots=True)
class InFlight:
    """One delivery in flight; see the module docstring for its stages."""

    id: int
    priority: str
    worker_id: str = ""  # the incarnation the mark was issued under: whose lease fences the send
    _token: uuid.UUID | None = field(default=None, init=False, repr=False)
    _delivery: Delivery | None = field(default=None, init=False, repr=False)
    _email: Email | None = field(default=None, init=False, repr=False)
    _attachments: list[Attachment] | None = field(default=None, init=False, repr=False)

    @classmethod
    def marked(
        cls,
        delivery: Delivery,
        email: Email,
        attachments: list[Attachment],
        token: uuid.UUID,
        worker_id: str,
    ) -> InFlight:
        """A flight whose row is already marked ``processing`` under ``token``."""
        flight = cls(delivery.pk, delivery.priority, worker_id)
        flight._token = token
        flight.take_row(delivery, email, attachments)
        return flight

    def companion(self, delivery: Delivery) -> InFlight:
        """A companion's flight: ``delivery``, marked under this flight's token, sent with it."""
        return InFlight.marked(delivery, self.email, self.attachments, self.token, self.worker_id)

    def draw_token(self, new: Callable[[], uuid.UUID]) -> None:
        """A try to mark it: its claim token is drawn (``new()``) at the first, kept after."""
        if self._token is None:
            self._token = new()

    @property
    def tried(self) -> bool:
        """Whether a mark was tried: the row may be ``processing`` under its token."""
        return self._token is not None

    @property
    def token(self) -> uuid.UUID:
        """The claim token; a mark must have been tried."""
        if self._token is None:
            raise RuntimeError(f"delivery {self.id} has no claim token: no mark was tried yet")
        return self._token

    def take_row(self, delivery: Delivery, email: Email, attachments: list[Attachment]) -> None:
        """The mark's answer: the row marked ``processing``, its email and attachments."""
        self._delivery, self._email, self._attachments = delivery, email, attachments

    @property
    def delivery(self) -> Delivery:
        """The row as the mark returned it; the mark must have answered."""
        if self._delivery is None:
            raise RuntimeError(f"delivery {self.id} is not marked yet")
        return self._delivery

    @property
    def email(self) -> Email:
        """The row's email; the mark must have answered."""
        if self._email is None:
            raise RuntimeError(f"delivery {self.id} is not marked yet: its email is not read")
        return self._email

    @property
    def attachments(self) -> list[Attachment]:
        """The email's attachments; the mark must have answered."""
        if self._attachments is None:
            raise RuntimeError(
                f"delivery {self.id} is not marked yet: its attachments are not read"
            )
        return self._attachments
