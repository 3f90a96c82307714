"""The worker's step as a PL/pgSQL function on PostgreSQL (see outbox/plpgsql.py)."""

from django.db import migrations

from outbox.plpgsql import DROP_STEP, STEP_V1, run_on_postgresql


class Migration(migrations.Migration):
    dependencies = [
        ("outbox", "0004_content"),
    ]

    operations = [
        migrations.RunPython(run_on_postgresql(STEP_V1), run_on_postgresql(DROP_STEP)),
    ]
