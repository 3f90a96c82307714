#!/usr/bin/env bash
# The example command: the example project end to end on SQLite. Enqueue in a
# transaction, look at the rows and at Redis, deliver with a burst worker into
# files (example_project/sent_mail/), look again.
#
#   example_project/run.sh
#
# Makes .venv if needed (Django 5.2 on Python 3.11, or on the newest Python from
# 3.11 on that the machine has, installed with apt-get if it has none), says which
# Python it uses, starts a private redis-server on 127.0.0.1 and a free port
# (installed with apt-get when missing), and stops it by pid at exit.
set -euo pipefail
source "$(dirname "$0")/../tests/lib.sh"
cd "$ROOT"
trap stop_started EXIT

# Any Python from 3.11 on: 3.11 where the machine has it, else the newest it has,
# else one installed with apt-get (tests/lib.sh, ensure_dev_venv).
ensure_dev_venv
log "Python $(python_version .venv/bin/python), Django $(.venv/bin/python -m django --version) (.venv)"
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
