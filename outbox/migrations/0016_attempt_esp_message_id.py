# The ESP's own id of a message sent through its HTTP API (issue 36, item 2), on
# the attempt log, and the outcome of an ESP's other events ("reported").
#
# No rewrite of the table: on PostgreSQL a column with a constant default is
# added to the catalog only (db_default), as in 0013. The index holds only the
# attempts that have an ESP id (partial), for the webhook's lookup; building it
# reads the attempt table once while writes to it wait.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("outbox", "0015_delivery_recipient_key"),
    ]

    operations = [
        migrations.AddField(
            model_name="attempt",
            name="esp_message_id",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                max_length=255,
                verbose_name="ESP message id",
            ),
        ),
        migrations.AlterField(
            model_name="attempt",
            name="outcome",
            field=models.CharField(
                choices=[
                    ("sent", "sent"),
                    ("retry", "will retry"),
                    ("failed", "failed"),
                    ("abandoned", "abandoned (worker went away)"),
                    ("ambiguous", "in doubt"),
                    ("requeued", "requeued"),
                    ("released", "released unsent"),
                    ("marked_sent", "marked sent"),
                    ("marked_failed", "marked failed"),
                    ("cancelled", "cancelled"),
                    ("bounced", "bounced (reported by the ESP)"),
                    ("rejected", "rejected (reported by the ESP)"),
                    ("complained", "spam complaint (reported by the ESP)"),
                    ("reported", "reported by the ESP"),
                ],
                max_length=16,
                verbose_name="outcome",
            ),
        ),
        migrations.AddIndex(
            model_name="attempt",
            index=models.Index(
                condition=models.Q(("esp_message_id", ""), _negated=True),
                fields=["esp_message_id"],
                name="outbox_attempt_esp_id",
            ),
        ),
    ]
