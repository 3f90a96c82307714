#!/usr/bin/env bash
# The chaos run: real outbox workers and sweeper against a real SMTP
# server, redis-server and a throwaway PostgreSQL, all on loopback; workers are
# SIGKILLed, SIGSTOPped, killed inside the send window, Redis is wiped and the
# database refuses a "mark sent" write, workers restart under a reused id, one
# runs with its clock 90 s behind (faketime), a web host 120 s behind enqueues
# while its pushes fail, some recipients are hostile but legal addresses (long
# IDN domains, mixed case, display names), the SMTP server stalls or cuts
# after DATA; some workers reach their servers through fault proxies that lose
# replies and refuse connections; a worker whose step waits on a row lock is
# SIGSTOPped, one is SIGTERMed during a long send; then every email is counted.
#
#   tests/chaos/run.sh                                     both policies, 5,000 deliveries
#   tests/chaos/run.sh --deliveries 5000 --policy both
#   tests/chaos/run.sh --policy requeue --seed 7 --workers 6 --concurrency 1,2,4
#   tests/chaos/run.sh --db sqlite --deliveries 1000       no PostgreSQL is started
#
# Tables go to stdout and tests/chaos/results/latest-<policy>.txt; logs to
# tests/chaos/results/logs-<policy>/. Exit status 1 if any rule was broken
# (see tests/chaos/run.py). Everything started here is stopped by pid at exit.
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
cd "$ROOT"
trap stop_started EXIT

ensure_dev_venv
ensure_tools redis faketime  # faketime: the skewed-clock worker and web host (tests/chaos/faults/skew.py, slow_web_host.py)

db=postgres
prev=""
for arg in "$@"; do
  case "$arg" in
    --db=*) db="${arg#--db=}" ;;
    *) [ "$prev" = "--db" ] && db="$arg" ;;
  esac
  prev="$arg"
done

if [ "$db" = postgres ]; then
  start_postgres
  export OUTBOX_TEST_PG_HOST=127.0.0.1 OUTBOX_TEST_PG_PORT="$PG_PORT" OUTBOX_TEST_PG_USER="$PG_USER"
fi
export OUTBOX_TEST_DB="$db"

status=0
.venv/bin/python -m tests.chaos.run "$@" || status=$?
exit "$status"
