"""The SQL of the hot paths, one module per database: each is the whole of it.

:mod:`~outbox.statements.postgresql` and :mod:`~outbox.statements.sqlite` hold, as
text, every statement that runs once per email or per enqueue call on that
database, with the rules they keep; PostgreSQL's calls the PL/pgSQL functions
that migration 0017 creates. The code that runs them and maps their rows is in
:mod:`outbox.worker.sql` (the worker) and :mod:`outbox.enqueue.sql` (enqueueing).
Everything else the app does goes through Django's ORM.
"""
