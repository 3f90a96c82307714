#!/usr/bin/env bash
# The test command: the whole test suite, from a fresh machine. Lint and types,
# then pytest in four cells: Django 5.2 (python3.11) and Django 6.1 (python3.12),
# each on SQLite and on a throwaway PostgreSQL, against real redis-servers on
# loopback. Then one coverage report over every cell and every subprocess.
#
#   tests/run.sh                                               everything (what CI runs)
#   OUTBOX_TEST_MATRIX="5.2:sqlite" tests/run.sh -k worker     one cell, pytest args
#   OUTBOX_TEST_SKIP_LINT=1 tests/run.sh                       no ruff, mypy, import-linter
#   OUTBOX_TEST_JOBS=1 tests/run.sh                            cells one at a time
#
# Cells run OUTBOX_TEST_JOBS at a time (default 2). They cannot collide: each has
# its own redis-server, its own SQLite folder, its own PostgreSQL database names
# (one server, "test_outbox_<cell>"), its own pytest temporary folder and its own
# coverage data. A cell's output is buffered and printed whole when it ends,
# followed by one summary line per cell. The exit status is 1 if any cell failed.
#
# Installs what is missing: the virtual environments .venv and .venv-django61
# (rebuilt only when pyproject.toml changes), and with apt-get redis-server,
# PostgreSQL, Chromium (the admin's browser test), faketime, Postfix and PgBouncer. Every
# server listens on 127.0.0.1 on a free port and is stopped by pid when the script exits.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
trap stop_started EXIT

# The longest cell first (6.1:postgres runs the chaos run), so that the others fill the other slot.
MATRIX="${OUTBOX_TEST_MATRIX:-6.1:postgres 5.2:postgres 6.1:sqlite 5.2:sqlite}"
JOBS="${OUTBOX_TEST_JOBS:-2}"
START=$SECONDS

PY311="$(find_python 3.11)" || { echo "python3.11 not found" >&2; exit 1; }
ensure_venv .venv "$PY311" dev "django>=5.2,<5.3"
ensure_django_mail_tests .venv
if [[ "$MATRIX" == *6.1* ]]; then
  PY312="$(find_python 3.12)" || { echo "python3.12 not found" >&2; exit 1; }
  ensure_venv .venv-django61 "$PY312" test "django>=6.1,<6.2"
  ensure_django_mail_tests .venv-django61
fi
ensure_redis_server
ensure_faketime
ensure_postfix
ensure_chromium
if [[ "$MATRIX" == *postgres* ]]; then ensure_pgbouncer; fi  # tests/test_pgbouncer.py

if [ -z "${OUTBOX_TEST_SKIP_LINT:-}" ]; then
  log "ruff, mypy and the import contracts"
  .venv/bin/ruff check -q outbox tests example_project
  .venv/bin/ruff format -q --check outbox tests example_project
  .venv/bin/mypy outbox
  # The layers of outbox/ (pyproject.toml, [tool.importlinter]).
  .venv/bin/lint-imports --no-cache >/dev/null || .venv/bin/lint-imports --no-cache
fi

if [[ "$MATRIX" == *postgres* ]]; then
  start_postgres
  export OUTBOX_TEST_PG_HOST=127.0.0.1 OUTBOX_TEST_PG_PORT="$PG_PORT" OUTBOX_TEST_PG_USER="$PG_USER"
fi

WORK="$(mktemp -d -t outbox-tests.XXXXXX)"
CLEANUP_DIRS+=("$WORK")

# run_cell CELL DIR REDIS_PORT [PYTEST ARGS...]: one pytest run; output to DIR/log.
run_cell() {
  local cell="$1" dir="$2" redis_port="$3"
  shift 3
  local django="${cell%%:*}" db="${cell##*:}" venv=.venv prepare=""
  [ "$django" = 6.1 ] && venv=.venv-django61
  # Django 6.1 on PostgreSQL runs with psycopg's prepared statements on, so the
  # worker's prepared hot path is tested as well as the default one.
  [ "$cell" = 6.1:postgres ] && prepare=0
  mkdir -p "$dir/sqlite" "$dir/coverage"
  echo "Django $django on $db ($("$venv/bin/python" --version)), redis-server :$redis_port"
  OUTBOX_TEST_DB="$db" \
  OUTBOX_TEST_PG_PREPARE_THRESHOLD="$prepare" \
  OUTBOX_TEST_PG_NAME="outbox_${django/./}_$db" \
  OUTBOX_TEST_SQLITE_DIR="$dir/sqlite" \
  OUTBOX_TEST_REDIS_URL="redis://127.0.0.1:$redis_port/0" \
  OUTBOX_TEST_DJANGO_MAIL_TESTS="$ROOT/$venv/django-tests" \
  COVERAGE_FILE="$dir/coverage/.coverage" \
    "$venv/bin/python" -m pytest -p no:cacheprovider --basetemp="$dir/pytest" \
      --cov=outbox --cov-report= "$@"
}

# Each cell's redis-server is started here, so that the EXIT trap stops it by pid.
declare -A CELL_DIR CELL_REDIS CELL_DONE CELL_PID
cells=()
for cell in $MATRIX; do
  cells+=("$cell")
  CELL_DIR[$cell]="$WORK/${cell/:/-}"
  mkdir -p "${CELL_DIR[$cell]}"
  start_redis
  CELL_REDIS[$cell]="$REDIS_PORT"
done

running_cells() {
  local cell n=0
  for cell in "${cells[@]}"; do
    if [ -f "${CELL_DIR[$cell]}/started" ] && [ ! -f "${CELL_DIR[$cell]}/rc" ]; then n=$((n + 1)); fi
  done
  echo "$n"
}

# Print the whole output of every cell that has ended and was not printed yet.
print_finished() {
  local cell
  for cell in "${cells[@]}"; do
    if [ -f "${CELL_DIR[$cell]}/rc" ] && [ -z "${CELL_DONE[$cell]:-}" ]; then
      CELL_DONE[$cell]=1
      log "pytest $cell: output (exit status $(cat "${CELL_DIR[$cell]}/rc"), $(cat "${CELL_DIR[$cell]}/seconds") s)"
      sed "s/^/[$cell] /" "${CELL_DIR[$cell]}/log"
    fi
  done
}

rm -f .coverage .coverage.*
for cell in "${cells[@]}"; do
  while [ "$(running_cells)" -ge "$JOBS" ]; do print_finished; sleep 1; done
  log "pytest $cell: started (redis-server :${CELL_REDIS[$cell]})"
  touch "${CELL_DIR[$cell]}/started"
  (
    begin=$SECONDS rc=0
    run_cell "$cell" "${CELL_DIR[$cell]}" "${CELL_REDIS[$cell]}" "$@" \
      >"${CELL_DIR[$cell]}/log" 2>&1 </dev/null || rc=$?
    echo $((SECONDS - begin)) >"${CELL_DIR[$cell]}/seconds"
    echo "$rc" >"${CELL_DIR[$cell]}/rc"
  ) &
  CELL_PID[$cell]=$!
done
while [ "$(running_cells)" -gt 0 ]; do print_finished; sleep 1; done
# Only the cells' subshells: a bare `wait` would also wait for the servers.
for cell in "${cells[@]}"; do wait "${CELL_PID[$cell]}" || true; done
print_finished

log "coverage (all cells, with worker and sweeper subprocesses)"
shopt -s nullglob dotglob
data=("$WORK"/*/coverage/.coverage*)
shopt -u nullglob dotglob
if [ ${#data[@]} -gt 0 ]; then
  # combine deletes the files it read; the result is .coverage at the top.
  .venv/bin/python -m coverage combine -q "${data[@]}" || true
  .venv/bin/python -m coverage report || true
fi

log "summary ($((SECONDS - START)) s in all)"
failed=()
for cell in "${cells[@]}"; do
  rc="$(cat "${CELL_DIR[$cell]}/rc")"
  line="$(grep -E '^=+ .*(passed|failed|error|skipped|deselected|no tests ran).* =+$' \
            "${CELL_DIR[$cell]}/log" | tail -n 1 || true)"
  if [ "$rc" = 0 ]; then word=passed; else word="FAILED (exit status $rc)"; failed+=("$cell"); fi
  printf '%-13s %s in %s s   %s\n' "$cell" "$word" "$(cat "${CELL_DIR[$cell]}/seconds")" \
    "${line:-no pytest summary}"
done

if [ ${#failed[@]} -gt 0 ]; then
  # Repeated last, so that the end of a long CI log says which tests failed and
  # why: the assertion lines, and a Hypothesis failure's example and its replay blob.
  for cell in "${failed[@]}"; do
    awk '/Failing test case:/ { case = 1 }
         case || /^E  |[A-Za-z]+Error:|reproduce_failure/ { print }
         case && /^[ |]*\)$/ { case = 0 }' "${CELL_DIR[$cell]}/log" \
      | grep -v 'Traceback\|ExceptionGroup' | cut -c1-300 | head -n 40 | sed "s/^/[$cell] /" || true
    grep -E '^(FAILED|ERROR) ' "${CELL_DIR[$cell]}/log" | sed "s/^/[$cell] /" || true
  done
  echo "FAILED cells: ${failed[*]}" >&2
  exit 1
fi
log "all cells passed: ${cells[*]}"
