"""The settled-by-hand outcomes read "marked sent/failed": a reconciler settles rows too.

Only the labels change (the attempt's actor says who settled); nothing in the database.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("outbox", "0008_enqueue_one_function"),
    ]

    operations = [
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
                ],
                max_length=16,
                verbose_name="outcome",
            ),
        ),
    ]
