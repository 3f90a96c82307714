"""Exceptions raised by the outbox.

Input errors are :class:`InvalidEmailError`, which is both Django's
:class:`~django.core.exceptions.ValidationError` and the ``ValueError`` /
``BadHeaderError`` Django's mail backends raise; configuration errors subclass
:class:`django.core.exceptions.ImproperlyConfigured`; everything the outbox
raises derives from :class:`OutboxError`.

A delivery backend, including a third-party one, tells the worker how a send
failed by raising (or chaining) one of these, importing nothing else::

    from outbox.exceptions import AmbiguousDeliveryError, DeliveryError

    raise DeliveryError("451 mailbox busy")                  # retried with backoff
    raise DeliveryError("550 no such user", permanent=True)  # failed, never retried
    raise AmbiguousDeliveryError("no reply after the body")  # in doubt: see below

Any other exception is classified by :func:`outbox.mail.failures.classify`.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.core.mail.message import BadHeaderError  # ValueError itself on Django 6


class OutboxError(Exception):
    """Base class of the outbox's own errors."""


class InvalidEmailError(OutboxError, ValidationError, BadHeaderError):
    """Input the outbox refuses, before anything is written.

    A ``ValidationError`` whose ``message_dict`` names the field, and also
    Django's ``BadHeaderError`` (a ``ValueError``; on Django 6 the same class):
    code written for Django's own backends, ``except ValueError`` or ``except
    BadHeaderError``, catches it where it caught Django's error.
    """


class OutboxConfigurationError(OutboxError, ImproperlyConfigured):
    """The ``OUTBOX`` settings (or the cache they point at) are unusable."""


class UnknownMailerError(OutboxConfigurationError):
    """An email names a mailer this worker's host does not configure.

    Its attempt fails as an unreachable server's does (retried, then
    ``failed``). Unlike a backend that cannot be created, it does not pause
    the mailer for every worker: the hosts whose settings name it can send.
    """


class DeliveryError(OutboxError):
    """Sending one delivery failed.

    ``permanent`` tells the worker not to retry (a 5xx refusal, an invalid
    address); otherwise the delivery is retried with backoff.
    """

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class AmbiguousDeliveryError(DeliveryError):
    """The message was handed over, but whether the server took it is unknown.

    Raise it when the failure happened *after* the whole message left your
    hands and *before* the server's verdict arrived: the connection dropped or
    timed out after SMTP's final ``.``, an HTTP API call timed out after the
    request body was sent, a sendmail child was killed after it had read the
    message. Do not raise it for a failure that happened before the body was
    complete (the server cannot have the message: raise :class:`DeliveryError`
    or let the original error through), nor for a clear refusal (a 4xx or 5xx
    answer is not in doubt).

    Raising it ``from`` the original error keeps the cause in the attempt log::

        try:
            response = session.post(url, data=payload, timeout=timeout)
        except requests.ReadTimeout as exc:
            raise AmbiguousDeliveryError("no answer from the API", message_id=mid) from exc

    The worker treats such an attempt exactly like a worker that died
    mid-send: under ``ABANDONED_POLICY = "review"`` the delivery becomes
    ``abandoned`` and is never resent without a person's decision; under
    ``"requeue"`` it is retried. It is found anywhere in an exception's
    ``__cause__`` / ``__context__`` chain, so a backend may also wrap it.

    ``message_id`` (optional) is the Message-ID of the message in doubt; it is
    added to the error text so that the attempt log names it.
    """

    def __init__(self, message: str, *, message_id: str | None = None) -> None:
        if message_id and message_id not in message:
            message = f"{message} (Message-ID {message_id})"
        # Never "permanent": code that only knows DeliveryError retries it,
        # which is what the app did for these errors before they had a type.
        super().__init__(message, permanent=False)
        self.message_id = message_id


class SendFencedError(OutboxError):
    """A send stopped before the message was handed over: the sender's lease ran out.

    Raised by the SMTP hand-over watcher when its fence says no right before
    the final ``.`` (the connection is closed without it, so the server
    discards the message). Nothing was delivered; the worker releases the row.
    """
