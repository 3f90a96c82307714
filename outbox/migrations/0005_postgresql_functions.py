"""Once: the worker's step and enqueue_email's insert as PL/pgSQL functions on PostgreSQL.

It created them only while a setting allowed it. The functions are now
created by migration 0017 alone (with the DDL in that file), so this one does
nothing; it stays so that the migration graph is unchanged.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("outbox", "0004_content"),
    ]

    # The functions are now created by 0017_postgresql_functions.
    operations = []
