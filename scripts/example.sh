#!/usr/bin/env bash
# The example, end to end on SQLite: enqueue in a transaction, look at the rows
# and at Redis, deliver with a burst worker into files, look again.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
trap stop_started EXIT

ensure_venv .venv "$(find_python 3.11)" dev "django>=5.2,<5.3"
start_redis
export REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
work="$(mktemp -d)"
CLEANUP_DIRS+=("$work")
export DJANGO_SETTINGS_MODULE=example_project.settings
export EXAMPLE_DB_PATH="$work/example.sqlite3"
export EXAMPLE_MAIL_DIR="$ROOT/sent_mail"
rm -rf "$EXAMPLE_MAIL_DIR"
PY=.venv/bin/python

log "manage.py migrate"
$PY manage.py migrate -v 0
log "manage.py check"
$PY manage.py check
log "manage.py shop_demo enqueue"
$PY manage.py shop_demo enqueue
log "manage.py outbox_worker --burst"
$PY manage.py outbox_worker --burst
log "manage.py outbox_sweep"
$PY manage.py outbox_sweep
log "manage.py shop_demo show"
$PY manage.py shop_demo show
log "done: the delivered messages are in $EXAMPLE_MAIL_DIR/"
