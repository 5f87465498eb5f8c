"""The sections of what a run learns from and how: ``sft``, ``distill``, ``reward``, ``algo``, ``train``."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from grpo_core.config.section import _Section
from grpo_core.config.inputs import ChatTurn, _check_few_shot


class SFTConfig(_Section):
    """Supervised fine-tuning: every iteration trains on the next conversations of data.train_path (data.format:
    chat) with the loss on their assistant turns only, in the same learner, run folder, checkpoints and evaluation
    as RL; nothing is sampled but the evaluations."""
    conversations_per_iteration: int = Field(default=16, ge=1, description="the batch: conversations per "
                                             "iteration (train.mini_batch_size splits it into optimizer steps)")
    max_tokens: int = Field(default=1024, ge=8, description="the longest conversation in tokens (system prompt "
                            "included); a longer one is an error naming its file and row (or skipped with "
                            "data.on_bad_row: skip), found for every row when the run starts")


class DistillConfig(_Section):
    """On-policy distillation: the student (the policy) samples as in RL, a teacher model scores every sampled token,
    and the per-token advantage is the teacher's logprob minus the student's (the negative reverse KL per token),
    alone or with the verifiable reward's advantage mixed in by ``reward_weight``. The teacher runs in Ray actors of
    its own (``cluster.reward_resources`` each, placed like the reward models) and must share the policy's tokenizer."""

    teacher: str = Field(
        min_length=1, description="an HF model folder, or a run (name or glob under storage.root) whose policy "
                                  "teaches: its final/, else its latest checkpoint; resolved once per run and "
                                  "recorded in teacher.json (a resume keeps the same teacher)")
    system_prompt: str | None = Field(
        default=None, description="the teacher's own system prompt (None: data.system_prompt); with few_shot, "
                                  "setting either gives the teacher a context of its own, rendered from each row's "
                                  "messages, instead of the student's prompt tokens")
    few_shot: list[ChatTurn] | None = Field(
        default=None, description="worked examples in the teacher's context only (None: data.few_shot): the "
                                  "student learns to answer as the teacher does with them in view")
    reward_weight: float = Field(default=0.0, ge=0.0, description="weight of the verifiable reward's advantage "
                                 "added to every token's distillation advantage; 0: distillation alone")
    top_k: int = Field(default=0, ge=0, le=64, description="0: the sampled token's signal only; K > 0: the teacher "
                       "also returns its K most likely tokens at every response position, and the loss adds "
                       "top_k_weight x the forward KL from the teacher's top-K (renormalised) to the student there")
    top_k_weight: float = Field(default=1.0, ge=0.0, description="weight of the top-K forward KL term in the loss "
                                "(with top_k > 0)")
    replicas: int = Field(default=1, ge=1, description="teacher actors; a batch is split between them")
    batch_size: int = Field(default=16, ge=1, description="rows per teacher forward pass")

    @property
    def own_context(self) -> bool:
        """Whether the teacher's prompts are rendered with its own system prompt / worked examples (else it reads
        the student's prompt tokens as they are)."""
        return self.system_prompt is not None or self.few_shot is not None

    @model_validator(mode="after")
    def _few_shot_pairs(self) -> "DistillConfig":
        _check_few_shot(self.few_shot or [], "distill.few_shot")
        return self


class ModelRewardConfig(_Section):
    """A reward given by a model (``reward.models.<name>``; use ``<name>`` in ``reward.rewards``): a sequence-
    classification reward model, a generative judge on a vLLM engine of its own, or a judge behind an
    OpenAI-compatible server. Its score is the component ``reward_<name>``, weighted like the rule rewards."""

    kind: Literal["classifier", "judge", "remote"] = Field(
        description="classifier: an HF AutoModelForSequenceClassification folder with one output (scalar head); "
                    "judge: a chat model folder run by vLLM in the reward actors; remote: an OpenAI-compatible "
                    "server (`grpo serve` or any vLLM server) at url")
    path: str | None = Field(default=None, description="classifier and judge: the model folder")
    url: str | None = Field(default=None, description="remote: base URL of the server, e.g. http://127.0.0.1:8000")
    served_model: str | None = Field(default=None, description="remote: the model name to ask for (None: the "
                                                               "server's first in /v1/models)")
    batch_size: int = Field(default=32, ge=1, description="rows per forward pass (classifier) or per request "
                                                         "batch (judges)")
    replicas: int = Field(default=1, ge=1, description="Ray actors of this model (cluster.reward_resources each); "
                                                      "a batch is split between them")
    max_length: int = Field(default=1024, ge=8, description="classifier: the longest (prompt, response) in tokens, "
                                                          "a longer row is recorded as unscored, never cut; judge: "
                                                          "its engine's max_model_len (at most the model's)")
    normalize: Literal["none", "sigmoid"] = Field(
        default="none", description="classifier: the head's raw score, or its sigmoid (a probability in [0, 1])")
    template: str = Field(
        default="Question: {question}\nResponse: {response}\nRate the response from {low:g} to {high:g}. "
                "Answer with the number only.",
        description="judges: the user message sent to the judge; {question} (the prompt's last user turn), "
                    "{response}, {answer} (the row's gold answer, if any), {low}, {high}")
    verdict: Literal["number", "yes_no"] = Field(
        default="number", description="judges: a number in score_range, mapped to [0, 1]; or yes/no, scored with "
                                      "P(yes) / (P(yes) + P(no)) from the first token's top logprobs")
    score_range: tuple[float, float] = Field(default=(0.0, 10.0), description="judges: what a number verdict may be")
    max_tokens: int = Field(default=16, ge=1, description="judges: tokens of the verdict")
    timeout_s: float = Field(default=60.0, gt=0.0, description="remote: seconds one request may take")
    retries: int = Field(default=2, ge=0, description="remote: retries of a request that timed out or failed to "
                                                      "connect; then its rows are recorded as unscored")

    @model_validator(mode="after")
    def _source_given(self) -> "ModelRewardConfig":
        if self.kind in ("classifier", "judge") and not self.path:
            raise ValueError(f"a {self.kind} reward needs path (the model folder)")
        if self.kind == "remote" and not self.url:
            raise ValueError("a remote judge needs url (the server's base URL)")
        low, high = self.score_range
        if not low < high:
            raise ValueError(f"score_range must be (low, high) with low < high, got {self.score_range}")
        return self


class RewardConfig(_Section):
    type: Literal["boxed", "think_answer_tags", "code"] = Field(
        default="boxed", description="how the accuracy reward reads a response: the last \\boxed{} (math-verify), "
                                     "the last <answer> tag, or the last fenced python block run against the row's "
                                     "tests in the sandbox")
    rewards: list[str] = Field(default_factory=lambda: ["accuracy"], min_length=1, description=(
        "reward components summed into the reward: accuracy, format, cosine, repetition, env (the environment's "
        "episode reward), a plugin as 'module:function' or 'file.py:function', or a name in reward.models"))
    weights: list[float] | None = Field(default=None, description="one weight per entry of rewards (None: all 1); "
                                                                 "weight 0 records a component without training on it")
    num_workers: int = Field(default=2, ge=1, description="scoring processes")
    timeout_s: float = Field(default=5.0, gt=0.0, description="per-response time budget for verification")
    dedupe: bool = Field(default=True, description="verify identical (response, row) pairs of a batch once; turn off "
                                                   "for a reward plugin that is not a function of them")
    options: dict[str, Any] = Field(
        default_factory=dict, description="reward options: cosine/repetition/soft_overlong parameters, plugins")
    models: dict[str, ModelRewardConfig] = Field(
        default_factory=dict, description="model rewards by name (reward models, judges); each name used in rewards")

    @model_validator(mode="after")
    def _weights_match(self) -> "RewardConfig":
        if self.weights is not None and len(self.weights) != len(self.rewards):
            raise ValueError(
                f"reward.weights has {len(self.weights)} entries but reward.rewards has {len(self.rewards)}: "
                "give one weight per reward")
        unused = sorted(set(self.models) - set(self.rewards))
        if unused:
            raise ValueError(f"reward.models {unused} not used: add each name to reward.rewards (with its weight)")
        return self


class AlgoConfig(_Section):
    """The algorithm of a run (advantages, policy loss, KL, filters, off-policy correction).

    Every field maps onto an argument of a function in `grpo_core.algo`; docs/algorithms.md
    lists them with the preset that sets each. Defaults are the "grpo" preset's values.
    """
    preset: Literal["grpo", "dapo", "dr_grpo", "gspo", "rloo", "ppo"] = Field(
        default="grpo", description="fills the algorithm fields it names (table below) under your config: a field "
                                    "you set yourself wins")
    advantage_estimator: Literal["grpo", "dr_grpo", "rloo", "gae"] = Field(
        default="grpo", description="baseline: group mean (grpo, dr_grpo), leave-one-out mean (rloo), or a learned "
                                    "value per token (gae: PPO's critic, the critic section; whitened over the "
                                    "batch)")
    gae_gamma: float = Field(default=1.0, ge=0.0, le=1.0, description="gae: the discount per token")
    gae_lambda: float = Field(default=1.0, ge=0.0, le=1.0, description="gae: GAE's lambda (1: the return minus "
                                                                       "V(s_t); lower: more of the critic's "
                                                                       "bootstrapped values)")
    advantage_scale: Literal["group_std", "batch_std", "none"] | None = Field(
        default=None, description="divide centred rewards by the unbiased group/batch std; None: the estimator's "
                                  "default (grpo: group_std, dr_grpo and rloo: none)")
    ratio_level: Literal["token", "sequence"] = Field(
        default="token", description="importance ratio per token (PPO/GRPO) or per sequence (GSPO)")
    clip_eps_low: float = Field(default=0.2, ge=0.0, lt=1.0, description="ratio clipped below at 1 - clip_eps_low")
    clip_eps_high: float = Field(default=0.2, ge=0.0, le=10.0, description="ratio clipped above at 1 + clip_eps_high")
    dual_clip: float | None = Field(default=None, gt=1.0, description="c of dual clip for negative advantages")
    skip_threshold: float | None = Field(
        default=None, gt=1.0, description="tokens (sequences at ratio_level=sequence) whose ratio exceeds it get no "
                                          "loss")
    loss_agg_mode: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"] = \
        Field(default="seq_mean_token_mean", description="how per-token losses become one scalar")
    loss_norm_length: int | None = Field(
        default=None, ge=1, description="Dr.GRPO's constant for seq_mean_token_sum_norm; None: max_new_tokens")
    kl_coeff: float = Field(default=0.0, ge=0.0, description="weight of the KL to the reference model (0: no ref)")
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        default="k3", description="per-token KL estimate with d = log pi - log pi_ref: k1 = d, k2 = d^2 / 2, "
                                  "k3 = exp(-d) + d - 1")
    kl_in_reward: bool = Field(default=False, description="subtract kl_coeff * sequence KL from the reward instead "
                                                          "of adding a KL loss")
    entropy_coeff: float = Field(default=0.0, ge=0.0, description="entropy bonus weight (loss -= coeff * entropy)")
    filter_groups: bool = Field(default=False, description="DAPO dynamic sampling")
    filter_range: tuple[float, float] = Field(
        default=(0.0, 1.0), description="keep groups whose success rate p satisfies low < p < high (exclusive)")
    max_resample_times: int = Field(
        default=0, ge=0, description="extra sampling rounds to fill a filtered batch (at most 1 + this many)")
    overlong_filter: bool = Field(default=False, description="mask truncated responses out of the loss")
    soft_overlong: bool = Field(default=False, description="DAPO soft overlong punishment added to the reward "
                                                           "(outside groups' too, by response_length: every token "
                                                           "after the prompt)")
    soft_overlong_cache_length: int = Field(
        default=0, ge=0, description="tokens before max_new_tokens where the penalty ramps; 0: max_new_tokens // 5")
    soft_overlong_penalty: float = Field(default=1.0, ge=0.0, description="penalty at and beyond max_new_tokens")
    offpolicy: Literal["none", "tis", "seq_tis", "icepop", "seq_mis", "geo_mask", "neg_adv_mask", "decoupled"] | None \
        = Field(default=None,
                description="correction between sampler and learner (grpo_core.algo.offpolicy_weights): tis (token "
                            "weights min(rho, tis_cap)), seq_tis (the row's product of ratios, capped), icepop (token "
                            "rho kept inside offpolicy_band, else masked), seq_mis (the row's product kept inside "
                            "the band, else the row masked), geo_mask (rows whose geometric-mean ratio leaves the "
                            "band masked), neg_adv_mask (DeepSeek-V3.2: negative-advantage rows whose mean log "
                            "pi_sampler/pi_learner exceeds offpolicy_kl_threshold masked), decoupled (AReaL: tokens "
                            "beyond tis_cap masked), none; null: tis when tis_cap is set, else neg_adv_mask when "
                            "rollout.max_staleness > 0, else none")
    tis_cap: float | None = Field(
        default=None, gt=0.0, description="cap of the importance weight for offpolicy tis, seq_tis and decoupled "
                                          "(null: 2.0)")
    offpolicy_band: tuple[float, float] = Field(
        default=(0.5, 2.0), description="(low, high) ratio band of offpolicy icepop, seq_mis and geo_mask; "
                                        "0 < low <= 1 <= high")
    offpolicy_kl_threshold: float = Field(
        default=0.1, gt=0.0, description="nats per token above which offpolicy neg_adv_mask masks a "
                                         "negative-advantage row")

    turn_credit: Literal["episode", "step_groups"] = Field(
        default="episode", description="multi-turn episodes (env): every turn takes its episode's advantage "
                                       "(episode), or also a step-level one (step_groups: GiGPO; the turns of the "
                                       "group's episodes taken from the same state compared by their discounted "
                                       "returns)")
    turn_credit_weight: float = Field(default=1.0, ge=0.0, description="step_groups: weight of the step-level "
                                                                       "advantage added to the episode's")
    turn_discount: float = Field(default=0.95, ge=0.0, le=1.0, description="step_groups: discount per turn of a "
                                                                          "turn's return (GiGPO's 0.95)")

    @model_validator(mode="after")
    def _ranges(self) -> "AlgoConfig":
        lo, hi = self.filter_range
        if not 0.0 <= lo < hi <= 1.0:
            raise ValueError(f"algo.filter_range must satisfy 0 <= low < high <= 1 (both bounds exclusive), "
                             f"got {self.filter_range}")
        if self.advantage_estimator == "dr_grpo" and self.advantage_scale not in (None, "none"):
            raise ValueError(f"algo.advantage_estimator='dr_grpo' divides by no std, but algo.advantage_scale="
                             f"{self.advantage_scale!r}; set advantage_scale to 'none' or use advantage_estimator="
                             "'grpo'")
        if self.uses_critic and self.advantage_scale not in (None, "none"):
            raise ValueError(f"algo.advantage_estimator='gae' (PPO's critic) whitens its per-token advantages over "
                             f"the batch; algo.advantage_scale={self.advantage_scale!r} (yours or algo.preset="
                             f"{self.preset}'s) does not apply: use algo.preset: ppo, or set advantage_scale: null")
        if self.uses_critic and self.filter_groups:
            raise ValueError("algo.filter_groups (dynamic sampling) drops groups whose answers all score alike, "
                             "which have no group-relative signal; with a critic (advantage_estimator='gae') every "
                             "answer has one: turn filter_groups off")
        if self.uses_critic and self.turn_credit != "episode":
            raise ValueError("algo.turn_credit=step_groups with a critic (advantage_estimator='gae'): the critic's "
                             "values already give every token its own advantage; choose one")
        if self.kl_in_reward and self.kl_coeff == 0.0:
            raise ValueError("algo.kl_in_reward=true needs algo.kl_coeff > 0")
        low, high = self.offpolicy_band
        if not 0.0 < low <= 1.0 <= high:
            raise ValueError(f"algo.offpolicy_band must satisfy 0 < low <= 1 <= high (an on-policy token, ratio 1, "
                             f"is never masked), got {self.offpolicy_band}")
        return self


    @property
    def uses_critic(self) -> bool:
        """Whether advantages come from a learned value function (PPO's GAE, computed by the learner) rather than
        from each answer's group (computed when the batch is scored)."""
        return self.advantage_estimator == "gae"

    @property
    def per_token_advantages(self) -> bool:
        """Whether each token has an advantage of its own (a critic's, or a turn's with step_groups) rather than its
        answer's one: what a correction reading one advantage's sign per row cannot take."""
        return self.uses_critic or self.turn_credit != "episode"


class CriticConfig(_Section):
    """PPO's value model (``algo.advantage_estimator: gae``, set by ``algo.preset: ppo``): a causal LM's decoder with
    a scalar head (transformers' ``AutoModelForTokenClassification``, one label, as verl's critic), trained in the
    learner ranks beside the policy with an optimizer, checkpoint and resume of its own."""

    path: str | None = Field(default=None, description="the model folder the critic starts from (its head is new "
                                                       "unless the folder has one), over the policy's tokenizer (checked "
                                                       "before any engine starts); None: model.path, the policy's")
    lr: float | None = Field(default=None, gt=0.0, le=1.0, description="the critic's peak learning rate (AdamW, "
                             "the policy's schedule, warm-up and betas); None: train.lr")
    value_clip: float | None = Field(default=0.5, gt=0.0, description="a prediction may move this far from the "
                                     "value it had before the update before the clipped term takes over (verl's "
                                     "cliprange_value); None: the plain squared error")


class TrainConfig(_Section):
    lr: float = Field(default=1e-5, gt=0.0, le=1.0, description="peak learning rate (AdamW)")
    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0, description="AdamW's decoupled weight decay (each "
                                "step scales the weights by 1 - lr x weight_decay)")
    betas: tuple[float, float] = Field(default=(0.9, 0.999), description="AdamW's (beta1, beta2), each in [0, 1)")
    warmup_steps: int = Field(default=0, ge=0, description="optimizer steps of linear warm-up up to lr")
    lr_schedule: Literal["constant", "cosine", "linear"] = Field(
        default="constant", description="after warm-up: constant, or cosine / linear decay to 0 over the run's "
                                        "optimizer steps (iterations x optimizer_steps_per_iteration)")
    grad_clip: float | None = Field(default=1.0, gt=0.0, description="largest gradient norm (clipped to it); "
                                                                     "None: no clipping")
    mini_batch_size: int | None = Field(
        default=None, ge=1, description="sequences per optimizer step; None: the whole batch in one step")
    micro_batch_size: int = Field(default=64, ge=1, description="sequences per forward/backward (unless "
                                                               "max_tokens_per_microbatch is set)")
    max_tokens_per_microbatch: int | None = Field(
        default=None, ge=2, description="micro-batches by tokens instead of a row count (verl's use_dynamic_bsz): "
                                        "with pack_prompts, each rank's groups (cut where one does not fit), "
                                        "largest first, fill micro-batches of at most this many packed tokens (each "
                                        "prompt once, no padding); without, rows longest first, at most this many "
                                        "padded tokens (rows x the longest row). The step is the same. Must hold "
                                        "the longest row: data.max_prompt_tokens + rollout.max_new_tokens. None: "
                                        "micro_batch_size rows each")
    ppo_epochs: int = Field(default=1, ge=1, description="passes over each batch (num_iterations in TRL)")
    zero_stage: Literal["auto", 0, 1, 2, 3] = Field(
        default="auto", description="DeepSpeed ZeRO stage; auto: 2 with several learner ranks; with one, 0 in float32 "
                                    "(nothing to partition: stage 2 cost 15% of the reference workload's train step) "
                                    "and 1 in bfloat16 (DeepSpeed's BF16 optimizer: float32 master weights and "
                                    "gradient accumulation)")
    bf16_rounding: Literal["auto", "nearest", "stochastic"] = Field(
        default="auto", description="in bfloat16: how the float32 master weights become the bf16 weights the engines "
                                    "compute with after each step. stochastic (DeepSpeed's BF16 optimizer, ZeRO 0-1): "
                                    "unbiased, so updates far below a bf16 step (RL's small learning rates) still "
                                    "reach the policy (grpo_core/engine/train/bf16_rounding.py); nearest: DeepSpeed's own; "
                                    "auto: stochastic where the BF16 optimizer runs, else nearest")
    fused_kernels: bool = Field(
        default=False, description="on CUDA: Liger's Triton kernels for RMSNorm, RoPE and SwiGLU in the learner "
                                   "(needs liger-kernel, the [gpu] extra); no effect on CPU")
    pack_prompts: bool = Field(
        default=True, description="each micro-batch as one packed row without padding: each group's prompt once, "
                                  "then its responses, groups end to end, positions restarting per sequence; "
                                  "attention per group or per sequence (segment attention), whichever costs less. "
                                  "Same logprobs and gradients as the padded rows (not under ZeRO-3)")
    logits_chunk_mb: float = Field(
        default=128.0, gt=0.0, le=65536.0,
        description="the output layer runs only at response tokens, this many MiB of float32 logits at a time "
                    "(forward, and again in backward): the [batch, length, vocabulary] logits never exist at once "
                    "(not under ZeRO-3, whose forward must run whole)")
    gradient_checkpointing: bool = Field(
        default=False, description="recompute each decoder layer's activations in backward instead of keeping them "
                                   "(transformers' gradient checkpointing): less memory for longer sequences or "
                                   "larger micro-batches, about a third more compute")

    @field_validator("betas")
    @classmethod
    def _betas(cls, betas: tuple[float, float]) -> tuple[float, float]:
        """Each beta is a moving average's decay: 1 or more would never forget (or grow without bound)."""
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"AdamW's betas are each in [0, 1), got {betas}")
        return betas


def zero_stage_for(train: TrainConfig, ranks: int, dtype: str = "float32") -> int:
    """The ZeRO stage the learner runs with `ranks` data-parallel ranks: ``train.zero_stage``, or for "auto" 2 with
    several ranks, and with one 0 in float32 (nothing to partition) and 1 in bfloat16: DeepSpeed's BF16 optimizer
    (float32 master weights, gradients accumulated in float32 over the micro-batches) needs stage 1; at stage 0 it
    would accumulate bf16 gradients."""
    if train.zero_stage != "auto":
        return train.zero_stage
    if ranks > 1:
        return 2
    return 1 if dtype == "bfloat16" else 0
