#!/usr/bin/env bash
# Local stack for deployments: a Prefect server (UI at http://127.0.0.1:4200), a process work pool with a worker,
# a Ray head that every deployment run joins (cluster.ray_address=$GRPO_RAY_ADDRESS), and a local S3 server
# (SeaweedFS). Everything binds 127.0.0.1. PIDs and logs live in .cache/stack/.
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
RAY_PORT="${GRPO_RAY_PORT:-6380}"
# Logical CPUs of the Ray head: as a local run does, reserve more than the cores (roles take turns on a small box).
RAY_CPUS="${GRPO_RAY_CPUS:-$(( $(nproc) > 8 ? $(nproc) : 8 ))}"
mkdir -p "$STATE"
cd "$ROOT"  # the Ray head's workers and the deployments resolve relative paths (configs/, data/) from here
# The server keeps its own database (not the ephemeral one that `make run`/`make test` use).
export PREFECT_HOME="${GRPO_STACK_PREFECT_HOME:-$ROOT/.cache/prefect-server}" PREFECT_SERVER_ANALYTICS_ENABLED=false
export PREFECT_API_URL="http://127.0.0.1:$PORT/api" GRPO_PROJECT_DIR="$ROOT"
export GRPO_RAY_ADDRESS="127.0.0.1:$RAY_PORT"   # deployments/prefect.yaml puts it in cluster.ray_address
# Ray's token authentication, with a token of this stack's own that the head and every run the worker starts read.
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$STATE/ray_token"
[ -s "$RAY_AUTH_TOKEN_PATH" ] || (umask 077; "$BIN/python" -c "import secrets; print(secrets.token_hex(32))" \
  > "$RAY_AUTH_TOKEN_PATH")
# What `make` exports for a run (caches in the project, offline hub), for runs the worker starts outside make.
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$ROOT/.cache/torch_extensions}"
export VLLM_CACHE_ROOT="${VLLM_CACHE_ROOT:-$ROOT/.cache/vllm}" HF_HOME="${HF_HOME:-$ROOT/.cache/hf}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DS_BUILD_OPS=0 RAY_USAGE_STATS_ENABLED=0
export PREFECT_LOGGING_LEVEL="${PREFECT_LOGGING_LEVEL:-WARNING}"   # the flow's own lines reach the Logs tab anyway
# The server's task-run recorder commits events in batches (at most 2 s late), not one by one: see grpo_cli/commands.py.
export PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE="${PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE:-200}"
export PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL="${PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL:-2}"
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
    # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 keeps every Ray server on 127.0.0.1 (STACK.md); --block keeps the head
    # in this process group, so `down` stops exactly what `up` started.
    start ray-head env RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 "$BIN/ray" start --head --block \
      --node-ip-address=127.0.0.1 --port="$RAY_PORT" --num-cpus="$RAY_CPUS" --include-dashboard=false \
      --disable-usage-stats
    start prefect-worker "$BIN/prefect" worker start --pool "$POOL"
    start s3 "$BIN/python" -m grpo_core.infra.s3server "${GRPO_S3_DIR:-$ROOT/.cache/s3}" runs
    echo "Ray head: $GRPO_RAY_ADDRESS (deployment runs join it)"
    echo "Prefect UI: http://127.0.0.1:$PORT   run: PREFECT_API_URL=$PREFECT_API_URL $BIN/prefect deployment run 'grpo-train/tiny'"
    ;;
  down)
    for name in prefect-worker s3 ray-head prefect-server; do
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
    for name in prefect-server prefect-worker ray-head s3; do
      if running "$name"; then echo "$name: running (pid $(cat "$STATE/$name.pid"))"; else echo "$name: stopped"; fi
    done
    ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
