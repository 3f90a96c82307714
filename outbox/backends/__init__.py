"""The email backends the outbox ships, at their documented paths.

``outbox.backends.OutboxBackend`` queues mail; ``SendmailBackend`` delivers
through a sendmail-compatible program; ``watch_handover`` makes an SMTP
backend report a connection lost after the final dot as in doubt. It watches
the backends the outbox creates; a backend that creates its own Django SMTP
backend inside makes it from ``bounded_backend_class(its_class)``.
"""

from ..mail.bounded import bounded_backend_class
from ..mail.handover import watch_handover
from ..mail.sendmail import SendmailBackend
from .outbox import OutboxBackend

__all__ = ["OutboxBackend", "SendmailBackend", "bounded_backend_class", "watch_handover"]
