"""Once: enqueue_email's insert for one recipient as a PL/pgSQL function on PostgreSQL.

The functions are now created by migration 0017 alone (with the DDL in that
file), so this one does nothing; it stays so that the migration graph is
unchanged.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("outbox", "0007_email_mailer"),
    ]

    # The functions are now created by 0017_postgresql_functions.
    operations = []
