"""What every reconciler shares: the question, the answer, and the base class."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime


class Verdict(enum.Enum):
    """What a reconciler found out about one abandoned row."""

    SENT = "sent"
    NOT_SENT = "not sent"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Question:
    """One abandoned row, as a reconciler is asked about it.

    ``started_at`` is when the lost attempt began (the row's
    ``processing_started_at``), ``abandoned_at`` when the sweeper gave up on
    it: the server's record of the handover, if any, lies between the two.
    ``worker_id`` is the worker incarnation that made the attempt and
    ``mailer`` the email's mailer ("" = the worker's default target): within
    one incarnation a mailer always hands over to the same server, so the
    incarnation's other sent rows through that mailer show which server's
    record is the one to read (:mod:`outbox.reconcilers.evidence`).
    ``server_host`` and ``server_address`` name the server the attempt was
    handing the message to (its greeting host name, the peer ``ip:port``),
    "" where the row does not say: a mailer's host name may stand for a pool
    of relays, each new connection reaching any of them.
    """

    delivery_id: int
    message_id: str  # as the Message-ID header carries it, with its angle brackets
    recipient: str
    started_at: datetime | None
    abandoned_at: datetime
    worker_id: str = ""
    mailer: str = ""
    server_host: str = ""
    server_address: str = ""


@dataclass(frozen=True)
class Answer:
    """A reconciler's verdict on one row and the evidence for it.

    ``sure`` matters only for ``NOT_SENT``: whether the reconciler's record is
    complete enough to rule a handover out. ``evidence`` goes into the
    Attempt row that settles the delivery, for a person to read later.
    """

    verdict: Verdict
    sure: bool = False
    evidence: str = ""

    @classmethod
    def sent(cls, evidence: str) -> Answer:
        return cls(Verdict.SENT, True, evidence)

    @classmethod
    def not_sent(cls, evidence: str, *, sure: bool) -> Answer:
        return cls(Verdict.NOT_SENT, sure, evidence)

    @classmethod
    def unknown(cls, evidence: str = "") -> Answer:
        return cls(Verdict.UNKNOWN, False, evidence)


UNKNOWN = Answer.unknown()


class Reconciler:
    """Base class of the classes named in ``OUTBOX["RECONCILERS"]``.

    A subclass implements :meth:`answer` for one row, or :meth:`answer_many`
    when one look at its source serves many rows (a log file is read once per
    pass, not once per row). Instances are created once per sweep pass with no
    arguments; read settings from ``outbox_settings`` or
    ``outbox_settings.user_settings``.
    """

    def answer_many(self, questions: Sequence[Question]) -> dict[int, Answer]:
        """Answers by ``delivery_id``; a missing id counts as ``UNKNOWN``."""
        return {q.delivery_id: self.answer(q) for q in questions}

    def answer(self, question: Question) -> Answer:
        """The answer for one row; the default knows nothing."""
        return UNKNOWN

    @classmethod
    def dotted_path(cls) -> str:
        """``module.Class``: how Attempt rows name the reconciler."""
        return f"{cls.__module__}.{cls.__qualname__}"
