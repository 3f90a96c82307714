"""What a message from the drop-in backend needs to be built exactly as Django would.

``Email.structure`` and ``Attachment.mime_part`` (see outbox/mail/structure.py),
and on PostgreSQL the worker's step function in the version that returns the
structure (``STEP_FUNCTION_V2`` in outbox/statements/functions.py): a
function's result columns cannot change in place, so V1 is dropped first.
"""

from django.db import migrations, models

from outbox.statements.functions import (
    DROP_STEP,
    STEP_FUNCTION_V1,
    STEP_FUNCTION_V2,
    run_on_postgresql,
)


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
        migrations.RunPython(
            run_on_postgresql(f"{DROP_STEP};\n{STEP_FUNCTION_V2}"),
            run_on_postgresql(f"{DROP_STEP};\n{STEP_FUNCTION_V1}"),
        ),
    ]
