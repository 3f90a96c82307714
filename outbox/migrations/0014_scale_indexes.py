from django.db import migrations, models


class Migration(migrations.Migration):
    """The failed, abandoned and cancelled rows by (status, id, priority): see Delivery.Meta.

    A plain AddIndex, not AddIndexConcurrently: the index holds only those rows
    (about 2 % of a table), so building it reads the table once but writes
    little, and AddIndexConcurrently would make this migration non-atomic on
    PostgreSQL only, for a lock that lasts seconds on millions of rows. A site
    that cannot take that lock builds the same index with CREATE INDEX
    CONCURRENTLY first and then runs ``migrate --fake`` for this migration.
    """

    dependencies = [
        ("outbox", "0013_attempt_handover_server"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="delivery",
            index=models.Index(
                condition=models.Q(("status__in", ["failed", "abandoned", "cancelled"])),
                fields=["status", "id", "priority"],
                name="outbox_deliv_attention_id",
            ),
        ),
    ]
