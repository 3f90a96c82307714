"""enqueue_email's insert for one recipient as a PL/pgSQL function on PostgreSQL.

See ENQUEUE_ONE_FUNCTION_V1 in outbox/statements/functions.py. Elsewhere the
migration does nothing.
"""

from django.db import migrations

from outbox.statements.functions import (
    DROP_ENQUEUE_ONE,
    ENQUEUE_ONE_FUNCTION_V1,
    run_on_postgresql,
)


class Migration(migrations.Migration):
    dependencies = [
        ("outbox", "0007_email_mailer"),
    ]

    operations = [
        migrations.RunPython(
            run_on_postgresql(ENQUEUE_ONE_FUNCTION_V1), run_on_postgresql(DROP_ENQUEUE_ONE)
        ),
    ]
