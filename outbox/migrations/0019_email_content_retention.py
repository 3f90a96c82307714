"""Secrets that do not linger: an email's content is cleared when settled (outbox.sweeper.retention).

``Email.sensitive`` (with a database default, for a previous release's
inserts during a rolling upgrade), ``Email.content_cleared_at``, the
permission ``outbox.view_email_content`` the admin asks before it shows a
body, and two partial indexes the sweeper finds the emails to clear by.

Plain AddIndex, as in 0014: on an existing table every email still has its
content, so ``outbox_email_content_kept`` is built over all of them once (a
lock of seconds on millions of rows) and shrinks as the sweeper clears them.
A site that cannot take that lock builds it with CREATE INDEX CONCURRENTLY
first and runs ``migrate --fake`` for this migration.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("outbox", "0018_delivery_instants"),
    ]

    operations = [
        migrations.AddField(
            model_name="email",
            name="sensitive",
            field=models.BooleanField(
                db_default=False, default=False, editable=False, verbose_name="sensitive"
            ),
        ),
        migrations.AddField(
            model_name="email",
            name="content_cleared_at",
            field=models.DateTimeField(
                blank=True, editable=False, null=True, verbose_name="content cleared"
            ),
        ),
        migrations.AlterModelOptions(
            name="email",
            options={
                "permissions": [("view_email_content", "Can view the content of emails")],
                "verbose_name": "email",
                "verbose_name_plural": "emails",
            },
        ),
        migrations.AddIndex(
            model_name="email",
            index=models.Index(
                condition=models.Q(("content_cleared_at__isnull", True)),
                fields=["created_at"],
                name="outbox_email_content_kept",
            ),
        ),
        migrations.AddIndex(
            model_name="email",
            index=models.Index(
                condition=models.Q(("content_cleared_at__isnull", True), ("sensitive", True)),
                fields=["id"],
                name="outbox_email_sensitive",
            ),
        ),
    ]
