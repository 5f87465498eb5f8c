#!/usr/bin/env bash
# tinker-cookbook's own recipes, unmodified, against `grpo tinker serve` (make run-tinker):
#   examples/tinker/run.sh MODEL_DIR RL_STEPS SL_STEPS
# Starts the service on MODEL_DIR (a run folder runs/tinker-<time>), then runs the cookbook's math_rl recipe
# (env=arithmetic, its problems made locally) and its chat_sl recipe on the conversations file that ships in the
# cookbook's wheel, both from .venv-tinker, with only command-line arguments: the server's url, the local model folder,
# the renderer that fits a ChatML template (qwen3_instruct), small batch sizes for a CPU. Their logs and metrics go
# under the run folder (cookbook-rl/, cookbook-sl/); the service's own records beside them.
set -euo pipefail
model=$(cd "$1" && pwd) rl_steps=${2:-20} sl_steps=${3:-10}
root=runs/tinker-$(date +%Y%m%d-%H%M%S)
mkdir -p "$root"
export GRPO_TINKER_API_KEY=tml-$(python3 -c 'import secrets; print(secrets.token_urlsafe(18))')
.venv/bin/grpo tinker serve --model "$model" --root "$root" --port 0 --max-lora-rank 32 --max-model-len 1024 \
    >"$root/service.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 300); do [[ -f $root/service.json ]] && break; kill -0 $server 2>/dev/null || { cat "$root/service.log"; exit 1; }; sleep 1; done
url=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['url'])" "$root/service.json")
echo "==> the service: $url ($root/service.log)"
export TINKER_API_KEY=$GRPO_TINKER_API_KEY TINKER_TELEMETRY=0
conversations=$(.venv-tinker/bin/python -c 'import os, tinker_cookbook; print(os.path.join(os.path.dirname(tinker_cookbook.__file__), "example_data", "conversations.jsonl"))')

echo "==> tinker_cookbook.recipes.math_rl.train (env=arithmetic, $rl_steps steps)"
.venv-tinker/bin/python -m tinker_cookbook.recipes.math_rl.train base_url="$url" model_name="$model" \
    renderer_name=qwen3_instruct env=arithmetic loss_fn=importance_sampling lora_rank=32 group_size=4 \
    groups_per_batch=16 max_tokens=8 learning_rate=5e-4 max_steps="$rl_steps" save_every=10 eval_every=0 \
    log_path="$root/cookbook-rl" behavior_if_log_dir_exists=delete >"$root/cookbook-rl.log" 2>&1
echo "==> tinker_cookbook.recipes.chat_sl.train (the cookbook's conversations.jsonl, $sl_steps steps)"
.venv-tinker/bin/python -m tinker_cookbook.recipes.chat_sl.train base_url="$url" model_name="$model" \
    renderer_name=qwen3_instruct dataset="$conversations" lora_rank=32 batch_size=16 max_length=512 \
    learning_rate=5e-4 max_steps="$sl_steps" save_every=0 log_path="$root/cookbook-sl" \
    behavior_if_log_dir_exists=delete >"$root/cookbook-sl.log" 2>&1
.venv/bin/python examples/tinker/curves.py "$root"
