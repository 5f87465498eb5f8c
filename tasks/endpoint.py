"""The policy endpoint of a run (``endpoint`` in the config): opened once the engines are up and hold the run's
weights, closed at the end; paused (``paused``) while the weights change or the engines are recreated."""
from __future__ import annotations

import json
import os
import secrets
from contextlib import contextmanager
from typing import Iterator

from grpo_core.cluster.fleet_policy import FleetPolicy
from grpo_core.outside.endpoint.groups import EpisodeGroups
from grpo_core.outside.endpoint.owner_file import write_owner_only
from grpo_core.outside.endpoint.recorder import EpisodeRecorder
from grpo_core.outside.endpoint.server import EndpointServer, EndpointSettings, PolicyEndpoint
from tasks.context import RunContext

ENDPOINT_FILE = "endpoint.json"


def open_endpoint(ctx: RunContext) -> EndpointServer:
    """Serve the run's policy; ``endpoint.json`` in the run folder says where (and the token, when the run made
    one: owner-readable only on a local run folder)."""
    from transformers import AutoTokenizer

    cfg, e = ctx.cfg, ctx.cfg.endpoint
    given = os.environ.get(e.token_env)
    token = given or secrets.token_urlsafe(24)
    settings = EndpointSettings(model_name=cfg.run_name, max_tokens=cfg.rollout.max_new_tokens,
                                temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, token=token,
                                wait_s=e.wait_s, max_abs_reward=e.max_abs_reward,
                                max_body_bytes=int(e.max_body_mb * 2**20))
    recorder = EpisodeRecorder(AutoTokenizer.from_pretrained(cfg.model.path), max_open=e.max_open_episodes)
    groups = EpisodeGroups(ctx.store, cfg.rollout.samples_per_prompt)
    policy = FleetPolicy(ctx.engines, cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens)
    server = EndpointServer(PolicyEndpoint(policy, recorder, settings, sink=groups), e.host, e.port).start()
    doc = {"url": server.url, "model": cfg.run_name, "token_env": e.token_env,
           "token": None if given else token, "group_size": cfg.rollout.samples_per_prompt}
    write_owner_only(ctx.store, ENDPOINT_FILE, json.dumps(doc, indent=1).encode())  # 0600 from its first byte
    print(f"policy endpoint on {server.url} (OpenAI API; token in {ctx.store.url(ENDPOINT_FILE)} or "
          f"${e.token_env}); finished episodes go to the inbox in groups of {cfg.rollout.samples_per_prompt}")
    return server


@contextmanager
def paused(ctx: RunContext, reason: str) -> Iterator[None]:
    """Outside callers wait (at most ``endpoint.wait_s``, then 503) while the block runs; nothing without an
    endpoint."""
    gate = ctx.endpoint.endpoint.gate if ctx.endpoint is not None else None
    if gate is not None:
        gate.close(reason)
    try:
        yield
    finally:
        if gate is not None:
            gate.reopen()


def close_endpoint(server: EndpointServer) -> None:
    endpoint = server.endpoint
    server.stop()
    left = endpoint.sink.incomplete() if endpoint.sink is not None else {}
    stats = endpoint.recorder.stats
    still_open = endpoint.recorder.open_episodes()  # a client that died mid-episode: never finished nor discarded
    shown = ", ".join(still_open[:20]) + (f" and {len(still_open) - 20} more" if len(still_open) > 20 else "")
    print(f"policy endpoint closed: {stats.calls} calls, {stats.later_turns} later turns of episodes "
          f"({stats.retokenized_differs} whose text, rendered again, would have given other tokens); "
          f"{stats.discarded} episode(s) discarded by their clients; "
          + (f"{len(still_open)} episode(s) left open by their clients, not trained on: {shown}; " if still_open
             else "no episode left open; ")
          + (f"groups left short of their episodes, not trained on: {left}" if left else "no group left short"))
