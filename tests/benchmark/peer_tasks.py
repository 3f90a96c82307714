"""The task of the latency part's Django Tasks + django-tasks-db peer (side_by_side.py).

Enqueued in the request's transaction (``send_one.enqueue(...)``: a row of
django-tasks-db's table, so a rolled-back request sends nothing), run by
``manage.py db_worker``; it sends with ``send_mail`` through the benchmark's
delivery backend, as a project's task would.
"""

from __future__ import annotations

from django.core.mail import send_mail
from django_tasks import task

from tests.benchmark import probe


@task()
def send_one(subject: str, body: str, sender: str, to: str) -> int:
    probe.record("start", to)  # the timeline (probe.py); a no-op without BENCH_TIMELINE
    return send_mail(subject, body, sender, [to])
