"""The one typed config of a run.

Every option lives in a section (``grpo_core/config/``: ``model``, ``data``, ``rollout``, ``algo``, ...)
with its bounds; ``GRPOConfig`` here puts them together, computes the derived quantities (batch shapes, the weight
transport's kind, the async window) in one place and checks the rules across sections when the config is built,
so a bad run fails before any engine starts. A preset (`algo.preset`) fills algorithm defaults; anything the user
sets explicitly still wins. Loading (YAML + `--set` overrides) is in
``grpo_core.config.loading``, the model folder check in ``grpo_core.config.model_folders``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator, model_validator

from grpo_core.config.inputs import DEFAULT_EVAL_SET, DataConfig, EvalConfig, EvalDatasetConfig, ModelConfig
from grpo_core.config.learning import AlgoConfig, CriticConfig, DistillConfig, RewardConfig, SFTConfig, TrainConfig
from grpo_core.config.resources import (CHAMPION, CheckpointConfig, ClusterConfig, GateConfig, LoggingConfig,
                                       RegistryConfig, StorageConfig, WeightsConfig)
from grpo_core.config.sampling import AtroposConfig, EndpointConfig, EnvConfig, RolloutConfig
from grpo_core.config.section import _Section
from grpo_core.config.placements import Placement, placement_of
from grpo_core.config.run_kinds import RunKind, run_kind
from grpo_core.config.run_names import MAX_RUN_NAME, RUN_NAME_ALPHABET, run_name_problem
from grpo_core.config.transport_kinds import transport_kind

if TYPE_CHECKING:
    from grpo_core.pipeline.async_window import AsyncWindow


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
    critic: CriticConfig | None = Field(
        default=None, description="PPO's value model, trained beside the policy (algo.advantage_estimator: gae; "
                                  "algo.preset: ppo sets both); None: no critic")
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
        """One folder name under storage.root (``grpo_core.config.run_names``); a template is checked once filled."""
        problem = run_name_problem(name)
        if problem is not None:
            raise ValueError(f"run_name={name!r}: {problem}")
        return name

    @property
    def kind(self) -> RunKind:
        """What kind of run this is (``grpo_core.config.run_kinds``: RL, SFT, distillation): ask it, never test the
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
    def policy_context(self) -> int:
        """Tokens one sequence of the samplers holds: a prompt and its answer (vLLM's max_model_len)."""
        return self.data.max_prompt_tokens + self.rollout.max_new_tokens

    @property
    def sampling_rounds(self) -> int:
        """The most rounds of prompts an iteration samples: 1, or 1 + algo.max_resample_times with dynamic
        sampling."""
        return 1 + (self.algo.max_resample_times if self.algo.filter_groups else 0)

    @property
    def critic_model_path(self) -> str | None:
        """The folder PPO's critic starts from: critic.path, else the policy's (None: no critic)."""
        return None if self.critic is None else self.critic.path or self.model.path

    @property
    def critic_lr(self) -> float | None:
        """The critic's peak learning rate: critic.lr, else train.lr (None: no critic)."""
        return None if self.critic is None else self.critic.lr or self.train.lr

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
        """What ``cluster.placement`` means (``grpo_core.config.placements``): ask it, never compare its name."""
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
        default (token TIS where advantages are per token, a critic's or a turn's: the async default masks rows by
        one advantage's sign), and a capped kind without a cap gets ``DEFAULT_TIS_CAP``."""
        a = self.algo
        kind = a.offpolicy
        if kind is None:
            stale = "tis" if a.per_token_advantages else DEFAULT_ASYNC_OFFPOLICY
            kind = "tis" if a.tis_cap is not None else stale if self.rollout.max_staleness > 0 else "none"
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
        self._check_critic()
        if self.algo.turn_credit != "episode" and self.env is None:
            raise ValueError(f"algo.turn_credit={self.algo.turn_credit} gives each turn of a multi-turn episode its "
                             f"own advantage: set env (multi-turn episodes)")
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

    def _check_critic(self) -> None:
        """A critic exactly when the advantages are GAE's."""
        if self.algo.uses_critic and self.critic is None:
            raise ValueError("algo.advantage_estimator='gae' learns a value function: set critic (e.g. critic: {}), "
                             "or use algo.preset: ppo, which sets both")
        if self.critic is not None and not self.algo.uses_critic:
            raise ValueError(f"critic is set but algo.advantage_estimator={self.algo.advantage_estimator!r} takes "
                             f"its baseline from each group: use advantage_estimator 'gae' (algo.preset: ppo), or "
                             f"remove critic")
        if self.algo.per_token_advantages and self.algo.offpolicy == "neg_adv_mask":
            raise ValueError("algo.offpolicy=neg_adv_mask masks sequences by the sign of one advantage per sequence; "
                             "a critic's or a turn's advantages are per token: choose another correction (tis, "
                             "icepop, ...)")

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
