#!/usr/bin/env bash
# The scaled topology on one machine: PostgreSQL and Redis from Debian's packages, two daphne
# processes, two Celery workers for the steps, one for notifications and Celery beat, all
# configured by environment variables only.
# Ctrl-C (or SIGTERM) stops everything. Needs: apt-get install postgresql redis-server
set -euo pipefail
cd "$(dirname "$0")/.."
STATE=${STATE:-$PWD/.scaled}
PG_PORT=${PG_PORT:-5433}
REDIS_PORT=${REDIS_PORT:-6380}
WEB_PORTS=${WEB_PORTS:-"8001 8002"}
BIN=${BIN:-.venv/bin}
PGBIN=$(ls -d /usr/lib/postgresql/*/bin | tail -n 1)

as_postgres() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

mkdir -p "$STATE"
if [ ! -f "$STATE/pg/PG_VERSION" ]; then
  mkdir -p "$STATE/pg"
  [ "$(id -u)" = 0 ] && chown postgres:postgres "$STATE/pg"
  as_postgres "$PGBIN/initdb" -D "$STATE/pg" -U grundlag --auth=trust -E UTF8 >/dev/null
fi
as_postgres "$PGBIN/pg_ctl" -D "$STATE/pg" -l "$STATE/pg/server.log" -w \
  -o "-p $PG_PORT -k /tmp -c listen_addresses=127.0.0.1 -c max_connections=200" start >/dev/null
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$STATE" --daemonize yes \
  --pidfile "$STATE/redis.pid" --logfile "$STATE/redis.log" --appendonly yes

pids=()
cleanup() {
  trap - INT TERM EXIT
  echo "stopping…"
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait "${pids[@]}" 2>/dev/null || true
  redis-cli -p "$REDIS_PORT" shutdown >/dev/null 2>&1 || true
  as_postgres "$PGBIN/pg_ctl" -D "$STATE/pg" -m fast -w stop >/dev/null || true
}
trap cleanup INT TERM EXIT

psql -h 127.0.0.1 -p "$PG_PORT" -U grundlag -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname='grundlag'" \
  | grep -q 1 || psql -h 127.0.0.1 -p "$PG_PORT" -U grundlag -d postgres -qc "CREATE DATABASE grundlag"

export DATABASE_URL="postgres://grundlag@127.0.0.1:$PG_PORT/grundlag"
export REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
# Plain HTTP on 127.0.0.1: cookies cannot be Secure here (behind HTTPS they are).
export SECURE_COOKIES=false
"$BIN/python" manage.py migrate --noinput -v0
"$BIN/python" manage.py seed_demo

for port in $WEB_PORTS; do
  "$BIN/python" manage.py serve --no-worker --host 127.0.0.1 --port "$port" &
  pids+=($!)
  echo "web: http://127.0.0.1:$port/"
done
for name in worker1 worker2; do
  "$BIN/celery" -A grundlag_site worker -Q celery --hostname "$name@%h" --loglevel INFO &
  pids+=($!)
done
nice -n 10 "$BIN/celery" -A grundlag_site worker -Q notify --hostname "notify@%h" --loglevel INFO &
pids+=($!)
"$BIN/celery" -A grundlag_site beat --loglevel INFO --schedule "$STATE/celerybeat-schedule" &
pids+=($!)
wait -n "${pids[@]}"
