"""Exceptions raised by the outbox.

Input errors are :class:`django.core.exceptions.ValidationError`; configuration
errors subclass :class:`django.core.exceptions.ImproperlyConfigured`; everything
else the outbox raises derives from :class:`OutboxError`.
"""

from django.core.exceptions import ImproperlyConfigured


class OutboxError(Exception):
    """Base class of the outbox's own runtime errors."""


class OutboxConfigurationError(OutboxError, ImproperlyConfigured):
    """The ``OUTBOX`` settings (or the cache they point at) are unusable."""


class DeliveryError(OutboxError):
    """Sending one delivery failed.

    ``permanent`` tells the worker not to retry (a 5xx refusal, an invalid
    address); otherwise the delivery is retried with backoff.
    """

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent
