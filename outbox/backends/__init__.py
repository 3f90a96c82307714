"""The email backends the outbox ships, at their documented paths.

``outbox.backends.OutboxBackend`` queues mail; ``SendmailBackend`` delivers
through a sendmail-compatible program; ``watch_handover`` makes a third-party
SMTP backend report a connection lost after the final dot as in doubt.
"""

from ..mail.handover import watch_handover
from ..mail.sendmail import SendmailBackend
from .outbox import OutboxBackend

__all__ = ["OutboxBackend", "SendmailBackend", "watch_handover"]
