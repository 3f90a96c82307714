"""The SQL of the hot paths, one module per database: each is the whole of it.

``postgresql.py`` and ``sqlite.py`` hold, as text, every statement that runs
once per email or per enqueue call on that database, with the rules they keep;
PostgreSQL's calls the PL/pgSQL functions that migration 0017 creates. The code
that runs them and maps their rows is in ``outbox/worker/sql.py`` (the worker)
and ``outbox/enqueue/sql.py`` (enqueueing). Everything else the app does goes
through Django's ORM.
"""
