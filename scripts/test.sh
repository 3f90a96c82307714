#!/usr/bin/env bash
# The whole test suite, from a fresh machine: lint and types, then pytest on
# Django 5.2 (python3.11) and Django 6.1 (python3.12), each on SQLite and on a
# throwaway PostgreSQL, against a real redis-server on loopback.
#
#   scripts/test.sh                      everything (what CI runs)
#   OUTBOX_TEST_MATRIX="5.2:sqlite" scripts/test.sh -k worker   one cell, pytest args
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
trap stop_started EXIT

MATRIX="${OUTBOX_TEST_MATRIX:-5.2:sqlite 5.2:postgres 6.1:sqlite 6.1:postgres}"
PY311="$(find_python 3.11)" || { echo "python3.11 not found" >&2; exit 1; }

ensure_venv .venv "$PY311" dev "django>=5.2,<5.3"
if [[ "$MATRIX" == *6.1* ]]; then
  PY312="$(find_python 3.12)" || { echo "python3.12 not found" >&2; exit 1; }
  ensure_venv .venv-django61 "$PY312" test "django>=6.1,<6.2"
fi
command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 \
  || apt_install chromium chromium-driver \
  || log "no browser could be installed; the browser test will be skipped"

if [ -z "${OUTBOX_TEST_SKIP_LINT:-}" ]; then
  log "ruff and mypy"
  .venv/bin/ruff check outbox tests example_project
  .venv/bin/ruff format --check outbox tests example_project
  .venv/bin/mypy outbox
fi

start_redis
export OUTBOX_TEST_REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
if [[ "$MATRIX" == *postgres* ]]; then
  start_postgres
  export OUTBOX_TEST_PG_HOST=127.0.0.1 OUTBOX_TEST_PG_PORT="$PG_PORT" OUTBOX_TEST_PG_USER="$PG_USER"
fi
export OUTBOX_TEST_SQLITE_DIR="$(mktemp -d)"
CLEANUP_DIRS+=("$OUTBOX_TEST_SQLITE_DIR")

rm -f .coverage
failed=()
for cell in $MATRIX; do
  django="${cell%%:*}" db="${cell##*:}"
  venv=.venv
  [ "$django" = 6.1 ] && venv=.venv-django61
  log "pytest: Django $django on $db ($($venv/bin/python --version))"
  # Django 6.1 on PostgreSQL runs with psycopg's prepared statements on, so the
  # worker's prepared hot path is tested as well as the default one.
  prepare=""
  [ "$cell" = 6.1:postgres ] && prepare=0
  if ! OUTBOX_TEST_DB="$db" OUTBOX_TEST_PG_PREPARE_THRESHOLD="$prepare" \
      "$venv/bin/python" -m pytest -p no:cacheprovider \
      --cov=outbox --cov-append --cov-report= "$@"; then
    failed+=("$cell")
  fi
done

log "coverage (all cells)"
.venv/bin/python -m coverage report || true

if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED cells: ${failed[*]}" >&2
  exit 1
fi
log "all cells passed: $MATRIX"
