#!/usr/bin/env bash
# Local stack for deployments: a Prefect server (UI at http://127.0.0.1:4200), a process work pool with a worker,
# and a local S3 server (SeaweedFS). Everything binds 127.0.0.1. PIDs and logs live in .cache/stack/.
#
#   infra/stack.sh up      start what is not running, deploy deployments/prefect.yaml
#   infra/stack.sh down    stop everything this script started
#   infra/stack.sh status
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
STATE="$ROOT/.cache/stack"
BIN="$ROOT/.venv/bin"
PORT="${PREFECT_PORT:-4200}"
POOL="${GRPO_WORK_POOL:-grpo-local}"
mkdir -p "$STATE"
# The server keeps its own database (not the ephemeral one that `make run`/`make test` use).
export PREFECT_HOME="${GRPO_STACK_PREFECT_HOME:-$ROOT/.cache/prefect-server}" PREFECT_SERVER_ANALYTICS_ENABLED=false
export PREFECT_API_URL="http://127.0.0.1:$PORT/api" GRPO_PROJECT_DIR="$ROOT"
mkdir -p "$PREFECT_HOME"

running() { [ -f "$STATE/$1.pid" ] && kill -0 "$(cat "$STATE/$1.pid")" 2>/dev/null; }

start() {  # name, command...
  local name=$1; shift
  if running "$name"; then echo "$name already running (pid $(cat "$STATE/$name.pid"))"; return; fi
  setsid "$@" >"$STATE/$name.log" 2>&1 < /dev/null &
  echo $! > "$STATE/$name.pid"
  echo "$name started (pid $!, log $STATE/$name.log)"
}

wait_http() {  # url, seconds
  for _ in $(seq "$2"); do curl -fsS "$1" >/dev/null 2>&1 && return 0; sleep 1; done
  echo "timed out waiting for $1" >&2; return 1
}

case "${1:-}" in
  up)
    start prefect-server "$BIN/prefect" server start --host 127.0.0.1 --port "$PORT"
    wait_http "$PREFECT_API_URL/health" 90
    "$BIN/prefect" work-pool inspect "$POOL" >/dev/null 2>&1 || "$BIN/prefect" work-pool create "$POOL" --type process
    (cd "$ROOT" && "$BIN/prefect" --no-prompt deploy --prefect-file deployments/prefect.yaml --all)
    start prefect-worker "$BIN/prefect" worker start --pool "$POOL"
    start s3 "$BIN/python" -m grpo_core.s3server "${GRPO_S3_DIR:-$ROOT/.cache/s3}" runs
    echo "Prefect UI: http://127.0.0.1:$PORT   run: PREFECT_API_URL=$PREFECT_API_URL $BIN/prefect deployment run 'grpo-train/tiny'"
    ;;
  down)
    for name in prefect-worker s3 prefect-server; do
      if running "$name"; then
        pid=$(cat "$STATE/$name.pid"); kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"
        for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -KILL -- "-$pid" 2>/dev/null || true   # a worker may ignore one SIGTERM for over 30 s
        echo "$name stopped"
      fi
      rm -f "$STATE/$name.pid"
    done
    ;;
  status)
    for name in prefect-server prefect-worker s3; do
      if running "$name"; then echo "$name: running (pid $(cat "$STATE/$name.pid"))"; else echo "$name: stopped"; fi
    done
    ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
