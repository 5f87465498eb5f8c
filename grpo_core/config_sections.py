"""The sections of a run's config (``model``, ``data``, ``rollout``, ``algo``, ``train``, ``cluster``, ...), each with
its fields' bounds and the rules within the section. ``grpo_core.config.GRPOConfig`` puts them together and checks
the rules across sections; import them from there.
"""
from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from grpo_core.placements import PLACEMENTS


class _Section(BaseModel):
    """A config section: unknown keys refused, assignments validated, and no float anywhere in it (a field, a tuple's,
    list's or dict's entry) may be NaN or infinite: every float of a run's config is a finite quantity (a rate, a
    weight, a bound, seconds), and NaN passes every ``ge``/``le`` bound unnoticed."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


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


class RolloutConfig(_Section):
    prompts_per_iteration: int = Field(default=16, ge=1, description="prompts per iteration; the batch is this x "
                                                                     "samples_per_prompt sequences")
    samples_per_prompt: int = Field(default=8, ge=1, description="G, the group size")
    max_new_tokens: int = Field(default=256, ge=1, description="the response budget in tokens (multi-turn: the "
                                                               "whole episode after the prompt)")
    temperature: float = Field(default=1.0, gt=0.0, le=10.0, description="sampling temperature; the logprobs "
                               "recorded are those of the distribution sampled from")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="nucleus sampling: the smallest set of tokens "
                         "whose probability reaches top_p")
    kv_cache_mb: int = Field(default=64, ge=8, description="vLLM KV cache on CPU, MiB")
    tensor_parallel_size: int = Field(default=1, ge=1, description="GPUs per vLLM engine (vLLM's own executor)")
    gpu_memory_utilization: float = Field(default=0.5, gt=0.0, le=1.0, description="on GPU: the share of the "
                                          "device vLLM may take (weights + KV cache); the learner needs the rest when "
                                          "colocated")
    enforce_eager: bool = Field(default=True, description="vLLM without CUDA graphs or torch.compile (faster start, "
                                                          "slower decoding on GPU)")
    share_prompt_prefill: bool = Field(
        default=True, description="compute each prompt's prefill once for its G samples (vLLM prefix caching, the "
                                  "cache emptied before each batch); on CPU the KV block size becomes 32")
    max_staleness: int = Field(
        default=0, ge=0, description="async RL (split placement): the rollout of iteration k+s is sampled while "
                                     "iteration k trains, so a batch is trained on at most s iterations after the "
                                     "weights that sampled it; 0: synchronous")
    inbox_max_staleness: int | None = Field(
        default=None, ge=0, description="iterations an inbox row (an outside producer's, the policy endpoint's "
                                        "episodes) may lag behind the learner, at least rollout.max_staleness "
                                        "(None: the same): outside episodes finish after they are sampled, and one "
                                        "that spans a weight update is as old as its first turn")

    @model_validator(mode="after")
    def _inbox_window(self) -> "RolloutConfig":
        if self.inbox_max_staleness is not None and self.inbox_max_staleness < self.max_staleness:
            raise ValueError(f"rollout.inbox_max_staleness={self.inbox_max_staleness} is below "
                             f"rollout.max_staleness={self.max_staleness}: inbox rows may be at least as old as the "
                             "run's own")
        return self


class EndpointConfig(_Section):
    """The policy endpoint (grpo_core/endpoint/): an OpenAI-compatible API serving the run's current policy to
    environments and agents written elsewhere; calls tagged with an episode id are recorded, and finished episodes,
    grouped, are trained on as inbox groups (``grpo_core.pipeline.inbox``)."""

    host: str = Field(default="127.0.0.1", description="address to listen on (loopback unless you mean it)")
    port: int = Field(default=0, ge=0, le=65535, description="0: a free port; the URL is in the run folder's "
                                                             "endpoint.json")
    token_env: str = Field(default="GRPO_ENDPOINT_TOKEN",
                           description="environment variable holding the bearer token clients must send; unset: "
                                       "a random token, written to endpoint.json (readable by its owner only)")
    wait_s: float = Field(default=30.0, gt=0.0, description="how long a call waits for a weight update to end "
                                                           "before it is refused (503, Retry-After)")
    max_open_episodes: int = Field(default=4096, ge=1, description="episodes in progress at once (one more is "
                                                                   "refused: 429 too_many_episodes); an episode "
                                                                   "neither finished nor discarded stays open until "
                                                                   "the run ends")
    clients: list[list[str]] = Field(
        default_factory=list, description="commands of programs the run starts once the endpoint serves, and starts "
                                          "again when one exits (an OpenEnv environment's driver, an agent): with "
                                          "clients, every group comes from their finished episodes. Placeholders "
                                          "{endpoint_url} (ending in /v1), {model_name} (the run's name, the model "
                                          "to send), {model_path}, {group_size}, {run_dir}, {log_dir}; the token "
                                          "reaches them as $OPENAI_API_KEY")
    client_restarts: int = Field(default=3, ge=0, description="times each client is started again after it exits, "
                                                              "before the run fails")
    groups_wait_s: float = Field(default=600.0, gt=0.0, description="with clients: how long an iteration waits "
                                                                     "for a new finished group before the run fails")
    max_abs_reward: float = Field(default=1e6, gt=0.0, le=1e30,
                                  description="|reward| an episode may finish with (and an Atropos group's scores "
                                              "may have); beyond it the call is refused (400, param reward), not "
                                              "clipped: rewards are O(1)-O(10), and a group's statistics stay far "
                                              "inside float32 below 1e6")
    max_body_mb: float = Field(default=8.0, gt=0.0, le=1024.0,
                               description="a request body larger than this is refused (413) before it is read (a "
                                           "128k-token context sent as token ids is about 1 MB)")


class AtroposConfig(_Section):
    """The run as an Atropos trainer (grpo_core/atropos/): atroposlib's API server (started by the run, or joined)
    and the environments' processes sample through the policy endpoint and send scored groups; every group the run
    trains on is pulled from the API's ``/batch``. Commands may use {api_url}, {api_port}, {endpoint_url} (the
    endpoint's base URL, ending in /v1), {model_name} (the run's name: the model clients send), {model_path},
    {group_size}, {run_dir} (the run folder, local runs) and {log_dir}; the endpoint's token reaches them as
    $OPENAI_API_KEY, never on a command line."""

    api_url: str | None = Field(default=None, description="an Atropos API server to join (None: the run starts "
                                                          "api_command and stops it at the end)")
    api_command: list[str] = Field(
        default_factory=lambda: [".venv-envs/bin/run-api", "--host", "127.0.0.1", "--port", "{api_port}"],
        description="how the run starts atroposlib's API server (`make envs` builds .venv-envs)")
    api_port: int = Field(default=0, ge=0, le=65535, description="the started API server's port (0: a free one)")
    envs: list[list[str]] = Field(default_factory=list, description="commands of environment processes the run "
                                                                     "starts, and starts again when one exits")
    env_restarts: int = Field(default=3, ge=0, description="times each environment is started again after it "
                                                           "exits, before the run fails")
    wait_s: float = Field(default=600.0, gt=0.0, description="how long an iteration waits for its groups "
                                                              "before the run fails with the queue's and the "
                                                              "environments' state")
    api_timeout_s: float = Field(default=60.0, gt=0.0, description="how long the API server may be unreachable "
                                                                   "(restarting) before the run fails")

    @model_validator(mode="after")
    def _reachable(self) -> "AtroposConfig":
        if self.api_url is None and not self.envs and self.api_port == 0:
            raise ValueError("atropos starts an API server on a free port with no environment of its own: nothing "
                             "could send it groups; list atropos.envs, give a fixed atropos.api_port for the "
                             "environments you start, or join a running server with atropos.api_url")
        return self


class EnvConfig(_Section):
    """Multi-turn rollouts: each sample is an episode of an environment (grpo_core/envs/). ``rollout.max_new_tokens``
    is then the budget of the whole episode after the prompt, the environment's tokens included."""

    kind: str = Field(default="tools", description="'tools' (the built-in tool-calling environment: calls as "
                                                   "<NAME>input</NAME>) or a user Environment class as "
                                                   "'module:Class' or 'path/to/file.py:Class'")
    args: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of a user environment class")
    tools: list[str] = Field(default_factory=lambda: ["calculator"],
                             description="kind 'tools': built-in 'calculator', 'python' (in the sandbox), or "
                                         "'module:Class' / 'file.py:Class' tool classes")
    tool_args: dict[str, dict[str, Any]] = Field(default_factory=dict,
                                                 description="keyword arguments per tool, by its entry in tools")
    tool_timeout_s: float = Field(default=10.0, gt=0.0, description="kind 'tools': one call; a late call's "
                                                                   "observation says it timed out")
    max_observation_chars: int = Field(default=1000, ge=16, description="kind 'tools': longer outputs are cut")
    max_calls_per_turn: int = Field(default=4, ge=1, description="kind 'tools'")
    max_turns: int | None = Field(default=None, ge=1, le=64,
                                  description="assistant turns per episode (None: the environment class's)")
    turn_tokens: int | None = Field(default=None, ge=1,
                                    description="tokens per assistant turn (None: rollout.max_new_tokens)")
    step_timeout_s: float = Field(default=60.0, gt=0.0, description="one environment step; a late step ends its "
                                                                   "episode (episode_end: env_timeout)")
    workers: int = Field(default=16, ge=1, description="environment steps run at once (threads in each sampler)")

    @model_validator(mode="after")
    def _kind_known(self) -> "EnvConfig":
        if self.kind != "tools" and ":" not in self.kind:
            raise ValueError(f"env.kind={self.kind!r}: 'tools' or a class as 'module:Class' / 'file.py:Class'")
        if self.kind == "tools" and not self.tools:
            raise ValueError("env.tools is empty: the tools environment needs at least one tool")
        unknown = sorted(set(self.tool_args) - set(self.tools))
        if unknown:
            raise ValueError(f"env.tool_args names {unknown}, which are not in env.tools={self.tools}")
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
    preset: Literal["grpo", "dapo", "dr_grpo", "gspo", "rloo"] = Field(
        default="grpo", description="fills the algorithm fields it names (table below) under your config: a field "
                                    "you set yourself wins")
    advantage_estimator: Literal["grpo", "dr_grpo", "rloo"] = Field(
        default="grpo", description="baseline: group mean (grpo, dr_grpo) or leave-one-out mean (rloo)")
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
        if self.kl_in_reward and self.kl_coeff == 0.0:
            raise ValueError("algo.kl_in_reward=true needs algo.kl_coeff > 0")
        low, high = self.offpolicy_band
        if not 0.0 < low <= 1.0 <= high:
            raise ValueError(f"algo.offpolicy_band must satisfy 0 < low <= 1 <= high (an on-policy token, ratio 1, "
                             f"is never masked), got {self.offpolicy_band}")
        return self


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
                                    "reach the policy (grpo_core/train/bf16_rounding.py); nearest: DeepSpeed's own; "
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


class RoleResources(_Section):
    """What one actor of a role reserves from Ray, and where it may run (custom resources pin it to nodes)."""

    num_cpus: float = Field(default=1.0, gt=0.0, description="Ray CPUs reserved (fractions allowed)")
    num_gpus: float = Field(default=0.0, ge=0.0, description="GPUs reserved (fractions share one GPU)")
    resources: dict[str, float] = Field(
        default_factory=dict, description="custom Ray resources, e.g. {sampler_node: 0.01} to pin to such nodes; "
                                          "amounts >= 0")
    torch_threads: int | None = Field(default=None, ge=1, description="threads inside the actor (default: all "
                                                                      "cores of its node)")

    @field_validator("resources")
    @classmethod
    def _amounts(cls, resources: dict[str, float]) -> dict[str, float]:
        negative = {k: v for k, v in resources.items() if v < 0}
        if negative:
            raise ValueError(f"custom resources are amounts >= 0, got {negative}")
        return resources


class ClusterConfig(_Section):
    placement: Literal["colocate", "split", "external"] = Field(
        default="colocate", description="colocate: each actor holds a sampler and a learner rank, weights move "
                                        "in-process; split: sampler actors and learner actors apart; external: "
                                        "samplers are OpenAI-compatible vLLM servers (cluster.servers), each driven "
                                        "by a light actor (cluster.sampler_resources)")
    samplers: int = Field(default=1, ge=1, description="vLLM engines, one Ray actor each (colocate: defaults to "
                                                       "cluster.learners)")
    learners: int = Field(default=1, ge=1, description="DeepSpeed data-parallel ranks, one Ray actor each")
    sampler_resources: RoleResources = Field(default_factory=RoleResources,
                                             description="what one sampler actor reserves (split and external "
                                                         "placement)")
    learner_resources: RoleResources = Field(
        default_factory=RoleResources, description="also what a colocated actor (sampler + learner) reserves")
    reward_resources: RoleResources = Field(
        default_factory=RoleResources, description="what one model-reward actor reserves (reward.models)")
    ray_address: str | None = Field(default=None, description="None: start a local Ray on 127.0.0.1")
    max_actor_restarts: int = Field(
        default=3, ge=0, description="times the flow recreates a dead engine actor from the latest checkpoint "
                                     "before it gives up")
    servers: list[str] = Field(
        default_factory=list, description="placement=external: base URLs of OpenAI-compatible vLLM servers started "
                                          "with `grpo serve` (e.g. http://127.0.0.1:8000), one sampler each")
    server_timeout_s: float = Field(
        default=120.0, gt=0.0, description="placement=external: seconds one HTTP request to a server may take "
                                           "before it is retried")
    server_retries: int = Field(
        default=2, ge=0, description="placement=external: retries of a request that timed out or could not "
                                     "connect; then the server counts as down and its share goes to the others")

    @model_validator(mode="before")
    @classmethod
    def _samplers_follow_placement(cls, data: Any) -> Any:
        """Colocated actors hold one sampler and one learner rank each: `cluster.learners=2` alone means two.
        External samplers are the listed servers."""
        if not isinstance(data, dict):
            return data
        placement = PLACEMENTS.get(data.get("placement", "colocate"))  # an unknown name: the field's own error
        samplers = placement().default_samplers(data) if placement is not None else None
        if "samplers" not in data and samplers is not None:
            data = {**data, "samplers": samplers}
        return data


class WeightsConfig(_Section):
    transport: Literal["auto", "inprocess", "broadcast", "files", "cuda_ipc"] = Field(
        default="auto", description="how new weights reach the samplers: inprocess (colocate), broadcast (split: "
                                    "learner rank 0 -> every sampler worker, gloo on CPU / NCCL on GPU), files "
                                    "(weights/v-N/ in the run store), cuda_ipc (same GPU, other process); auto: "
                                    "inprocess for colocate, broadcast for split, files for external")
    bucket_mb: int = Field(default=64, ge=1, description="broadcast: tensors travel packed in buckets of this size")
    check_samples: int = Field(
        default=4, ge=0, description="after a checked sync, every sampler's weights are compared with the "
                                     "learner's by digest (a sampler with other weights fails the run), and the "
                                     "logprob gap measured on this many rollout sequences of every sampler "
                                     "(metrics sync_logprob_*); 0: no check")
    check_every: int = Field(
        default=1, ge=1, description="run that check after every n-th iteration's sync (and the last); the "
                                     "version check before every rollout is never skipped")
    check_tolerance: float | None = Field(
        default=None, gt=0.0, description="optional bound on sync_logprob_max_diff: beyond it the run fails. None "
                                          "(default): no bound, the digests decide (bfloat16 engines differ by up "
                                          "to ~0.8 on a real model's rare tokens with identical weights)")


class StorageConfig(_Section):
    root: str = Field(default="runs", description="local folder or s3://bucket/prefix")
    options: dict[str, Any] = Field(default_factory=dict, description="fsspec options, e.g. client_kwargs")
    retries: int = Field(
        default=5, ge=0, le=20, description="Prefect retries of a stage whose run-folder I/O failed transiently "
                                            "(connection refused, timeout, object-store error)")
    retry_delay_s: float = Field(
        default=1.0, ge=0.0, le=600.0, description="delay before the first retry; doubles each time (1, 2, 4, 8, "
                                                   "16 s)")

    @property
    def retry_delays(self) -> list[float]:
        """Seconds to wait before each retry: exponential backoff."""
        return [self.retry_delay_s * 2**i for i in range(self.retries)]


class CheckpointConfig(_Section):
    interval: int = Field(
        default=10, ge=0, description="iterations between checkpoints (and always after the last one); "
                                      "0: none but the final policy")
    keep_last: int = Field(default=2, ge=0, description="complete checkpoints kept; 0 keeps all")


class LoggingConfig(_Section):
    """Where a run's figures and logs go besides metrics.parquet and the Prefect UI."""

    backends: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(
        default_factory=lambda: ["tensorboard"],
        description="metric sinks: tensorboard (event files in the run folder's tensorboard/, the default), wandb "
                    "and mlflow (when installed; offline unless WANDB_MODE / MLFLOW_TRACKING_URI say otherwise)")
    project: str = Field(default="grpo-flow", description="W&B project / MLflow experiment name")
    verbose: bool = Field(default=False, description="show the libraries' log lines (vLLM, DeepSpeed, Ray, "
                          "Prefect) on the terminal; otherwise they go to logs/ in the run folder (`grpo train -v`)")
    console_interval_s: float = Field(
        default=10.0, ge=0.0, le=3600.0,
        description="the Prefect UI's progress and metrics-table artifacts are published at most this often (and at "
                    "every evaluation and the run's end); 0: after every iteration. Each is a request carrying the "
                    "whole table")

    @model_validator(mode="after")
    def _unique(self) -> "LoggingConfig":
        if len(set(self.backends)) != len(self.backends):
            raise ValueError(f"logging.backends lists a backend twice: {self.backends}")
        return self


REGISTRY_FOLDER = "registry"  # under storage.root: the default home of the model registry
CHAMPION = "champion"         # model.init_from: the registry's champion


class RegistryConfig(_Section):
    """Where the champion and every gated challenger are recorded (``grpo registry show``). MLflow's model registry by
    default (the ``champion`` alias on a registered model), or a plain JSON document in a folder."""

    kind: Literal["mlflow", "folder"] = Field(
        default="mlflow", description="mlflow: MLflow's model registry (a SQLite store under storage.root, or "
                                      "registry.uri); folder: one registry.json in a folder (local or fsspec URL)")
    uri: str | None = Field(
        default=None, description="mlflow: a tracking URI (sqlite:///path.db, http://host:5000); folder: a folder "
                                  "or fsspec URL. None: storage.root/registry (mlflow: its mlflow.db)")
    name: str = Field(default="grpo-policy", pattern=r"^[A-Za-z0-9._-]+$",
                      description="the registered model: the lineage of policies one champion is chosen from")
    timeout_s: float = Field(
        default=10.0, gt=0.0, le=600.0,
        description="how long one request to a registry server may take (MLflow over HTTP) before the registry "
                    "counts as unavailable")


class GateConfig(_Section):
    """The eval gate at the end of a run: its final policy (the challenger) and the registry's champion are
    evaluated on the gate sets with the same prompts and seeds; the challenger becomes champion only if it wins.

    ``metric`` is a per-set figure of the eval sets (``accuracy``, or ``pass@k`` of a set with samples), averaged
    over the gate sets; promotion needs ``challenger - champion >= margin`` and, for each of ``guards``, a loss of
    at most its tolerance. Without a champion yet the challenger is promoted when it reaches ``min_value``."""

    sets: list[str] | None = Field(
        default=None, description="names of eval sets to gate on (eval.datasets, or 'default' for data.eval_path); "
                                  "None: every eval set")
    metric: str = Field(default="accuracy", pattern=r"^(accuracy|pass@[0-9]+)$",
                        description="the figure compared: accuracy or pass@k, the mean over the gate sets")
    margin: float = Field(default=0.02, ge=0.0, le=1.0,
                          description="the challenger must beat the champion by at least this much on metric")
    guards: dict[str, float] = Field(
        default_factory=dict, description="other figures (accuracy, pass@k) the challenger may lose by at most the "
                                          "given tolerance in [0, 1], e.g. {pass@8: 0.05}")
    min_value: float = Field(default=0.0, ge=0.0, le=1.0,
                             description="the first champion (no champion yet) needs metric >= this")

    @model_validator(mode="after")
    def _guards(self) -> "GateConfig":
        bad = [k for k in self.guards if not re.fullmatch(r"accuracy|pass@[0-9]+", k)]
        if bad:
            raise ValueError(f"gate.guards names {bad}: a guard is accuracy or pass@k")
        out_of_range = {k: v for k, v in self.guards.items() if not 0.0 <= v <= 1.0}
        if out_of_range:
            raise ValueError(f"gate.guards tolerances are in [0, 1] (accuracy and pass@k are), got {out_of_range}")
        if self.sets is not None and (not self.sets or len(set(self.sets)) != len(self.sets)):
            raise ValueError(f"gate.sets must name at least one set, each once: {self.sets}")
        return self

    @property
    def figures(self) -> list[str]:
        """The per-set figures the gate reads: metric, then the guarded ones."""
        return [self.metric] + [k for k in self.guards if k != self.metric]
