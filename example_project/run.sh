#!/usr/bin/env bash
# The example command: the example project end to end on SQLite. Enqueue in a
# transaction, look at the rows and at Redis, deliver with a burst worker into
# files (example_project/sent_mail/), look again.
#
#   example_project/run.sh
#
# Makes .venv if needed, starts a private redis-server on 127.0.0.1 and a free
# port (installed with apt-get when missing), and stops it by pid at exit.
set -euo pipefail
source "$(dirname "$0")/../tests/lib.sh"
cd "$ROOT"
trap stop_started EXIT

PY311="$(find_python 3.11)" || { echo "python3.11 not found" >&2; exit 1; }
ensure_venv .venv "$PY311" dev "django>=5.2,<5.3"
start_redis
export REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
work="$(mktemp -d)"
CLEANUP_DIRS+=("$work")
export DJANGO_SETTINGS_MODULE=example_project.settings
export EXAMPLE_DB_PATH="$work/example.sqlite3"
export EXAMPLE_MAIL_DIR="$ROOT/example_project/sent_mail"
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
