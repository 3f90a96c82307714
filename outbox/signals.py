"""Signals the outbox sends, always after the change they report is committed.

``email_enqueued(sender=Email, email=Email, deliveries=list[Delivery])``
    ``enqueue_email`` (or the outbox email backend) created deliveries.
``delivery_sent(sender=Delivery, delivery_id=int, worker_id=str, by=str)``
    A delivery reached ``sent`` (by a worker, or by an operator in the admin).
``delivery_failed(sender=Delivery, delivery_id=int, error=str, by=str)``
    A delivery reached ``failed``.
``delivery_abandoned(sender=Delivery, delivery_id=int, worker_id=str)``
    The sweeper marked a delivery ``abandoned``: its worker died mid-send.
"""

from django.dispatch import Signal

email_enqueued = Signal()
delivery_sent = Signal()
delivery_failed = Signal()
delivery_abandoned = Signal()
