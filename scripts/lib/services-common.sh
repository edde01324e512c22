# Shared settings for services-start / services-stop / the bench.
# Source it; do not execute. Every value can be overridden from the environment.
# shellcheck shell=bash

IDEM_HOST=${IDEM_HOST:-127.0.0.1}

# Postgres: our own cluster (initdb) under /tmp, not the Debian packaged one.
PG_PORT=${PG_PORT:-5432}
PG_DB=${PG_DB:-idem}
PG_USER=${PG_USER:-postgres}          # superuser created by initdb; trust auth
PG_ROOT=${PG_ROOT:-/tmp/idem-pg}      # holds data/, the log and the unix socket
PG_DATA=${PG_DATA:-$PG_ROOT/data}
PG_LOG=${PG_LOG:-$PG_ROOT/postgres.log}
PG_SHARED_BUFFERS=${PG_SHARED_BUFFERS:-512MB}
PG_MAX_CONNECTIONS=${PG_MAX_CONNECTIONS:-200}

# Redis standalone (no persistence) and the 6-node cluster.
REDIS_PORT=${REDIS_PORT:-6379}
REDIS_DIR=${REDIS_DIR:-/tmp/idem-redis}
REDIS_CLUSTER_DIR=${REDIS_CLUSTER_DIR:-/tmp/idem-redis-cluster}
REDIS_CLUSTER_PORTS=${REDIS_CLUSTER_PORTS:-"7000 7001 7002 7003 7004 7005"}

# Redis with AOF, used only inside the bench (started and stopped there).
REDIS_AOF_PORT=${REDIS_AOF_PORT:-6390}
REDIS_AOF_DIR=${REDIS_AOF_DIR:-/tmp/idem-redis-aof}

# Newest installed Postgres server binaries (Debian layout).
pg_bindir() {
  if [ -n "${PG_BIN:-}" ]; then echo "$PG_BIN"; return; fi
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  [ -n "$d" ] && echo "$d"
}

as_pg() {  # run a command as the postgres OS user (initdb/postgres refuse root)
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

port_listening() {  # port_listening PORT -> 0 if something listens on IDEM_HOST:PORT
  ss -ltnH "sport = :$1" 2>/dev/null | grep -q .
}

# pid_alive PID -> 0 if running. A zombie counts as gone: PID 1 on this kind of VM
# reaps daemonized children only every ~2 s, and kill -0 succeeds on zombies.
pid_alive() {
  kill -0 "$1" 2>/dev/null || return 1
  [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]
}
wait_gone() {  # wait_gone PID [TIMEOUT_S=15] -> 0 once PID has exited
  local i n=$(( ${2:-15} * 20 ))
  for ((i = 0; i < n; i++)); do pid_alive "$1" || return 0; sleep 0.05; done
  return 1
}

# redis_pid_ok PIDFILE PORT -> 0 if the pidfile names a live redis-server on PORT
redis_pid_ok() {
  local pf=$1 port=$2 pid
  [ -s "$pf" ] || return 1
  pid=$(cat "$pf")
  [ -n "$pid" ] && pid_alive "$pid" || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "redis-server" ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q ":$port\b"
}

now_ms() { date +%s%3N; }
