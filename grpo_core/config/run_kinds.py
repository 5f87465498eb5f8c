"""What kind of run a config describes, chosen here (``run_kind``) and nowhere else: reinforcement learning on the
policy's own sampled groups, supervised fine-tuning on conversations (``sft`` set), or on-policy distillation
(``distill`` set: RL whose sampled tokens a teacher grades).

A kind states what it means for the rest of the run, as a placement does for where the samplers run: which flow runs
it, what the learner minimises, the batch's size and its longest row, how a data row becomes tokens, what a run of it
needs besides the engines (a teacher), its tags in the Prefect UI, and its rules across the config's sections
(``check``). The flow, its tasks and the config's derived quantities ask the kind; none of them tests ``sft`` or
``distill`` itself. A new kind is one more class here and one more case in ``run_kind``.

Light on purpose (the standard library; the tokenizers imported where they are made):
``grpo_core.config`` imports this module.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from grpo_core.config import GRPOConfig
    from grpo_core.config import DistillConfig, SFTConfig


class RunKind:
    """Reinforcement learning on groups the policy samples (the default kind). Subclasses override what differs."""

    name: ClassVar[str] = "rl"
    flow: ClassVar[str] = "grpo-train"              # the Prefect flow that runs it
    objective: ClassVar[str] = "policy_gradient"    # grpo_core.algo.objective.OBJECTIVES
    cli: ClassVar[str] = "grpo train"                # the command that starts that flow
    samples: ClassVar[bool] = True                   # the policy samples the batch (else the data is the batch)
    described: ClassVar[str] = "an RL config (sft not set)"

    def wrong_flow(self, run_name: str, flow: str) -> str | None:
        """Why the flow named ``flow`` cannot run this kind (None: it can)."""
        if flow == self.flow:
            return None
        return f"run {run_name}: {self.described}: run it with `{self.cli}` (the {self.flow} flow), not {flow}"

    def rows_per_iteration(self, cfg: "GRPOConfig") -> int:
        """Rows of the train data an iteration draws (``PromptStream``'s batch)."""
        return cfg.rollout.prompts_per_iteration

    def batch_size(self, cfg: "GRPOConfig") -> int:
        """Sequences per iteration."""
        return cfg.rollout.prompts_per_iteration * cfg.rollout.samples_per_prompt

    def batch_words(self, cfg: "GRPOConfig") -> str:
        """What the batch size is made of, in the config's words (for a refusal)."""
        r = cfg.rollout
        return (f"rollout.prompts_per_iteration x rollout.samples_per_prompt = {r.prompts_per_iteration} x "
                f"{r.samples_per_prompt} = {self.batch_size(cfg)}")

    def sampler_context(self, cfg: "GRPOConfig") -> tuple[int, str]:
        """The tokens one sequence of the samplers holds (``GRPOConfig.policy_context``), and the fields that say
        so: the same for every kind (an SFT run's samplers evaluate)."""
        p, n = cfg.data.max_prompt_tokens, cfg.rollout.max_new_tokens
        return cfg.policy_context, f"data.max_prompt_tokens + rollout.max_new_tokens = {p} + {n} = {cfg.policy_context}"

    def longest_row(self, cfg: "GRPOConfig") -> tuple[int, str]:
        """The most tokens one trained row can hold, and the fields that say so: a sampled sequence."""
        return self.sampler_context(cfg)

    def row_limit(self, cfg: "GRPOConfig") -> int:
        """The most tokens a row of the train data may encode to (checked for every row before the run starts)."""
        return cfg.data.max_prompt_tokens

    def learner_temperature(self, cfg: "GRPOConfig") -> float:
        """What the learner divides the logits by: the sampling temperature, so that its logprobs are those of the
        policy that sampled."""
        return cfg.rollout.temperature

    def teacher_top_k_weight(self) -> float:
        """The weight of the forward KL to a teacher's top K in the learner's loss (0: no such term)."""
        return 0.0

    def encoder(self, cfg: "GRPOConfig", tokenizer: Any) -> Any:
        """What turns a train row into tokens: the prompt through the chat template (``PromptTokenizer``)."""
        from grpo_core.pipeline.prompts import PromptTokenizer

        d = cfg.data
        return PromptTokenizer(tokenizer, cfg.reward.type, d.system_prompt, d.max_prompt_tokens,
                               [t.model_dump() for t in d.few_shot])

    def teacher(self) -> str | None:
        """The model that grades sampled tokens, as the config names it (None: the kind has no teacher)."""
        return None

    def tags(self, cfg: "GRPOConfig") -> list[str]:
        """The kind's own tags in the Prefect UI."""
        return [f"preset:{cfg.algo.preset}"]

    def check(self, cfg: "GRPOConfig") -> None:
        """Raise ValueError when the config asks this kind for something it cannot do."""
        if cfg.rollout.samples_per_prompt < 2 and not cfg.algo.uses_critic:
            raise ValueError("rollout.samples_per_prompt must be >= 2: group-relative advantages need a group "
                             "(or a critic: algo.preset: ppo)")
        if cfg.data.format == "chat":
            raise ValueError("data.format=chat holds conversations to fine-tune on: set sft (e.g. sft: {}) for an "
                             "SFT run, or use format math/code for RL prompts")


class Distillation(RunKind):
    """On-policy distillation: RL on the policy's samples, each sampled token graded by a teacher."""

    name: ClassVar[str] = "distill"

    def __init__(self, distill: "DistillConfig"):
        self.distill = distill

    def teacher_top_k_weight(self) -> float:
        return self.distill.top_k_weight if self.distill.top_k > 0 else 0.0

    def teacher(self) -> str | None:
        return self.distill.teacher

    def check(self, cfg: "GRPOConfig") -> None:
        """The teacher's advantages are per token: KL in the reward (advantages rebuilt per sequence in the learner)
        would overwrite them, and a correction that masks by one advantage's sign per sequence cannot read them."""
        super().check(cfg)
        if cfg.algo.kl_in_reward:
            raise ValueError("distill is set with algo.kl_in_reward: the KL-shaped reward's advantages (per sequence) "
                             "would replace the teacher's per-token advantages; use algo.kl_coeff as a loss term")
        if cfg.algo.uses_critic or cfg.algo.turn_credit != "episode":
            raise ValueError("distill is set with per-token advantages of another source (algo.advantage_estimator="
                             "'gae' or algo.turn_credit=step_groups): the teacher's and theirs would each replace the "
                             "other's; choose one")
        if cfg.algo.offpolicy == "neg_adv_mask":
            raise ValueError("distill is set with algo.offpolicy=neg_adv_mask, which masks sequences by the sign of "
                             "one advantage per sequence; the teacher's advantages are per token: choose another "
                             "correction")


class SupervisedFineTuning(RunKind):
    """Supervised fine-tuning: each iteration trains on conversations of the train data, the loss on their assistant
    turns; nothing is sampled or scored."""

    name: ClassVar[str] = "sft"
    flow: ClassVar[str] = "grpo-sft"
    objective: ClassVar[str] = "sft"
    cli: ClassVar[str] = "grpo sft"
    samples: ClassVar[bool] = False
    described: ClassVar[str] = "the config sets sft (supervised fine-tuning)"

    def __init__(self, sft: "SFTConfig"):
        self.sft = sft

    def rows_per_iteration(self, cfg: "GRPOConfig") -> int:
        return self.sft.conversations_per_iteration

    def batch_size(self, cfg: "GRPOConfig") -> int:
        return self.sft.conversations_per_iteration

    def batch_words(self, cfg: "GRPOConfig") -> str:
        return f"sft.conversations_per_iteration = {self.batch_size(cfg)}"

    def longest_row(self, cfg: "GRPOConfig") -> tuple[int, str]:
        return self.sft.max_tokens, f"sft.max_tokens = {self.sft.max_tokens}"

    def row_limit(self, cfg: "GRPOConfig") -> int:
        return self.sft.max_tokens

    def learner_temperature(self, cfg: "GRPOConfig") -> float:
        """1: the loss is the data's likelihood under the model itself."""
        return 1.0

    def encoder(self, cfg: "GRPOConfig", tokenizer: Any) -> Any:
        """Conversations with the assistant-turn mask (``ConversationTokenizer``)."""
        from grpo_core.data.chat import ConversationTokenizer, end_of_turn_ids

        return ConversationTokenizer(tokenizer, cfg.reward.type, cfg.data.system_prompt, self.sft.max_tokens,
                                     end_of_turn_ids(cfg.model.path, tokenizer))

    def tags(self, cfg: "GRPOConfig") -> list[str]:
        return []

    def check(self, cfg: "GRPOConfig") -> None:
        """Conversations from the data (data.format chat), trained synchronously on nothing sampled: what needs
        sampled groups, rewards on them or a second source of rows is refused."""
        if cfg.data.format != "chat":
            raise ValueError(f"sft is set: data.train_path must hold conversations (data.format: chat), got "
                             f"data.format={cfg.data.format}")
        refused = [(cfg.env is not None, "env"), (cfg.endpoint is not None, "endpoint"),
                   (cfg.atropos is not None, "atropos"), (cfg.algo.filter_groups, "algo.filter_groups"),
                   (cfg.data.sampler != "epoch", f"data.sampler={cfg.data.sampler}"),
                   (cfg.rollout.max_staleness > 0, "rollout.max_staleness > 0"),
                   (bool(cfg.data.few_shot), "data.few_shot"), (cfg.algo.kl_coeff > 0, "algo.kl_coeff > 0"),
                   (cfg.train.ppo_epochs > 1, "train.ppo_epochs > 1"), (cfg.critic is not None, "critic"),
                   (cfg.data.eval_path is not None, "data.eval_path (list eval sets under eval.datasets)")]
        named = [name for bad, name in refused if bad]
        if named:
            raise ValueError(f"sft is set (supervised fine-tuning on conversations): {', '.join(named)} belong to RL "
                             f"runs; remove them")
        if cfg.distill is not None:
            raise ValueError("distill and sft are both set: on-policy distillation grades the student's own samples, "
                             "an SFT run samples none; run them as two stages (grpo sft, then grpo train)")


def run_kind(sft: "SFTConfig | None", distill: "DistillConfig | None") -> RunKind:
    """The kind the config's ``sft`` and ``distill`` sections make: the one place that looks at them."""
    if sft is not None:
        return SupervisedFineTuning(sft)
    if distill is not None:
        return Distillation(distill)
    return RunKind()
