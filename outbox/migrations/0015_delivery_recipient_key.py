"""Delivery.recipient_key: each recipient's address in one form, indexed.

The form is ``outbox.validation.bare_address``: the bare address (no display
name), lower-cased, a non-ASCII domain IDNA-encoded; the form the suppression
list is matched on. Idempotency keys now match on it, so a retry that writes
"Bob <bob@example.com>" or "BOB@Example.com" for "bob@example.com" finds the
first call's delivery, and the admin's search by address is an index lookup.

The migration is not atomic, so that a large table is filled in batches of
``BATCH`` rows, each its own transaction, not in one transaction that holds
every row's lock until the end:

1. the column is added with a database default of '': rows that a previous
   release inserts during a rolling upgrade get it, and keep it (the admin
   does not find them by address; their idempotency keys match as before,
   by recipient as written, in that release);
2. every existing row is filled, in primary-key order;
3. deliveries that the old matching let through twice under one idempotency
   key (the same address written two ways) keep their key with " (duplicate
   of <id>)" added, the first delivery keeping it as it was: nothing is
   deleted, and the operator still sees which call made them;
4. the unique constraint moves from (key, recipient) to (key, recipient_key),
   the new one added before the old one is dropped, so the key is never
   without one; rows of a previous release ('') stay out of it;
5. the index of the admin's search. (It also replaced, on PostgreSQL, the
   enqueue functions by versions that write the column; the functions are
   now created by migration 0017 alone.)

On a large PostgreSQL table, step 5's index is built while writes to the table
wait (about a minute at 5 million rows); run it at a quiet time.
"""

from email.utils import parseaddr

from django.db import migrations, models, transaction
from django.db.models import Count, Min, Q

BATCH = 5000


def _key(address):
    # A frozen copy of outbox.validation.suppression_key as this migration shipped.
    address = address.strip().lower()
    if address.isascii():
        return address
    local, at, domain = address.rpartition("@")
    if not at or domain.isascii():
        return address
    try:
        return f"{local}@{domain.encode('idna').decode('ascii').lower()}"
    except UnicodeError:
        return address


def _bare(recipient):
    # A frozen copy of outbox.validation.bare_address as this migration shipped.
    if "<" not in recipient:
        return _key(recipient)
    return _key(parseaddr(recipient)[1])


def fill(apps, schema_editor):
    """Write recipient_key of every row that has none, ``BATCH`` rows per transaction."""
    Delivery = apps.get_model("outbox", "Delivery")
    connection = schema_editor.connection
    rows = Delivery.objects.using(connection.alias)
    table = connection.ops.quote_name(Delivery._meta.db_table)
    last = 0
    while True:
        batch = list(
            rows.filter(pk__gt=last, recipient_key="")
            .order_by("pk")
            .values_list("pk", "recipient")[:BATCH]
        )
        if not batch:
            return
        last = batch[-1][0]
        ids = [pk for pk, _ in batch]
        keys = [_bare(recipient) for _, recipient in batch]
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(
                    f"UPDATE {table} AS d SET recipient_key = v.key"
                    " FROM unnest(%s::bigint[], %s::text[]) AS v(id, key) WHERE d.id = v.id",
                    [ids, keys],
                )
            else:
                cursor.executemany(
                    f"UPDATE {table} SET recipient_key = %s WHERE id = %s",
                    list(zip(keys, ids, strict=True)),
                )


def mark_duplicates(apps, schema_editor):
    """Keep the first delivery of each (key, address) as the key's; mark the others."""
    Delivery = apps.get_model("outbox", "Delivery")
    rows = Delivery.objects.using(schema_editor.connection.alias)
    groups = (
        rows.filter(idempotency_key__isnull=False)
        .exclude(recipient_key="")
        .values("idempotency_key", "recipient_key")
        .annotate(n=Count("pk"), first=Min("pk"))
        .filter(n__gt=1)
    )
    for group in list(groups):
        later = rows.filter(
            idempotency_key=group["idempotency_key"], recipient_key=group["recipient_key"]
        ).exclude(pk=group["first"])
        for pk, key in later.values_list("pk", "idempotency_key"):
            suffix = f" (duplicate of {group['first']})"
            rows.filter(pk=pk).update(idempotency_key=key[: 255 - len(suffix)] + suffix)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("outbox", "0014_scale_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="delivery",
            name="recipient_key",
            field=models.CharField(
                db_default="",
                default="",
                editable=False,
                max_length=320,
                verbose_name="recipient address",
            ),
        ),
        migrations.RunPython(fill, migrations.RunPython.noop),
        migrations.RunPython(mark_duplicates, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="delivery",
            constraint=models.UniqueConstraint(
                condition=Q(idempotency_key__isnull=False) & ~Q(recipient_key=""),
                fields=("idempotency_key", "recipient_key"),
                name="outbox_delivery_idempotency_key",
            ),
        ),
        migrations.RemoveConstraint(
            model_name="delivery",
            name="outbox_delivery_idempotency",
        ),
        migrations.AddIndex(
            model_name="delivery",
            index=models.Index(
                fields=["recipient_key"],
                name="outbox_deliv_recipient_key",
                opclasses=["varchar_pattern_ops"],
            ),
        ),
        # The enqueue functions that write recipient_key: now 0017_postgresql_functions.
    ]
