"""Suppressed addresses with a non-ASCII domain are stored IDNA-encoded.

Before, the list stored what it was given, lower-cased: an address added in
its Unicode form (``user@bücher.de``, by a person or the API) did not match
the IDNA form a server's refusal names, and the other way round. Every row is
now in one form (``outbox.validation.suppression_key``); a row whose encoded
form is already listed is a duplicate and is deleted (the listed row stays).
"""

from django.db import migrations


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


def encode_domains(apps, schema_editor):
    Suppression = apps.get_model("outbox", "Suppression")
    rows = Suppression.objects.using(schema_editor.connection.alias)
    # Only rows whose address is not ASCII can change; the check is done here
    # because no lookup tells ASCII from non-ASCII on every database.
    changed = [
        (pk, address, _key(address))
        for pk, address in rows.order_by("pk").values_list("pk", "address").iterator()
        if not address.isascii()
    ]
    for pk, address, key in changed:
        if key == address:
            continue
        if rows.filter(address=key).exists():
            rows.filter(pk=pk).delete()
        else:
            rows.filter(pk=pk).update(address=key)


class Migration(migrations.Migration):
    dependencies = [
        ("outbox", "0009_attempt_outcome_labels"),
    ]

    operations = [
        migrations.RunPython(encode_domains, migrations.RunPython.noop, elidable=True),
    ]
