"""The outbox's migrations 0001 to 0018 as one, for new databases: every table as 0018 left it.

Django applies this migration only to a database that has none of 0001 to
0018 recorded, so it always starts from empty tables; a database migrated
through them (every row in ``django_migrations``) has it recorded as applied
by the next ``migrate``, which runs nothing (``tests/project/test_migrations.py``
proves both). 0001 to 0018 stay beside it for one release, so that a
database part-way through them goes on through them; the release after
deletes them, and this becomes a plain initial migration.

What it leaves out, and why that is faithful:

- the data steps of 0002, 0010 and 0015 (relabel old attempt outcomes,
  IDNA-encode suppressed addresses, fill ``recipient_key`` and mark old
  duplicates) and 0018's rewrite of SQLite's local times in UTC: each
  rewrites rows, and here there are none;
- 0005, 0008 and 0012, which do nothing (their functions moved to 0017), and
  the indexes, constraints and columns later migrations removed or replaced;
- on PostgreSQL, the previous release's enqueue functions, which 0017 keeps
  for that release's web processes while they restart: a new database has
  no such processes, and 0017 leaves none on one either.

What it keeps: each column in the order and with the type, default and
database default the chain gives it, and every index and constraint by name;
on PostgreSQL, the four PL/pgSQL functions, created by the same text as in
0017 (copied, as a migration runs as it shipped: a test compares the two).
"""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models

import outbox.models.instants

# The four functions' signatures, for the reverse. The DDL from here to create()
# is 0017's, word for word.
DROP_STEP = (
    "DROP FUNCTION IF EXISTS outbox_step("
    "bigint, uuid, bigint, varchar, uuid, timestamptz, bigint, text)"
)
DROP_STEPS = (
    "DROP FUNCTION IF EXISTS outbox_steps("
    "bigint[], uuid[], bigint[], varchar[], uuid[], timestamptz[], bigint[], text)"
)
DROP_ENQUEUE = (
    "DROP FUNCTION IF EXISTS outbox_enqueue(text, text, text, varchar, jsonb, jsonb, "
    "timestamptz, varchar, integer, timestamptz, timestamptz, text[], text[], text[], varchar, "
    "jsonb)"
)
DROP_ENQUEUE_ONE = (
    "DROP FUNCTION IF EXISTS outbox_enqueue_one(text, text, text, varchar, jsonb, jsonb, "
    "timestamptz, varchar, integer, timestamptz, timestamptz, text, text, text, varchar, jsonb)"
)

# The worker's step: the success of the message in hand (step 4) and the mark
# of the next one (step 2) with its content. Both functions are as
# outbox.transitions.hotpath.step_function rendered them from outbox.transitions.table when
# 0017 was written.
OUTBOX_STEP = """
CREATE OR REPLACE FUNCTION outbox_step(
    p_settle_id bigint, p_settle_token uuid,
    p_claim_id bigint, p_worker varchar, p_token uuid,
    p_now timestamptz, p_known bigint, p_expired_error text,
    OUT settled integer,
    OUT email_id bigint,
    OUT recipient varchar,
    OUT priority varchar,
    OUT attempts integer,
    OUT max_attempts integer,
    OUT message_id varchar,
    OUT subject text,
    OUT body text,
    OUT html_message text,
    OUT from_email varchar,
    OUT reply_to jsonb,
    OUT headers jsonb,
    OUT mailer varchar,
    OUT has_attachments boolean,
    OUT claimed_status varchar,
    OUT structure jsonb
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    settled := 0;
    IF p_settle_id IS NOT NULL THEN
        UPDATE outbox_delivery SET
            status = 'sent',
            sent_at = p_now,
            updated_at = p_now,
            last_error = ''
        WHERE id = p_settle_id AND (status IN ('processing')) IS TRUE AND claim_token = p_settle_token;
        GET DIAGNOSTICS settled = ROW_COUNT;
    END IF;
    IF p_claim_id IS NULL THEN
        RETURN;
    END IF;
    UPDATE outbox_delivery SET
        status = CASE WHEN expires_at <= now() THEN 'cancelled' ELSE 'processing' END,
        last_error = CASE WHEN expires_at <= now() THEN p_expired_error ELSE last_error END,
        worker_id = p_worker,
        claim_token = p_token,
        processing_started_at = p_now,
        updated_at = p_now,
        attempts = CASE WHEN expires_at <= now() THEN attempts ELSE attempts + 1 END
    WHERE id = p_claim_id AND (status IN ('queued')) IS TRUE AND not_before <= now()
    RETURNING email_id, recipient, priority, attempts, max_attempts, message_id, status
    INTO email_id, recipient, priority, attempts, max_attempts, message_id, claimed_status;
    IF NOT FOUND OR claimed_status <> 'processing' OR email_id = p_known THEN
        RETURN;
    END IF;
    SELECT e.subject, e.body, e.html_message, e.from_email, e.reply_to, e.headers, e.mailer,
        EXISTS (SELECT 1 FROM outbox_attachment a WHERE a.email_id = e.id), e.structure
    INTO subject, body, html_message, from_email, reply_to, headers, mailer, has_attachments,
        structure
    FROM outbox_email e WHERE e.id = email_id;
END
$$
"""

# Several threads' steps (the worker's group commit) as two set-based UPDATEs;
# why each step's row is what it would be alone:
# outbox.transitions.hotpath.steps_function.
OUTBOX_STEPS = """
CREATE OR REPLACE FUNCTION outbox_steps(
    p_settle_ids bigint[], p_settle_tokens uuid[],
    p_claim_ids bigint[], p_workers varchar[], p_tokens uuid[],
    p_nows timestamptz[], p_knowns bigint[], p_expired_error text
) RETURNS TABLE (
    settled integer,
    email_id bigint,
    recipient varchar,
    priority varchar,
    attempts integer,
    max_attempts integer,
    message_id varchar,
    subject text,
    body text,
    html_message text,
    from_email varchar,
    reply_to jsonb,
    headers jsonb,
    mailer varchar,
    has_attachments boolean,
    claimed_status varchar,
    structure jsonb
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH x AS (
        SELECT * FROM unnest(p_settle_ids, p_settle_tokens, p_claim_ids, p_workers, p_tokens,
            p_nows, p_knowns)
            WITH ORDINALITY AS r(settle_id, settle_token, claim_id, worker, token, now, known, n)
    ), done AS (
        UPDATE outbox_delivery SET
            status = 'sent',
            sent_at = x.now,
            updated_at = x.now,
            last_error = ''
        FROM x
        WHERE id = x.settle_id AND (status IN ('processing')) IS TRUE AND claim_token = x.settle_token
        RETURNING x.n
    ), claimed AS (
        UPDATE outbox_delivery SET
            status = CASE WHEN expires_at <= now() THEN 'cancelled' ELSE 'processing' END,
            last_error = CASE WHEN expires_at <= now() THEN p_expired_error ELSE last_error END,
            worker_id = x.worker,
            claim_token = x.token,
            processing_started_at = x.now,
            updated_at = x.now,
            attempts = CASE WHEN expires_at <= now() THEN attempts ELSE attempts + 1 END
        FROM x
        WHERE id = x.claim_id AND (status IN ('queued')) IS TRUE AND not_before <= now()
        RETURNING id, claim_token, email_id, recipient, priority, attempts, max_attempts, message_id, status
    )
    SELECT (SELECT count(*) FROM done WHERE done.n = x.n)::integer,
        c.email_id, c.recipient, c.priority, c.attempts, c.max_attempts, c.message_id,
        e.subject, e.body, e.html_message, e.from_email, e.reply_to, e.headers, e.mailer,
        EXISTS (SELECT 1 FROM outbox_attachment a WHERE a.email_id = e.id),
        c.status, e.structure
    FROM x
    LEFT JOIN claimed c ON c.id = x.claim_id AND c.claim_token = x.token
    LEFT JOIN outbox_email e ON e.id = c.email_id AND c.status = 'processing'
        AND e.id <> x.known
    ORDER BY x.n;
END
$$
"""

# enqueue_email's insert: the email (its structure too) and one delivery per
# recipient, each looked up in the suppression list by its normalised address
# (p_bare, written as recipient_key); a suppressed one is written cancelled,
# with the text outbox.suppression.suppressed gives elsewhere.
OUTBOX_ENQUEUE = """
CREATE OR REPLACE FUNCTION outbox_enqueue(
    p_subject text, p_body text, p_html text, p_from varchar, p_reply_to jsonb,
    p_headers jsonb, p_now timestamptz, p_priority varchar, p_max_attempts integer,
    p_not_before timestamptz, p_expires_at timestamptz,
    p_recipients text[], p_message_ids text[], p_bare text[], p_mailer varchar,
    p_structure jsonb
) RETURNS TABLE (id bigint, email_id bigint, message_id varchar, last_error text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    new_email bigint;
BEGIN
    INSERT INTO outbox_email AS e (subject, body, html_message, from_email, reply_to, headers,
        mailer, structure, created_at)
    VALUES (p_subject, p_body, p_html, p_from, p_reply_to, p_headers, p_mailer, p_structure,
        p_now)
    RETURNING e.id INTO new_email;
    RETURN QUERY
    INSERT INTO outbox_delivery AS d (email_id, recipient, recipient_key, status, priority,
        attempts, max_attempts, not_before, expires_at, worker_id, message_id, last_error,
        created_at, updated_at)
    SELECT new_email, r.recipient, r.bare,
        CASE WHEN s.address IS NULL THEN 'queued' ELSE 'cancelled' END,
        p_priority, 0, p_max_attempts, p_not_before, p_expires_at, '', r.message_id,
        CASE WHEN s.address IS NULL THEN '' ELSE left('suppressed: ' || s.address
            || ' is on the suppression list (' || s.source || ')'
            || CASE WHEN s.reason = '' THEN '' ELSE ': ' || s.reason END, 2000) END,
        p_now, p_now
    FROM unnest(p_recipients, p_message_ids, p_bare) AS r(recipient, message_id, bare)
    LEFT JOIN outbox_suppression s ON s.address = r.bare
    RETURNING d.id, d.email_id, d.message_id, d.last_error;
END
$$
"""

# OUTBOX_ENQUEUE for one recipient, row for row (the suppression text too).
# Returns {delivery id, email id, why it is suppressed or ""}: one array, so
# that the call is a plain scalar call (see
# outbox.statements.postgresql.ENQUEUE_ONE_CALL).
OUTBOX_ENQUEUE_ONE = """
CREATE OR REPLACE FUNCTION outbox_enqueue_one(
    p_subject text, p_body text, p_html text, p_from varchar, p_reply_to jsonb,
    p_headers jsonb, p_now timestamptz, p_priority varchar, p_max_attempts integer,
    p_not_before timestamptz, p_expires_at timestamptz,
    p_recipient text, p_message_id text, p_bare text, p_mailer varchar,
    p_structure jsonb
) RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    s record;
    delivery_id bigint;
    new_email_id bigint;
    why text;
BEGIN
    INSERT INTO outbox_email AS e (subject, body, html_message, from_email, reply_to, headers,
        mailer, structure, created_at)
    VALUES (p_subject, p_body, p_html, p_from, p_reply_to, p_headers, p_mailer, p_structure,
        p_now)
    RETURNING e.id INTO new_email_id;
    why := '';
    SELECT x.address, x.source, x.reason INTO s
    FROM outbox_suppression x WHERE x.address = p_bare;
    IF FOUND THEN
        why := left('suppressed: ' || s.address
            || ' is on the suppression list (' || s.source || ')'
            || CASE WHEN s.reason = '' THEN '' ELSE ': ' || s.reason END, 2000);
    END IF;
    INSERT INTO outbox_delivery AS d (email_id, recipient, recipient_key, status, priority,
        attempts, max_attempts, not_before, expires_at, worker_id, message_id, last_error,
        created_at, updated_at)
    VALUES (new_email_id, p_recipient, p_bare,
        CASE WHEN why = '' THEN 'queued' ELSE 'cancelled' END,
        p_priority, 0, p_max_attempts, p_not_before, p_expires_at, '', p_message_id, why,
        p_now, p_now)
    RETURNING d.id INTO delivery_id;
    RETURN ARRAY[delivery_id::text, new_email_id::text, why];
END
$$
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for sql in (OUTBOX_STEP, OUTBOX_STEPS, OUTBOX_ENQUEUE, OUTBOX_ENQUEUE_ONE):
        schema_editor.execute(sql)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for sql in (DROP_STEP, DROP_STEPS, DROP_ENQUEUE, DROP_ENQUEUE_ONE):
        schema_editor.execute(sql)


class Migration(migrations.Migration):
    replaces = [
        ("outbox", "0001_initial"),
        ("outbox", "0002_attempt_outcomes_worker_id_length"),
        ("outbox", "0003_hot_path_indexes"),
        ("outbox", "0004_content"),
        ("outbox", "0005_postgresql_functions"),
        ("outbox", "0006_message_id_constraint"),
        ("outbox", "0007_email_mailer"),
        ("outbox", "0008_enqueue_one_function"),
        ("outbox", "0009_attempt_outcome_labels"),
        ("outbox", "0010_suppression_idna_addresses"),
        ("outbox", "0011_message_structure"),
        ("outbox", "0012_batched_steps_function"),
        ("outbox", "0013_attempt_handover_server"),
        ("outbox", "0014_scale_indexes"),
        ("outbox", "0015_delivery_recipient_key"),
        ("outbox", "0016_attempt_esp_message_id"),
        ("outbox", "0017_postgresql_functions"),
        ("outbox", "0018_delivery_instants"),
    ]

    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Email",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("subject", models.TextField(verbose_name="subject")),
                ("body", models.TextField(blank=True, verbose_name="body")),
                (
                    "html_message",
                    models.TextField(blank=True, default="", verbose_name="HTML alternative"),
                ),
                ("from_email", models.CharField(max_length=320, verbose_name="from")),
                ("reply_to", models.JSONField(blank=True, default=list, verbose_name="reply-to")),
                (
                    "headers",
                    models.JSONField(blank=True, default=dict, verbose_name="extra headers"),
                ),
                (
                    "created_at",
                    models.DateTimeField(
                        default=django.utils.timezone.now, editable=False, verbose_name="created"
                    ),
                ),
                (
                    "mailer",
                    models.CharField(
                        blank=True,
                        db_default="",
                        default="",
                        help_text="The mailer the worker delivers through; blank for its default.",
                        max_length=100,
                        verbose_name="mailer",
                    ),
                ),
                (
                    "structure",
                    models.JSONField(
                        blank=True,
                        default=None,
                        editable=False,
                        null=True,
                        verbose_name="message structure",
                    ),
                ),
            ],
            options={
                "verbose_name": "email",
                "verbose_name_plural": "emails",
            },
        ),
        migrations.CreateModel(
            name="Delivery",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("recipient", models.CharField(max_length=320, verbose_name="recipient")),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("queued", "queued"),
                            ("processing", "processing"),
                            ("sent", "sent"),
                            ("failed", "failed"),
                            ("abandoned", "abandoned"),
                            ("cancelled", "cancelled"),
                        ],
                        default="queued",
                        max_length=16,
                        verbose_name="status",
                    ),
                ),
                (
                    "priority",
                    models.CharField(
                        choices=[("high", "high"), ("normal", "normal"), ("low", "low")],
                        default="normal",
                        max_length=8,
                        verbose_name="priority",
                    ),
                ),
                ("attempts", models.PositiveIntegerField(default=0, verbose_name="attempts")),
                (
                    "max_attempts",
                    models.PositiveIntegerField(default=5, verbose_name="max attempts"),
                ),
                (
                    "not_before",
                    outbox.models.instants.InstantField(
                        default=django.utils.timezone.now, verbose_name="not before"
                    ),
                ),
                (
                    "worker_id",
                    models.CharField(blank=True, default="", max_length=255, verbose_name="worker"),
                ),
                (
                    "claim_token",
                    models.UUIDField(blank=True, null=True, verbose_name="claim token"),
                ),
                (
                    "processing_started_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="processing started"),
                ),
                ("sent_at", models.DateTimeField(blank=True, null=True, verbose_name="sent")),
                ("message_id", models.CharField(max_length=255, verbose_name="Message-ID")),
                ("last_error", models.TextField(blank=True, default="", verbose_name="last error")),
                (
                    "idempotency_key",
                    models.CharField(
                        blank=True, max_length=255, null=True, verbose_name="idempotency key"
                    ),
                ),
                (
                    "created_at",
                    models.DateTimeField(
                        default=django.utils.timezone.now, editable=False, verbose_name="created"
                    ),
                ),
                (
                    "updated_at",
                    models.DateTimeField(default=django.utils.timezone.now, verbose_name="updated"),
                ),
                (
                    "email",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="deliveries",
                        to="outbox.email",
                        verbose_name="email",
                    ),
                ),
                (
                    "expires_at",
                    outbox.models.instants.InstantField(
                        blank=True, null=True, verbose_name="expires"
                    ),
                ),
                (
                    "server_address",
                    models.CharField(
                        blank=True,
                        db_default="",
                        default="",
                        max_length=64,
                        verbose_name="server address",
                    ),
                ),
                (
                    "server_host",
                    models.CharField(
                        blank=True, db_default="", default="", max_length=255, verbose_name="server"
                    ),
                ),
                (
                    "recipient_key",
                    models.CharField(
                        db_default="",
                        default="",
                        editable=False,
                        max_length=320,
                        verbose_name="recipient address",
                    ),
                ),
            ],
            options={
                "verbose_name": "delivery",
                "verbose_name_plural": "deliveries",
                "indexes": [
                    models.Index(
                        condition=models.Q(("status", "queued")),
                        fields=["not_before", "id"],
                        name="outbox_deliv_queued_due",
                    ),
                    models.Index(
                        condition=models.Q(("status", "queued")),
                        fields=["updated_at"],
                        name="outbox_deliv_queued_upd",
                    ),
                    models.Index(
                        condition=models.Q(("status", "processing")),
                        fields=["processing_started_at"],
                        name="outbox_deliv_processing",
                    ),
                    models.Index(
                        condition=models.Q(("status", "sent")),
                        fields=["sent_at"],
                        name="outbox_deliv_sent_at",
                    ),
                    models.Index(
                        condition=models.Q(("status__in", ["failed", "abandoned", "cancelled"])),
                        fields=["status", "updated_at"],
                        name="outbox_deliv_attention",
                    ),
                    models.Index(
                        condition=models.Q(("expires_at__isnull", False), ("status", "queued")),
                        fields=["expires_at"],
                        name="outbox_deliv_expiring",
                    ),
                    models.Index(
                        condition=models.Q(("status__in", ["failed", "abandoned", "cancelled"])),
                        fields=["status", "id", "priority"],
                        name="outbox_deliv_attention_id",
                    ),
                    models.Index(
                        fields=["recipient_key"],
                        name="outbox_deliv_recipient_key",
                        opclasses=["varchar_pattern_ops"],
                    ),
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("message_id",), name="outbox_delivery_message_id_uniq"
                    ),
                    models.UniqueConstraint(
                        condition=models.Q(
                            ("idempotency_key__isnull", False),
                            models.Q(("recipient_key", ""), _negated=True),
                        ),
                        fields=("idempotency_key", "recipient_key"),
                        name="outbox_delivery_idempotency_key",
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="Attachment",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(blank=True, max_length=255, verbose_name="file name")),
                ("content", models.BinaryField(verbose_name="content")),
                (
                    "mimetype",
                    models.CharField(blank=True, max_length=255, verbose_name="MIME type"),
                ),
                (
                    "email",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="attachments",
                        to="outbox.email",
                        verbose_name="email",
                    ),
                ),
                (
                    "mime_part",
                    models.BooleanField(db_default=False, default=False, verbose_name="MIME part"),
                ),
            ],
            options={
                "verbose_name": "attachment",
                "verbose_name_plural": "attachments",
            },
        ),
        migrations.CreateModel(
            name="Attempt",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("number", models.PositiveIntegerField(verbose_name="attempt number")),
                (
                    "worker_id",
                    models.CharField(blank=True, default="", max_length=255, verbose_name="worker"),
                ),
                (
                    "claim_token",
                    models.UUIDField(blank=True, null=True, verbose_name="claim token"),
                ),
                (
                    "started_at",
                    models.DateTimeField(default=django.utils.timezone.now, verbose_name="started"),
                ),
                (
                    "finished_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="finished"),
                ),
                (
                    "outcome",
                    models.CharField(
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
                            ("reported", "reported by the ESP"),
                        ],
                        max_length=16,
                        verbose_name="outcome",
                    ),
                ),
                ("error", models.TextField(blank=True, default="", verbose_name="error")),
                (
                    "actor",
                    models.CharField(
                        blank=True,
                        default="",
                        help_text="worker, sweeper or user",
                        max_length=255,
                        verbose_name="by",
                    ),
                ),
                (
                    "delivery",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="attempt_log",
                        to="outbox.delivery",
                        verbose_name="delivery",
                    ),
                ),
                (
                    "server_address",
                    models.CharField(
                        blank=True,
                        db_default="",
                        default="",
                        max_length=64,
                        verbose_name="server address",
                    ),
                ),
                (
                    "server_host",
                    models.CharField(
                        blank=True, db_default="", default="", max_length=255, verbose_name="server"
                    ),
                ),
                (
                    "esp_message_id",
                    models.CharField(
                        blank=True,
                        db_default="",
                        default="",
                        max_length=255,
                        verbose_name="ESP message id",
                    ),
                ),
            ],
            options={
                "verbose_name": "attempt",
                "verbose_name_plural": "attempts",
                "ordering": ["delivery_id", "id"],
                "indexes": [
                    models.Index(fields=["delivery", "claim_token"], name="outbox_attempt_claim"),
                    models.Index(
                        condition=models.Q(("esp_message_id", ""), _negated=True),
                        fields=["esp_message_id"],
                        name="outbox_attempt_esp_id",
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="EmailTemplate",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=255, verbose_name="name")),
                (
                    "language",
                    models.CharField(
                        blank=True,
                        default="",
                        help_text="A language code such as de or pt-br; blank for the default.",
                        max_length=15,
                        verbose_name="language",
                    ),
                ),
                ("subject", models.CharField(max_length=998, verbose_name="subject")),
                ("text", models.TextField(blank=True, default="", verbose_name="text body")),
                ("html", models.TextField(blank=True, default="", verbose_name="HTML body")),
                (
                    "description",
                    models.TextField(blank=True, default="", verbose_name="description"),
                ),
                (
                    "sample_context",
                    models.JSONField(
                        blank=True,
                        default=dict,
                        help_text="A JSON object the admin's preview renders the template with.",
                        verbose_name="sample context",
                    ),
                ),
                ("updated_at", models.DateTimeField(auto_now=True, verbose_name="updated")),
            ],
            options={
                "verbose_name": "email template",
                "verbose_name_plural": "email templates",
                "ordering": ["name", "language"],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("name", "language"), name="outbox_template_lang"
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="Suppression",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("address", models.CharField(max_length=320, unique=True, verbose_name="address")),
                ("reason", models.TextField(blank=True, default="", verbose_name="reason")),
                (
                    "source",
                    models.CharField(
                        choices=[
                            ("refusal", "refused by the mail server"),
                            ("operator", "operator"),
                            ("api", "API"),
                        ],
                        default="operator",
                        max_length=16,
                        verbose_name="source",
                    ),
                ),
                (
                    "created_at",
                    models.DateTimeField(
                        default=django.utils.timezone.now, editable=False, verbose_name="created"
                    ),
                ),
            ],
            options={
                "verbose_name": "suppressed address",
                "verbose_name_plural": "suppressed addresses",
                "ordering": ["address"],
            },
        ),
        # Last: the functions read the tables' columns; undone first.
        migrations.RunPython(create, drop),
    ]
