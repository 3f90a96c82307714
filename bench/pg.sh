# shellcheck shell=bash
# start_durable_postgres: like start_postgres in scripts/lib.sh, but with the
# durability settings of a production server (fsync, synchronous_commit and
# full_page_writes ON), because commit cost is part of what the benchmark
# measures. scripts/lib.sh hard-codes fsync=off for the test suite and has no
# parameter for it, hence this copy. Sets PG_PORT, PG_USER, PG_DATA, PG_BIN.

start_durable_postgres() {
  local dir run=()
  PG_BIN="$(pg_bindir)"
  PG_PORT="$(free_port)"
  # On disk (not tmpfs), so that fsync costs what it costs.
  dir="$(mktemp -d -p /var/tmp outbox-bench-pg.XXXXXX)"
  chmod 755 "$dir"
  CLEANUP_DIRS+=("$dir")
  PG_DATA="$dir/data"
  mkdir -p "$PG_DATA" "$dir/sock"
  PG_USER=postgres
  if [ "$(id -u)" = 0 ]; then
    chown -R postgres "$dir/data" "$dir/sock"
    run=(runuser -u postgres --)
  else
    PG_USER="$(id -un)"
  fi
  "${run[@]}" "$PG_BIN/initdb" -D "$PG_DATA" -U "$PG_USER" -A trust --no-sync -E UTF8 \
    >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; return 1; }
  "${run[@]}" "$PG_BIN/postgres" -D "$PG_DATA" -h 127.0.0.1 -p "$PG_PORT" -k "$dir/sock" \
    -c fsync=on -c synchronous_commit=on -c full_page_writes=on -c max_connections=200 \
    -c track_wal_io_timing=off >"$dir/postgres.log" 2>&1 &
  if ! wait_for 30 "$PG_BIN/pg_isready" -h 127.0.0.1 -p "$PG_PORT"; then
    cat "$dir/postgres.log" >&2
    echo "PostgreSQL did not start" >&2
    return 1
  fi
  PG_PID="$(head -n 1 "$PG_DATA/postmaster.pid")"
  STARTED_PIDS+=("$PG_PID")
  log "PostgreSQL $("$PG_BIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$PG_PORT (pid $PG_PID, fsync on)"
}
