# Shell helpers shared by tests/run.sh (the test command), example_project/run.sh,
# tests/chaos/run.sh and tests/benchmark/run.sh: find or install a Python, make virtual
# environments quietly, install redis-server, PostgreSQL, Chromium, faketime, Postfix
# and PgBouncer with apt-get when missing, start servers on 127.0.0.1 and free ports,
# and stop what was started, by pid (never by name).
# shellcheck shell=bash

# This file is tests/lib.sh: the repository is its parent's parent.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STARTED_PIDS=()
CLEANUP_DIRS=()

# Bold on a terminal only: a log redirected to a file holds no escape sequences.
log() {
  if [ -t 2 ]; then printf '\033[1m==> %s\033[0m\n' "$*" >&2; else printf '==> %s\n' "$*" >&2; fi
}

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

# find_python 3.12 -> path of a python3.12 interpreter that can make virtual
# environments (Debian splits venv/ensurepip off into python3.12-venv).
find_python() {
  local v="$1" candidate
  for candidate in "python$v" "$(pyenv root 2>/dev/null)/versions/$v"*/bin/"python$v" \
                   /root/.pyenv/versions/"$v"*/bin/"python$v" /usr/bin/"python$v" \
                   /usr/local/bin/"python$v"; do
    if [ -n "$candidate" ] && "$candidate" -c 'import ensurepip, venv' >/dev/null 2>&1; then
      command -v "$candidate"
      return 0
    fi
  done
  return 1
}

# version_at_least 3.12 3.11 -> true: the first version is the second or later.
version_at_least() {
  [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n 1)" = "$2" ]
}

# newest_python MIN -> path of the newest Python the machine has that is MIN or later.
newest_python() {
  local min="$1" minor
  for minor in $(seq 20 -1 "${min#3.}"); do
    find_python "3.$minor" && return 0
  done
  return 1
}

# apt_install_python MIN: install the newest python3.X (with its venv package) that
# apt-get offers and that is MIN or later. Debian 12 has 3.11, Ubuntu 24.04 3.12.
apt_install_python() {
  local min="$1" name best=""
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>&1 || true
  for name in $(apt-cache pkgnames python3. 2>/dev/null | grep -E '^python3\.[0-9]+$' | sort -V); do
    if version_at_least "${name#python}" "$min"; then best="$name"; fi
  done
  if [ -z "$best" ]; then
    echo "apt-get offers no Python $min or later" >&2
    return 1
  fi
  apt_install "$best" "$best-venv"
}

# pick_python MIN [PREFERRED...] -> path of a Python: the first PREFERRED version the
# machine has, else the newest it has that is MIN or later, else one that apt-get
# installs. Fails, saying so, when there is none.
pick_python() {
  local min="$1" v
  shift
  for v in "$@"; do find_python "$v" && return 0; done
  newest_python "$min" && return 0
  log "no Python $min or later with venv found; installing one with apt-get"
  apt_install_python "$min" >&2 && newest_python "$min" && return 0
  echo "no Python $min or later could be found or installed" >&2
  return 1
}

# python_version PYTHON -> "3.12.1"
python_version() {
  "$1" -c 'import platform; print(platform.python_version())'
}

# ensure_venv DIR PYTHON EXTRAS [PIP SPEC...]: create DIR and install the project
# into it (editable), reinstalling only when pyproject.toml or the specs change.
ensure_venv() {
  local dir="$1" python="$2" extras="$3"
  shift 3
  local stamp="$dir/.outbox-stamp"
  local want version
  version="$(python_version "$python")"
  want="$( (cat "$ROOT/pyproject.toml"; echo "$extras $* $version") | sha256sum | cut -d' ' -f1)"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$dir/bin/python" ]; then
    return 0
  fi
  # A venv made by another Python (another machine, another choice) is made anew.
  if [ -e "$dir" ] && [ "$(python_version "$dir/bin/python" 2>/dev/null)" != "$version" ]; then
    rm -rf "$dir"
  fi
  log "preparing $dir (Python $version, $extras $*)"
  # pip and the build backend are chatty (notices, deprecation warnings of build
  # dependencies): their output goes to a log that is shown only if a step fails.
  local out
  out="$(mktemp)"
  if ! { { [ -x "$dir/bin/python" ] || "$python" -m venv "$dir"; } \
         && PIP_DISABLE_PIP_VERSION_CHECK=1 "$dir/bin/python" -m pip install -q --upgrade pip \
         && PIP_DISABLE_PIP_VERSION_CHECK=1 "$dir/bin/python" -m pip install -q \
              -e "$ROOT[$extras]" "$@"; } >"$out" 2>&1; then
    cat "$out" >&2
    rm -f "$out"
    echo "could not prepare $dir (output above)" >&2
    return 1
  fi
  rm -f "$out"
  # The editable install keeps its metadata in the venv; the copy setuptools
  # leaves in the checkout would be a seventh entry at the top level.
  rm -rf "$ROOT"/*.egg-info
  echo "$want" >"$stamp"
}

# apt_install PACKAGE...: quiet unless it fails.
apt_install() {
  log "installing $* with apt-get"
  local out
  out="$(mktemp)"
  if ! { as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
         && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"; } >"$out" 2>&1; then
    cat "$out" >&2
    rm -f "$out"
    return 1
  fi
  rm -f "$out"
}

# The system tools the tests and scripts use, by name, and the Debian packages that
# bring them. missing_packages prints the packages of those this machine lacks.
#   redis       redis-server and redis-cli (the Cluster tests run `redis-cli --cluster
#               create`); the Debian package brings both, and sentinel mode too
#   postgresql  the server binaries (tests/lib.sh start_postgres)
#   faketime    tests that move a worker's clock
#   postfix     tests against a real mail server's log (tests/reconcilers/test_postfix_real.py);
#               they run a private instance of their own
#   pgbouncer   the tests through a transaction-pooling PgBouncer (tests/faults/test_pgbouncer.py;
#               a private instance; the host's service, if the package starts one, is left)
#   chromium    Chromium and its driver, for the admin's browser test
missing_packages() {
  local tool
  for tool in "$@"; do
    case "$tool" in
      redis) { command -v redis-server && command -v redis-cli; } >/dev/null 2>&1 || echo redis-server ;;
      postgresql) compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null || echo postgresql ;;
      faketime) command -v faketime >/dev/null 2>&1 || echo faketime ;;
      postfix) [ -x /usr/sbin/postfix ] || echo postfix ;;
      pgbouncer) { command -v pgbouncer || [ -x /usr/sbin/pgbouncer ]; } >/dev/null 2>&1 || echo pgbouncer ;;
      chromium) { command -v chromium && command -v chromedriver; } >/dev/null 2>&1 || echo chromium chromium-driver ;;
      *) echo "unknown tool: $tool" >&2; return 1 ;;
    esac
  done
}

# The tools without which only their own tests are skipped (saying so); the others are required.
OPTIONAL_PACKAGES=" postfix pgbouncer chromium chromium-driver "

# ensure_tools TOOL...: install every named tool the machine lacks, with one apt-get
# update and one apt-get install (each update costs seconds on a fresh machine). If
# that install fails, each package is tried alone, so that an optional one that
# cannot be had (its tests are then skipped) costs nothing else. Fails only when a
# required tool is still missing.
ensure_tools() {
  local packages package failed=0
  read -r -a packages <<<"$(missing_packages "$@" | tr '\n' ' ')"
  [ ${#packages[@]} -eq 0 ] && return 0
  if [[ " ${packages[*]} " == *" postfix "* ]]; then
    # Preseeded so that apt-get asks nothing and leaves the host's mail setup unconfigured.
    echo "postfix postfix/main_mailer_type select No configuration" | as_root debconf-set-selections
  fi
  apt_install "${packages[@]}" && return 0
  for package in "${packages[@]}"; do
    apt_install "$package" && continue
    if [[ "$OPTIONAL_PACKAGES" == *" $package "* ]]; then
      log "$package could not be installed; its tests will be skipped"
    else
      failed=1
    fi
  done
  return "$failed"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

wait_for() { # wait_for SECONDS COMMAND...
  local deadline=$((SECONDS + $1))
  shift
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then return 1; fi
    sleep 0.1
  done
}

# start_redis -> sets REDIS_PORT, REDIS_PID
start_redis() {
  ensure_tools redis
  REDIS_PORT="$(free_port)"
  local dir
  dir="$(mktemp -d)"
  CLEANUP_DIRS+=("$dir")
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$dir" --daemonize no --loglevel warning >"$dir/redis.log" 2>&1 &
  REDIS_PID=$!
  STARTED_PIDS+=("$REDIS_PID")
  if ! wait_for 20 redis-cli -p "$REDIS_PORT" ping; then
    cat "$dir/redis.log" >&2
    echo "redis-server did not start" >&2
    return 1
  fi
  log "redis-server $REDIS_PORT (pid $REDIS_PID)"
}

pg_bindir() {
  local d
  ensure_tools postgresql
  d="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"
  echo "$d"
}

# start_postgres [durable] -> sets PG_PORT, PG_USER, PG_DATA, PG_BIN (stopped at exit
# by its postmaster pid). The test suite's server trades durability for speed;
# "durable" keeps fsync, synchronous_commit and full_page_writes on, with the data
# on disk rather than tmpfs, for the benchmark, where commit cost is measured.
start_postgres() {
  local durable="${1:-}" dir run=() settings
  PG_BIN="$(pg_bindir)"
  PG_PORT="$(free_port)"
  if [ "$durable" = durable ]; then
    dir="$(mktemp -d -p /var/tmp outbox-pg.XXXXXX)"
    settings=(-c fsync=on -c synchronous_commit=on -c full_page_writes=on)
  else
    dir="$(mktemp -d)"
    settings=(-c fsync=off -c synchronous_commit=off -c full_page_writes=off)
  fi
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
  "${run[@]}" "$PG_BIN/initdb" -D "$PG_DATA" -U "$PG_USER" -A trust --no-sync -E UTF8 >"$dir/initdb.log" 2>&1 \
    || { cat "$dir/initdb.log" >&2; return 1; }
  "${run[@]}" "$PG_BIN/postgres" -D "$PG_DATA" -h 127.0.0.1 -p "$PG_PORT" -k "$dir/sock" \
    "${settings[@]}" -c max_connections=200 >"$dir/postgres.log" 2>&1 &
  if ! wait_for 30 "$PG_BIN/pg_isready" -h 127.0.0.1 -p "$PG_PORT"; then
    cat "$dir/postgres.log" >&2
    echo "PostgreSQL did not start" >&2
    return 1
  fi
  PG_PID="$(head -n 1 "$PG_DATA/postmaster.pid")"
  STARTED_PIDS+=("$PG_PID")
  log "PostgreSQL $("$PG_BIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$PG_PORT (pid $PG_PID${durable:+, durable})"
}

stop_started() {
  local pid
  for pid in "${STARTED_PIDS[@]}"; do
    kill -INT "$pid" 2>/dev/null || true
  done
  for pid in "${STARTED_PIDS[@]}"; do
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  local d
  for d in "${CLEANUP_DIRS[@]}"; do rm -rf "$d"; done
}

# ensure_django_mail_tests VENV: Django's own mail tests (tests/mail/ of the sdist of
# the Django installed in VENV), for tests/upstream/test_django_mail.py. Downloaded once with
# that venv's pip and kept in VENV/django-tests/<version>/mail; a no-op when there.
# tests/mail/ imports only Django, the standard library and aiosmtpd (a test extra).
# Unpacked into a temporary folder inside VENV and renamed into place, so that two
# test commands running at once cannot see half a copy.
ensure_django_mail_tests() {
  local venv="$1" version dest tmp out
  version="$("$venv/bin/python" -c 'import django; print(django.__version__)')" || return 1
  dest="$venv/django-tests/$version"
  [ -f "$dest/mail/tests.py" ] && return 0
  log "fetching Django $version's mail tests (tests/mail/ of its sdist) into $dest"
  mkdir -p "$venv/django-tests"
  tmp="$(mktemp -d "$venv/django-tests/.fetch.XXXXXX")"
  out="$tmp/pip.log"
  if ! PIP_DISABLE_PIP_VERSION_CHECK=1 "$venv/bin/python" -m pip download -q --no-deps \
         --no-binary :all: "django==$version" -d "$tmp/sdist" >"$out" 2>&1 \
     || ! tar -xzf "$tmp"/sdist/[Dd]jango-"$version".tar.gz -C "$tmp" \
            --wildcards "*/tests/mail/*" >>"$out" 2>&1; then
    cat "$out" >&2
    rm -rf "$tmp"
    echo "could not fetch Django $version's mail tests (output above)" >&2
    return 1
  fi
  mkdir -p "$tmp/tree"
  mv "$tmp"/[Dd]jango-"$version"/tests/mail "$tmp/tree/mail"
  # Another test command may have won the race: keep its copy.
  mv -T "$tmp/tree" "$dest" 2>/dev/null || [ -f "$dest/mail/tests.py" ] || {
    rm -rf "$tmp"
    echo "could not install Django $version's mail tests in $dest" >&2
    return 1
  }
  rm -rf "$tmp"
}

# ensure_dev_venv: .venv, the environment of the example, the linters, the chaos run
# and the Django 5.2 cells of the test command: Django 5.2 on Python 3.11 when the
# machine has it, else on the newest Python from 3.11 on (Django 5.2 supports 3.10 to 3.14).
ensure_dev_venv() {
  local python
  python="$(pick_python 3.11 3.11)" || return 1
  ensure_venv "$ROOT/.venv" "$python" dev "django>=5.2,<5.3"
}
