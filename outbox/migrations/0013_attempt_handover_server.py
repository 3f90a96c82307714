# Where each attempt handed its message over (issue 33, item 1): the server's
# greeting host name and the peer address, on the attempt log and on the row
# (written before SMTP's final dot, for the reconcilers: outbox/reconcilers/).
#
# No rewrite of the tables: on PostgreSQL a column with a constant default is
# added to the catalog only, and the default stays in the database
# (db_default), so the raw INSERTs that do not name the columns write blanks.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("outbox", "0012_batched_steps_function"),
    ]

    operations = [
        migrations.AddField(
            model_name="attempt",
            name="server_address",
            field=models.CharField(
                blank=True, db_default="", default="", max_length=64, verbose_name="server address"
            ),
        ),
        migrations.AddField(
            model_name="attempt",
            name="server_host",
            field=models.CharField(
                blank=True, db_default="", default="", max_length=255, verbose_name="server"
            ),
        ),
        migrations.AddField(
            model_name="delivery",
            name="server_address",
            field=models.CharField(
                blank=True, db_default="", default="", max_length=64, verbose_name="server address"
            ),
        ),
        migrations.AddField(
            model_name="delivery",
            name="server_host",
            field=models.CharField(
                blank=True, db_default="", default="", max_length=255, verbose_name="server"
            ),
        ),
    ]
