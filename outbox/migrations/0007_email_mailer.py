# Email.mailer: the delivery backend of each email (outbox.mail.mailers).
#
# No rewrite of outbox_email: on PostgreSQL a column with a constant default is
# added to the catalog only. The default stays in the database (db_default), so
# an INSERT that does not name the column still writes a blank mailer.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("outbox", "0006_message_id_constraint"),
    ]

    operations = [
        migrations.AddField(
            model_name="email",
            name="mailer",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                help_text="The mailer the worker delivers through; blank for its default.",
                max_length=100,
                verbose_name="mailer",
            ),
        ),
    ]
