"""The worker's step and enqueue_email's insert as PL/pgSQL functions on PostgreSQL.

See outbox/statements/functions.py. Elsewhere the migration does nothing.
"""

from django.db import migrations

from outbox.statements.functions import (
    DROP_ENQUEUE,
    DROP_STEP,
    ENQUEUE_FUNCTION_V1,
    STEP_FUNCTION_V1,
    run_on_postgresql,
)


class Migration(migrations.Migration):
    dependencies = [
        ("outbox", "0004_content"),
    ]

    operations = [
        migrations.RunPython(run_on_postgresql(STEP_FUNCTION_V1), run_on_postgresql(DROP_STEP)),
        migrations.RunPython(run_on_postgresql(ENQUEUE_FUNCTION_V1), run_on_postgresql(DROP_ENQUEUE)),
    ]
