#!/usr/bin/env bash
# The test command: the whole test suite, from a fresh machine. Lint and types,
# then pytest in five cells, against real redis-servers on loopback:
#
#   cell           Python   what it runs
#   5.2:postgres   3.11     every module but those kept to other cells; a chaos run, PgBouncer
#   6.1:postgres   3.12     the same; the other chaos run
#   5.2:sqlite     3.11     the same
#   6.1:sqlite     3.12     the same; the built wheel adopted into a new project
#   6.0:sqlite     3.13     the fast tests only: none marked slow (-m "not slow")
#
# Each Django version has its Python (each of 3.11, 3.12 and 3.13 once); where the
# machine lacks it, the cell takes the newest Python it has that the Django version
# supports, and its lines say which. The slow modules run in one or two named cells
# (tests/cells.py); the fast ones run in every cell.
#
#   tests/run.sh                                               everything (what CI runs)
#   tests/run.sh --fast [-k sweeper]                           the fast lane (below)
#   OUTBOX_TEST_MATRIX="5.2:sqlite" tests/run.sh -k worker     one cell, pytest args
#   OUTBOX_TEST_SKIP_LINT=1 tests/run.sh                       no ruff, mypy, import-linter
#   OUTBOX_TEST_JOBS=1 tests/run.sh                            cells one at a time
#   OUTBOX_TEST_JOBS=1 tests/run.sh --fast                     the fast lane in one process
#
# Cells run OUTBOX_TEST_JOBS at a time (default 2). They cannot collide: each has
# its own redis-server, its own SQLite folder, its own PostgreSQL database names
# (one server, "test_outbox_<cell>"), its own pytest temporary folder and its own
# coverage data. A cell's output is buffered and printed whole when it ends (its
# skips counted, not listed, but for unexpected ones), followed by one summary line
# per cell, then the coverage of all cells in one line and the least covered modules.
# The exit status is 1 if any cell failed.
#
# Installs what is missing: a Python from 3.11 on (apt-get, if the machine has none),
# the virtual environments .venv (Django 5.2, and the linters), .venv-django60 and
# .venv-django61 (rebuilt only when pyproject.toml or their Python changes), and with
# one apt-get what the selected cells use (CELL_TOOLS below): redis-server,
# PostgreSQL, Chromium (the admin's browser test), faketime, Postfix and PgBouncer.
# Every server listens on 127.0.0.1 on a free port and is stopped by pid when the
# script exits.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
trap stop_started EXIT

# The fast lane: `tests/run.sh --fast [PYTEST ARGS]` runs the tests not marked slow in
# one cell (Django 5.2 on SQLite), split over the cores by pytest-xdist, without the
# linters or coverage, and needs only Python and a redis-server on PATH: it installs
# nothing with apt-get. Every fast test: under 150 s on a quiet 2-core machine.
FAST=""
if [ "${1:-}" = --fast ]; then
  FAST=1
  shift
fi

# The two longest cells first (5.2:postgres, then 6.1:postgres with the chaos run); the
# slot that frees first takes 5.2:sqlite, then 6.0:sqlite, so that both slots end together.
MATRIX="${OUTBOX_TEST_MATRIX:-5.2:postgres 6.1:postgres 5.2:sqlite 6.1:sqlite 6.0:sqlite}"
JOBS="${OUTBOX_TEST_JOBS:-2}"
# The fast lane's one cell runs on every core: OUTBOX_TEST_JOBS pytest-xdist workers
# (default: the core count), each its own pytest session with its own redis-server and
# SQLite database, the tests of one module on one worker (--dist loadfile). A part of
# the suite (a path, a test id or -k among the arguments) runs in one process unless
# OUTBOX_TEST_JOBS is set: each worker's start (Django, collection) costs more than the
# second core saves on a part.
# Its Python bytecode, and pytest's rewritten test modules, are kept in .venv/pycache
# (never in the checkout), even where PYTHONDONTWRITEBYTECODE is set: compiling them anew
# costs each worker, and each worker subprocess, seconds of CPU on every run.
if [ -n "$FAST" ]; then
  MATRIX="5.2:sqlite"
  XDIST="${OUTBOX_TEST_JOBS:-$(nproc)}"
  for arg in "$@"; do
    if [[ "$arg" == -n* || "$arg" == --numprocesses* ]]; then
      echo "the fast lane starts a redis-server per pytest-xdist worker: choose their number" \
        "with OUTBOX_TEST_JOBS, not $arg" >&2
      exit 1
    fi
    if [ -z "${OUTBOX_TEST_JOBS:-}" ] && { [[ "$arg" == -k* ]] || [ -e "${arg%%::*}" ]; }; then XDIST=1; fi
  done
  JOBS=1
  unset PYTHONDONTWRITEBYTECODE
  export PYTHONPYCACHEPREFIX="$ROOT/.venv/pycache"
fi
START=$SECONDS

# Per Django version: its virtual environment, the Python it is tested on, the oldest
# Python it supports (the fallback's floor) and the pip spec.
declare -A VENV=([5.2]=.venv [6.0]=.venv-django60 [6.1]=.venv-django61)
declare -A WANT_PYTHON=([5.2]=3.11 [6.0]=3.13 [6.1]=3.12)
declare -A MIN_PYTHON=([5.2]=3.11 [6.0]=3.12 [6.1]=3.12)
declare -A DJANGO_SPEC=([5.2]="django>=5.2,<5.3" [6.0]="django>=6.0,<6.1" [6.1]="django>=6.1,<6.2")
declare -A PYTHON PYTHON_NOTE

# The system tools each cell's tests use (tests/lib.sh, missing_packages): only the
# selected cells' are installed. Where a module runs is tests/cells.py's; the 6.0 cell
# runs the fast tests only, which need none of them.
declare -A CELL_TOOLS=(
  [5.2:postgres]="postgresql faketime pgbouncer"
  [6.1:postgres]="postgresql faketime chromium"
  [5.2:sqlite]="faketime"
  [6.1:sqlite]="faketime postfix"
  [6.0:sqlite]=""
)
tools=(redis)
for cell in $MATRIX; do
  # shellcheck disable=SC2206 # the table's words are tool names
  tools+=(${CELL_TOOLS[$cell]?"tests/run.sh has no cell $cell"})
done

# Each Django version's Python first: finding one may itself need apt-get (a machine
# with none), which must not run beside the tools' apt-get below.
for django in 5.2 6.0 6.1; do
  [[ " $MATRIX " == *" $django:"* ]] || [ "$django" = 5.2 ] || continue
  PYTHON[$django]="$(pick_python "${MIN_PYTHON[$django]}" "${WANT_PYTHON[$django]}")" || {
    echo "Django $django needs Python ${MIN_PYTHON[$django]} or later. To run the" \
      "Django 5.2 cells alone: OUTBOX_TEST_MATRIX=\"5.2:postgres 5.2:sqlite\" tests/run.sh" >&2
    exit 1
  }
done

WORK="$(mktemp -d -t outbox-tests.XXXXXX)"
CLEANUP_DIRS+=("$WORK")

# The tools install (apt-get: network and dpkg) while pip makes the virtual
# environments (network and CPU): on a fresh machine each takes a minute or two.
if [ -n "$FAST" ]; then
  if [ -n "$(missing_packages redis)" ]; then
    echo "the fast lane needs redis-server and redis-cli on PATH (tests/run.sh without" \
      "--fast installs them with apt-get)" >&2
    exit 1
  fi
  TOOLS_PID=""
else
  ensure_tools "${tools[@]}" >"$WORK/tools.log" 2>&1 &
  TOOLS_PID=$!
fi

# .venv always: the linters and the coverage report run from it.
ensure_dev_venv
for django in 6.0 6.1; do
  [[ " $MATRIX " == *" $django:"* ]] && ensure_venv "${VENV[$django]}" "${PYTHON[$django]}" test "${DJANGO_SPEC[$django]}"
done
for django in 5.2 6.0 6.1; do
  [[ " $MATRIX " == *" $django:"* ]] || continue
  ensure_django_mail_tests "${VENV[$django]}"
  have="$(python_version "${VENV[$django]}/bin/python")"
  if [ "${have%.*}" != "${WANT_PYTHON[$django]}" ]; then
    PYTHON_NOTE[$django]=" (not ${WANT_PYTHON[$django]}: the machine has none)"
    log "Django $django runs on Python $have: this machine has no Python ${WANT_PYTHON[$django]}"
  fi
done
if [ -n "$TOOLS_PID" ]; then
  tools_rc=0
  wait "$TOOLS_PID" || tools_rc=$?
  cat "$WORK/tools.log" >&2
  if [ "$tools_rc" != 0 ]; then
    echo "could not install the tools the tests need: ${tools[*]} (output above)" >&2
    exit 1
  fi
fi

[ -n "$FAST" ] && OUTBOX_TEST_SKIP_LINT=1
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

# run_cell CELL DIR "REDIS_PORT..." [PYTEST ARGS...]: one pytest run; output to DIR/log.
# Several ports: the fast lane's pytest-xdist workers, one redis-server each (tests/settings.py).
run_cell() {
  local cell="$1" dir="$2" redis_ports="$3"
  shift 3
  local django="${cell%%:*}" db="${cell##*:}" prepare="" marks=() cov=(--cov=outbox --cov-report=)
  local xdist=() port urls=()
  local venv="${VENV[$django]:?no Django $django in tests/run.sh}"
  # Django 6.0's cell and the fast lane run the fast tests only: those not marked slow
  # (pyproject.toml). The fast lane measures no coverage.
  if [ "$django" = 6.0 ] || [ -n "$FAST" ]; then marks=(-m "not slow"); fi
  [ -n "$FAST" ] && cov=()
  for port in $redis_ports; do urls+=("redis://127.0.0.1:$port/0"); done
  [ ${#urls[@]} -gt 1 ] && xdist=(-n "${#urls[@]}" --dist loadfile)
  # On Python 3.12 and later, coverage measures through sys.monitoring (PEP 669), which
  # costs the cell's tests and subprocesses far less than the C tracer 3.11 needs.
  local core=ctrace
  version_at_least "$(python_version "$venv/bin/python" | cut -d. -f1,2)" 3.12 && core=sysmon
  # Django 6.1 on PostgreSQL runs with psycopg's prepared statements on, so the
  # worker's prepared hot path is tested as well as the default one.
  [ "$cell" = 6.1:postgres ] && prepare=0
  mkdir -p "$dir/sqlite" "$dir/coverage"
  echo "Django $django on $db, Python $(python_version "$venv/bin/python")${PYTHON_NOTE[$django]:-}," \
    "redis-server :${redis_ports// /, :}"
  OUTBOX_TEST_DB="$db" \
  OUTBOX_TEST_PG_PREPARE_THRESHOLD="$prepare" \
  OUTBOX_TEST_PG_NAME="outbox_${django/./}_$db" \
  OUTBOX_TEST_SQLITE_DIR="$dir/sqlite" \
  OUTBOX_TEST_REDIS_URL="${urls[*]}" \
  OUTBOX_TEST_DJANGO_MAIL_TESTS="$ROOT/$venv/django-tests" \
  COVERAGE_FILE="$dir/coverage/.coverage" COVERAGE_CORE="$core" \
    "$venv/bin/python" -m pytest -p no:cacheprovider --basetemp="$dir/pytest" \
      --junitxml="$dir/junit.xml" -o junit_family=xunit1 "${cov[@]}" "${marks[@]}" "${xdist[@]}" "$@"
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
  for _ in $(seq 2 "${XDIST:-1}"); do
    start_redis
    CELL_REDIS[$cell]+=" $REDIS_PORT"
  done
done

running_cells() {
  local cell n=0
  for cell in "${cells[@]}"; do
    if [ -f "${CELL_DIR[$cell]}/started" ] && [ ! -f "${CELL_DIR[$cell]}/rc" ]; then n=$((n + 1)); fi
  done
  echo "$n"
}

# without_expected_skips LOG: the log with pytest's SKIPPED lines (-ra) for modules kept
# to other cells (tests/cells.py, the chaos run) replaced by one line that counts them;
# other skips (a missing tool, say) are kept, one line per reason with its count. XFAIL
# lines (the listed expected failures, e.g. tests/upstream/test_anymail_backends.py) are counted
# per module; an unexpected success is a failure and is printed as one.
without_expected_skips() {
  awk '
    /^XFAIL [^ ]+::/ {
      module = $2
      sub(/::.*/, "", module)
      if (!(module in xfailed)) xorder[++xkinds] = module
      xfailed[module]++
      next
    }
    /^SKIPPED \[[0-9]+\] / {
      n = substr($2, 2, length($2) - 2) + 0
      reason = $0
      sub(/^SKIPPED \[[0-9]+\] [^ ]+: /, "", reason)
      if (reason ~ /runs in the [^ ]+( and [^ ]+)? cells?/) { by_cell += n; next }
      if (!(reason in other)) order[++kinds] = reason
      other[reason] += n
      where[reason] = $3
      next
    }
    /^=+ .*(passed|failed|error|skipped|no tests ran).* =+$/ && !done {
      if (by_cell) printf "%d skipped: their modules run in other cells (tests/cells.py)\n", by_cell
      for (i = 1; i <= xkinds; i++)
        printf "XFAIL [%d] %s: expected failures, listed in the module\n", xfailed[xorder[i]], xorder[i]
      for (i = 1; i <= kinds; i++)
        printf "SKIPPED [%d] %s %s\n", other[order[i]], where[order[i]], order[i]
      done = 1
    }
    { print }
  ' "$1"
}

# Print the whole output of every cell that has ended and was not printed yet.
print_finished() {
  local cell
  for cell in "${cells[@]}"; do
    if [ -f "${CELL_DIR[$cell]}/rc" ] && [ -z "${CELL_DONE[$cell]:-}" ]; then
      CELL_DONE[$cell]=1
      log "pytest $cell: output (exit status $(cat "${CELL_DIR[$cell]}/rc"), $(cat "${CELL_DIR[$cell]}/seconds") s)"
      without_expected_skips "${CELL_DIR[$cell]}/log" | sed "s/^/[$cell] /"
    fi
  done
}

rm -f .coverage .coverage.*
for cell in "${cells[@]}"; do
  while [ "$(running_cells)" -ge "$JOBS" ]; do print_finished; sleep 1; done
  log "pytest $cell: started (redis-server :${CELL_REDIS[$cell]// /, :})"
  touch "${CELL_DIR[$cell]}/started"
  (
    begin=$SECONDS rc=0
    # In a subshell of its own, so that even a shell error in run_cell ends here with a status.
    (run_cell "$cell" "${CELL_DIR[$cell]}" "${CELL_REDIS[$cell]}" "$@") \
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

if [ -z "$FAST" ]; then
  shopt -s nullglob dotglob
  data=("$WORK"/*/coverage/.coverage*)
  shopt -u nullglob dotglob
  # combine deletes the files it read; the result is .coverage at the top, for
  # `.venv/bin/python -m coverage report -m` (every module, with its missing lines).
  if [ ${#data[@]} -gt 0 ] && .venv/bin/python -m coverage combine -q "${data[@]}"; then
    log "coverage: $(.venv/bin/python -m coverage report --format=total)% of outbox/ (all cells," \
      "with worker and sweeper subprocesses); the least covered modules:"
    .venv/bin/python -m coverage report --sort=cover --skip-covered | sed -n '1,10p' || true
  fi
fi

log "summary ($((SECONDS - START)) s in all)"
failed=()
for cell in "${cells[@]}"; do
  rc="$(cat "${CELL_DIR[$cell]}/rc")"
  line="$(grep -E '^=+ .*(passed|failed|error|skipped|deselected|no tests ran).* =+$' \
            "${CELL_DIR[$cell]}/log" | tail -n 1 || true)"
  if [ "$rc" = 0 ]; then word=passed; else word="FAILED (exit status $rc)"; failed+=("$cell"); fi
  django="${cell%%:*}"
  printf '%-13s Python %-7s %s in %s s   %s\n' "$cell" \
    "$(python_version "${VENV[$django]}/bin/python")" "$word" \
    "$(cat "${CELL_DIR[$cell]}/seconds")" "${line:-no pytest summary}"
done

# Where the time went, to keep the cells balanced (tests/cells.py).
for cell in "${cells[@]}"; do
  .venv/bin/python -m tests.durations "$cell" "${CELL_DIR[$cell]}/junit.xml" || true
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
