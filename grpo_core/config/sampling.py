"""The sections of how a run samples: ``rollout``, the policy ``endpoint``, ``atropos``, multi-turn ``env``."""
from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from grpo_core.config.section import _Section


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
    """The policy endpoint (grpo_core/outside/endpoint/): an OpenAI-compatible API serving the run's current policy to
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
    """The run as an Atropos trainer (grpo_core/outside/atropos/): atroposlib's API server (started by the run, or joined)
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
