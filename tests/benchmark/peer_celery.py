"""The Celery app of the latency part's Celery + django-celery-email peer (side_by_side.py).

What a Django project's Celery module holds: settings from Django's (``CELERY_*``),
the tasks of the installed apps (djcelery_email's ``send_emails``). The worker::

    celery -A tests.benchmark.peer_celery worker --pool prefork --concurrency 2

The broker is its own redis-server (BENCH_CELERY_BROKER_URL), started and stopped
by pid by the latency part.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.benchmark.settings")

app = Celery("bench")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
