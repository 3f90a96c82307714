"""The group commit's batch of steps as one set-based function (PostgreSQL only).

``STEPS_FUNCTION_V1`` in outbox/statements/functions.py: the successes and the
claims of several threads' steps as two UPDATEs, instead of ``outbox_step()``
once per step. ``outbox_step()`` stays: a step alone, and workers of the
previous release, call it.
"""

from django.db import migrations

from outbox.statements.functions import DROP_STEPS, STEPS_FUNCTION_V1, run_on_postgresql


class Migration(migrations.Migration):
    dependencies = [
        ("outbox", "0011_message_structure"),
    ]

    operations = [
        migrations.RunPython(
            run_on_postgresql(STEPS_FUNCTION_V1),
            run_on_postgresql(DROP_STEPS),
        ),
    ]
