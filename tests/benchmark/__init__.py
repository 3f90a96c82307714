"""The benchmark: django-email-outbox against django-post-office and django-mailer.

Run it with ``tests/benchmark/run.sh`` (the runner is ``run.py``); results go to ``results/``.
"""
