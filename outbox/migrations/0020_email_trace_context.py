"""Traces: ``Email.trace_context``, the trace context of the code that enqueued (``outbox.tracing``).

Nullable, with no default in the database: adding it rewrites nothing, and a
previous release's inserts during a rolling upgrade leave it NULL (untraced).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("outbox", "0019_email_content_retention"),
    ]

    operations = [
        migrations.AddField(
            model_name="email",
            name="trace_context",
            field=models.JSONField(
                blank=True, default=None, editable=False, null=True, verbose_name="trace context"
            ),
        ),
    ]
