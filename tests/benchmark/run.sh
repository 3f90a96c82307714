#!/usr/bin/env bash
# The benchmark: django-email-outbox against django-post-office and
# django-mailer, on one machine and one database server, in one run.
#
#   tests/benchmark/run.sh                 # full run (PostgreSQL and SQLite), ~10 minutes on 2 cores
#   tests/benchmark/run.sh --quick         # smoke version: small sizes, one repeat
#   tests/benchmark/run.sh --db postgres --repeat 3
#   tests/benchmark/run.sh --db postgres --only efficiency   # CPU per email, latency (issue 27), ~6 min
#   tests/benchmark/run.sh --db postgres --only admin-scale \
#     --output tests/benchmark/results/admin-scale-postgres.md  # the admin at 5,000,000 rows, ~20 min
#   tests/benchmark/run.sh --db postgres --only latency --repeat 3  # 100/s, instant and 20 ms servers, ~2 min
#     (the last two only when named: not part of the full run)
#   tests/benchmark/run.sh --db postgres --only latency --side-by-side --repeat 5 \
#     --output tests/benchmark/results/latency-side-by-side-postgres.md
#     # the outbox, Celery + django-celery-email and Django Tasks + django-tasks-db in one run
#     # (issue 44): 100/s for --latency-seconds (60) each, ~5 minutes a repetition
#
# Every argument goes to tests/benchmark/run.py (see `tests/benchmark/run.sh --help`). It makes its
# own virtualenv .venv-bench, starts redis-server and a throwaway PostgreSQL on
# loopback (fsync and synchronous_commit ON: commits are durable, as in
# production), and stops them by pid at exit. Results: tests/benchmark/results/latest.md.
set -euo pipefail

# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

trap stop_started EXIT
trap 'exit 130' INT TERM

PYTHON="$(pick_python 3.11 3.11)"
ensure_venv "$ROOT/.venv-bench" "$PYTHON" postgres \
  "Django>=5.2,<5.3" \
  "django-post-office>=3.9,<4" \
  "django-mailer>=2.3,<2.4" \
  "psycopg[binary]>=3.1" \
  "aiosmtpd>=1.4" \
  "celery[redis]>=5.5,<6" \
  "django-celery-email>=3.0,<4" \
  "django-tasks>=0.12,<0.13" \
  "django-tasks-db>=0.13,<0.14"

start_redis
start_postgres durable

BENCH_TMP="$(mktemp -d -p /var/tmp outbox-bench.XXXXXX)"
CLEANUP_DIRS+=("$BENCH_TMP")

export BENCH_REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
export BENCH_REDIS_PORT="$REDIS_PORT"
export BENCH_PG_HOST=127.0.0.1 BENCH_PG_PORT="$PG_PORT" BENCH_PG_USER="$PG_USER"
export BENCH_PG_BIN="$PG_BIN"
export BENCH_TMP
export PYTHONUNBUFFERED=1

cd "$ROOT"
"$ROOT/.venv-bench/bin/python" -m tests.benchmark.run "$@"
