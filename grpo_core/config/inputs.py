"""The sections of what a run starts from: the policy (``model``, its LoRA) and the data (``data``, ``eval``)."""
from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from grpo_core.config.section import _Section


# The linear layers of a decoder block (Qwen2, Llama, Mistral names) that vLLM 0.32 serves LoRA adapters on.
# Adapters on the embedding or the output layer are refused: vLLM no longer serves lm_head LoRA, and the policy
# would then differ between learner and sampler.
LoraTarget = Literal["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# vLLM's max_lora_rank takes one of these sizes; the sampler asks for the smallest one >= model.lora.rank.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class LoraConfig(_Section):
    """LoRA (peft): the learner trains only low-rank adapters on the base model's linear layers, the samplers serve
    base + adapter (vLLM's LoRA), and each sync ships only the adapter. Absent: full fine-tuning."""

    rank: int = Field(default=8, ge=1, le=VLLM_LORA_RANKS[-1], description="r, the adapters' rank (vLLM serves "
                                                                           f"up to {VLLM_LORA_RANKS[-1]})")
    alpha: float = Field(default=16.0, gt=0.0, description="scaling: the update is alpha / rank * B @ A")
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description="dropout on the adapters' input in training")
    target_modules: list[LoraTarget] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        min_length=1, description="the linear layers that get an adapter")

    @model_validator(mode="after")
    def _unique_targets(self) -> "LoraConfig":
        if len(set(self.target_modules)) != len(self.target_modules):
            raise ValueError(f"model.lora.target_modules lists a module twice: {self.target_modules}")
        return self

    @property
    def vllm_max_rank(self) -> int:
        """vLLM's max_lora_rank for this adapter: the smallest size vLLM accepts that holds ``rank``."""
        return next(r for r in VLLM_LORA_RANKS if r >= self.rank)


class ModelConfig(_Section):
    path: str = Field(description="HF-format model folder (weights + tokenizer), loaded by transformers and vLLM")
    init_from: str | None = Field(
        default=None, description="start from another run's policy instead of model.path's weights: a run name or "
        "glob of run names under storage.root (the newest finished run's final/, else its latest checkpoint), "
        "'champion' (the model registry's champion, see registry), or an HF model folder; resolved once when the run "
        "starts and recorded in init_from.json. Nothing matching (no champion yet): model.path's weights (the first "
        "run of a schedule)")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="float32", description="what the engines compute in; auto: bfloat16 where the device computes it "
        "natively (CUDA, or a CPU with AVX-512 BF16 / AMX), else float32 (each engine decides on its own device). "
        "In bfloat16 the learner keeps float32 master weights, gradients and optimizer state (DeepSpeed)")
    lora: LoraConfig | None = Field(
        default=None, description="train LoRA adapters instead of all weights (peft); None: full fine-tuning")


class ChatTurn(_Section):
    """One turn of a worked example shown before every prompt (``data.few_shot``); ``tool``: a tool's output, as an
    environment would give it, between the assistant turn that called the tool and the next assistant turn."""

    role: Literal["user", "assistant", "tool"] = Field(description="who speaks: the user, the model, or a tool's "
                                                               "output (between two assistant turns)")
    content: str = Field(min_length=1, description="the turn's text")


def _check_few_shot(turns: list[ChatTurn], field: str) -> None:
    """Each example: a user turn, then the worked answer: an assistant turn, or assistant turns with the outputs of
    the tools they called between them (user, assistant, tool, ..., assistant)."""
    roles = "".join({"user": "U", "assistant": "A", "tool": "T"}[t.role] for t in turns)
    if not re.fullmatch(r"(UA(T+A)*)*", roles):
        raise ValueError(f"{field} must be pairs of turns, user then assistant (a question and its worked answer; "
                         f"an answer that calls tools: assistant, tool, ..., assistant), got roles "
                         f"{[t.role for t in turns]}")


class DataConfig(_Section):
    train_path: str = Field(description="a file (.jsonl, .parquet), a save_to_disk folder, a folder of such files "
                            "or a glob; folders and globs take the files present when the run starts "
                            "(recorded in data_files.json, which a resume reuses); required by every run: a run "
                            "whose groups all come from outside (atropos, endpoint.clients) reads and checks it at "
                            "the start but samples nothing from it")
    eval_path: str | None = Field(default=None, description="same forms as train_path")
    format: Literal["math", "code", "chat"] = Field(
        default="math", description="math: a prompt and a gold answer per row; code: a prompt and test_cases "
                                    "({inputs: [...], outputs: [...]}) per row, scored in the sandbox; chat (SFT "
                                    "runs, with sft set): a conversation per row whose assistant turns are trained "
                                    "on")
    prompt_key: str = Field(default="messages", description="the column holding the prompt: chat messages or a "
                                                            "string")
    answer_key: str = Field(default="gt_answer", description="the column holding the gold answer (math format; "
                                                             "the code format reads the test_cases column)")
    system_prompt: str | None = Field(
        default=None, description="None: the default system prompt of the reward type; '' for none at all")
    few_shot: list[ChatTurn] = Field(
        default_factory=list, description="worked examples as chat turns (user, assistant, ...; an answer that "
                                          "calls tools: assistant, tool, assistant) put after the system prompt and "
                                          "before every prompt's own messages: how a pretrained instruct model "
                                          "learns the answer format it is rewarded for")
    max_prompt_tokens: int = Field(default=512, ge=8, description="the longest prompt in tokens (system prompt and "
                                   "worked examples included); a longer one is an error naming its row (or skipped "
                                   "with on_bad_row: skip), found for every train row when the run starts; "
                                   "data.max_prompt_tokens + rollout.max_new_tokens is the policy's context (the "
                                   "samplers' max_model_len and the policy endpoint's: a call's prompt must leave one "
                                   "token of it for the answer)")
    shuffle: bool = Field(default=True, description="each pass over the train set in a fresh order seeded by (seed, "
                                                    "pass); false: file order")
    sampler: Literal["epoch", "difficulty_pool"] = Field(
        default="epoch", description="epoch: each pass over the train set in a fresh seeded order; difficulty_pool: "
                                     "the same order, passing over prompts whose last group was all right "
                                     "(pool_easy_skips times) or all wrong (pool_hard_skips times); its state is "
                                     "in every checkpoint")
    pool_easy_skips: int = Field(
        default=1, ge=0, description="difficulty_pool: turns (passes over the data) an all-right prompt is passed "
                                     "over; 0: never")
    pool_hard_skips: int = Field(
        default=1, ge=0, description="difficulty_pool: turns an all-wrong prompt is passed over; 0: never")
    on_bad_row: Literal["error", "skip"] = Field(
        default="error", description="a row that fails the checks: error (naming file, row and field) or skip it "
                                     "(listed in the run's skipped_rows.json and the log)")

    @model_validator(mode="after")
    def _few_shot_pairs(self) -> "DataConfig":
        _check_few_shot(self.few_shot, "data.few_shot")
        return self


class EvalDatasetConfig(_Section):
    """One named eval set: its file, how to read and score it, and what to measure on it.

    ``greedy``: one greedy response per prompt, its mean accuracy is ``eval/<name>/accuracy``. ``samples`` n > 0:
    n responses per prompt at the rollout temperature, giving ``eval/<name>/pass@k`` for each k of ``pass_k``
    (the unbiased estimator of Chen et al. 2021); without greedy, ``accuracy`` is the sampled responses' mean."""

    path: str = Field(description="jsonl, parquet or save_to_disk folder (local or fsspec URL)")
    reward_type: Literal["boxed", "think_answer_tags", "code"] | None = Field(
        default=None, description="how its responses are scored (accuracy only); None: reward.type")
    format: Literal["math", "code"] | None = Field(
        default=None, description="None: code for reward_type code, else math")
    prompt_key: str | None = Field(default=None, description="None: data.prompt_key")
    answer_key: str | None = Field(default=None, description="None: data.answer_key")
    system_prompt: str | None = Field(
        default=None, description="None: data.system_prompt if reward_type is the run's reward.type, else the "
                                  "default system prompt of reward_type; '' for none")
    few_shot: list[ChatTurn] | None = Field(
        default=None, description="None: data.few_shot if reward_type is the run's reward.type, else none")
    greedy: bool = Field(default=True, description="one greedy response per prompt; its mean accuracy is "
                                                   "eval/<name>/accuracy")
    samples: int = Field(default=0, ge=0, le=1024, description="sampled responses per prompt (0: none)")
    pass_k: list[int] | None = Field(
        default=None, description="k values of pass@k, each <= samples; None: 1 and samples")
    max_prompts: int | None = Field(default=None, ge=1, description="the first N prompts of the file")

    @model_validator(mode="after")
    def _measures(self) -> "EvalDatasetConfig":
        _check_few_shot(self.few_shot or [], "eval.datasets.<name>.few_shot")
        if not self.greedy and self.samples == 0:
            raise ValueError("an eval dataset needs greedy=true or samples > 0 (nothing would be measured)")
        if self.pass_k is not None:
            if not self.samples:
                raise ValueError(f"pass_k={self.pass_k} needs samples >= max(pass_k); samples is 0")
            bad = [k for k in self.pass_k if not 1 <= k <= self.samples]
            if bad:
                raise ValueError(f"pass_k values must lie in 1..samples={self.samples}, got {bad}")
        return self

    @property
    def ks(self) -> list[int]:
        """The k values of pass@k measured on this set (none without samples)."""
        if not self.samples:
            return []
        return sorted(set(self.pass_k if self.pass_k is not None else (1, self.samples)))


DEFAULT_EVAL_SET = "default"  # the name of the set that data.eval_path defines


class EvalConfig(_Section):
    interval: int = Field(default=5, ge=0, description="evaluate every N iterations (0: never); also before the first")
    greedy: bool = Field(default=True, description="data.eval_path's set: greedy (else samples_per_prompt samples)")
    max_prompts: int | None = Field(default=None, ge=1, description="data.eval_path's set: the first N prompts")
    samples_per_prompt: int = Field(default=1, ge=1, description="data.eval_path's set: samples when greedy=false")
    datasets: dict[str, EvalDatasetConfig] = Field(
        default_factory=dict, description="named eval sets (instead of data.eval_path), each with its reward type; "
                                          "metrics eval/<name>/accuracy and eval/<name>/pass@k; the first set's "
                                          "accuracy is also eval_accuracy")

    @model_validator(mode="after")
    def _names(self) -> "EvalConfig":
        import re

        bad = [n for n in self.datasets if not re.fullmatch(r"[A-Za-z0-9._-]+", n)]
        if bad:
            raise ValueError(f"eval.datasets names may hold letters, digits, '.', '_' and '-' only: {bad}")
        return self
