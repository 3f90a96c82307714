"""What a message from the drop-in backend needs to be built exactly as Django would.

``Email.structure`` and ``Attachment.mime_part`` (see outbox.mail.structure.describe).
It also replaced, on PostgreSQL, the worker's step function by the version that
returns the structure; the functions are now created by migration 0017 alone.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("outbox", "0010_suppression_idna_addresses"),
    ]

    operations = [
        migrations.AddField(
            model_name="email",
            name="structure",
            field=models.JSONField(
                blank=True,
                default=None,
                editable=False,
                null=True,
                verbose_name="message structure",
            ),
        ),
        migrations.AddField(
            model_name="attachment",
            name="mime_part",
            field=models.BooleanField(db_default=False, default=False, verbose_name="MIME part"),
        ),
        # The step function that returns the structure: now 0017_postgresql_functions.
    ]
