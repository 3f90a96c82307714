"""Once: the group commit's batch of steps as one set-based function (PostgreSQL only).

The functions are now created by migration 0017 alone (with the DDL in that
file, ``OUTBOX_STEPS``), so this one does nothing; it stays so that the
migration graph is unchanged.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("outbox", "0011_message_structure"),
    ]

    # The functions are now created by 0017_postgresql_functions.
    operations = []
