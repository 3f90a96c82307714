"""Message-ID stays unique, through a constraint instead of unique=True.

On PostgreSQL this drops the extra varchar_pattern_ops index Django gives a
unique CharField, which every delivery's three writes (insert, claim, sent)
paid for. Both steps run in the migration's one transaction, so the column is
never without its unique index to other sessions; on a large table the new
index is built while writes to it wait.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("outbox", "0005_postgresql_functions"),
    ]

    operations = [
        migrations.AlterField(
            model_name="delivery",
            name="message_id",
            field=models.CharField(max_length=255, verbose_name="Message-ID"),
        ),
        migrations.AddConstraint(
            model_name="delivery",
            constraint=models.UniqueConstraint(
                fields=("message_id",), name="outbox_delivery_message_id_uniq"
            ),
        ),
    ]
