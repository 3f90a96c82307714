"""Column widths that several tables share."""

# Worker ids on rows and in the attempt log. The ``outbox_worker`` command
# accepts ids of up to 200 characters; the worker may append an incarnation
# suffix (``#`` and 12 hex digits), so the columns leave room for it.
WORKER_ID_MAX_LENGTH = 255

# A mailer alias (Email.mailer): MAILERS aliases and OUTBOX["BACKENDS"] keys are short names.
MAILER_MAX_LENGTH = 100

# Where a message was handed over: a DNS name (at most 253 characters) and
# "ip:port" or "[ipv6]:port" (at most 47).
SERVER_HOST_MAX_LENGTH = 255
SERVER_ADDRESS_MAX_LENGTH = 64
