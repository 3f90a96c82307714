"""``not_before`` and ``expires_at`` become instants: stored in UTC whatever ``USE_TZ`` says.

The columns do not change (``outbox.models.InstantField``): on PostgreSQL they
are ``timestamptz`` and already hold instants, and with ``USE_TZ = True``
every database already stores UTC. Only SQLite without ``USE_TZ`` held them
naive in ``TIME_ZONE``: those values are rewritten in UTC, each meaning what
it was read as before (a wall-clock time of the hour the clocks go back
twice: its first occurrence, as every read took it).
"""

from datetime import UTC

import django.utils.timezone
from django.conf import settings
from django.db import migrations
from django.utils import timezone

import outbox.models.instants

_BATCH = 1000


def _rewrite(apps, schema_editor, forward: bool) -> None:
    connection = schema_editor.connection
    if settings.USE_TZ or connection.features.supports_timezones:
        return
    Delivery = apps.get_model("outbox", "Delivery")
    table = connection.ops.quote_name(Delivery._meta.db_table)
    local = timezone.get_default_timezone()
    parse = connection.ops.convert_datetimefield_value
    last = 0
    while True:
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT id, not_before, expires_at FROM {table} WHERE id > %s ORDER BY id LIMIT %s",
                [last, _BATCH],
            )
            rows = cursor.fetchall()
            if not rows:
                return
            last = rows[-1][0]
            changes = []
            for pk, *times in rows:
                moved = []
                for raw in times:
                    if raw is None:
                        moved.append(None)
                        continue
                    moment = parse(raw, None, connection)
                    if forward:  # naive in TIME_ZONE -> naive UTC
                        moment = moment.replace(tzinfo=local).astimezone(UTC)
                    else:
                        moment = moment.replace(tzinfo=UTC).astimezone(local)
                    moved.append(str(moment.replace(tzinfo=None)))
                changes.append([*moved, pk])
            cursor.executemany(
                f"UPDATE {table} SET not_before = %s, expires_at = %s WHERE id = %s", changes
            )


def to_utc(apps, schema_editor):
    _rewrite(apps, schema_editor, forward=True)


def to_local(apps, schema_editor):
    _rewrite(apps, schema_editor, forward=False)


class Migration(migrations.Migration):
    dependencies = [
        ("outbox", "0017_postgresql_functions"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            # No schema change: the same column type, only what SQLite's text means.
            state_operations=[
                migrations.AlterField(
                    model_name="delivery",
                    name="expires_at",
                    field=outbox.models.instants.InstantField(
                        blank=True, null=True, verbose_name="expires"
                    ),
                ),
                migrations.AlterField(
                    model_name="delivery",
                    name="not_before",
                    field=outbox.models.instants.InstantField(
                        default=django.utils.timezone.now, verbose_name="not before"
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(to_utc, to_local)],
        ),
    ]
