#!/usr/bin/env bash
# Start a local S3 server (SeaweedFS `weed mini`) on 127.0.0.1 for manual use.
# Prints the endpoint, credentials and the storage_options to paste into a config; Ctrl+C stops it.
#
#   infra/s3-server.sh                    data in .cache/s3, bucket "grpo", a free port
#   infra/s3-server.sh --port 8333 runs   fixed port, bucket "runs"
#
# Data and credentials (ids.json) persist in $GRPO_S3_DIR (default .cache/s3) across restarts;
# GRPO_S3_KEY / GRPO_S3_SECRET set the credentials of a fresh folder.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
dir="${GRPO_S3_DIR:-$root/.cache/s3}"
cd "$root"
exec "$python" -m grpo_core.infra.s3server "$dir" "$@"
