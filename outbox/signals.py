"""Signals the outbox sends, always after the change they report is committed.

Each is sent once per change, with ``send_robust``: an exception in a receiver
is logged by Django (logger ``django.dispatch``) and never reaches the outbox.
All arguments are keyword arguments.

``email_enqueued(sender=Email, email=Email, deliveries=list[Delivery])``
    ``enqueue_email`` or the outbox email backend created deliveries: once per
    :class:`~outbox.models.Email`, with the deliveries that call created (not
    those an idempotency key made it reuse). Nothing is sent if the caller's
    transaction rolls back.
``delivery_sent(sender=Delivery, delivery_id=int, worker_id=str, by=str)``
    A delivery reached ``sent``. From a worker: ``by="worker"`` and
    ``worker_id`` is that worker. From an operator marking an abandoned row
    sent: ``by`` is the operator's name and ``worker_id`` the worker that held
    the row (may be ``""``).
``delivery_failed(sender=Delivery, delivery_id=int, error=str, by=str)``
    A delivery reached ``failed``. ``error`` is the last error (from a worker:
    ``"<ExceptionClass>: <message>"``). ``by`` is ``"worker"`` (a permanent
    error, or the last attempt failed), ``"sweeper"`` (policy ``"requeue"``
    and its worker died on every attempt) or the operator's name.
``delivery_abandoned(sender=Delivery, delivery_id=int, worker_id=str)``
    The sweeper marked a delivery ``abandoned``: ``worker_id`` died mid-send,
    so whether the message left is unknown until someone checks the mail logs.
"""

from django.dispatch import Signal

email_enqueued = Signal()
delivery_sent = Signal()
delivery_failed = Signal()
delivery_abandoned = Signal()
