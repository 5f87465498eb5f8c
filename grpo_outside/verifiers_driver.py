"""Drive a run with a verifiers environment (verifiers 0.4, ``verifiers.v1``): G rollouts per task, sampled through
the run's policy endpoint and scored by the taskset's own rewards, finished into the task's group. Runs in
.venv-verifiers (verifiers pins ``openai<3`` and ``mcp==2.0.0``, which clash with both other locks; nothing of this
project is imported), started by the run as one of ``endpoint.clients``:

    .venv-verifiers/bin/python grpo_outside/verifiers_driver.py --base-url {endpoint_url} --model {model_name} \\
        --taskset arith_vf --path examples/verifiers --group-size {group_size}    # the token: $OPENAI_API_KEY

verifiers loads the taskset by its module name (its default harness and environment with it, as ``vf-eval`` does)
and runs each rollout behind its interception server, which relays every model call to the endpoint. Each
rollout's sampling carries ``episode_id`` (verifiers passes extra sampling keys into the request body), so the
endpoint records every call of that rollout as one episode, whatever program the harness runs. Once a rollout is
scored, ``POST /v1/episodes/<id>/finish`` hands over ``trace.reward`` (the weighted sum of the task's rewards) with
the group. A rollout that failed (a harness error, a timeout, no reward) is not trained on: its whole group is
discarded at the endpoint (``DELETE /v1/episodes/<id>``) and the reason printed.

The runtime is a local subprocess one (verifiers' default is a remote sandbox service). Only non-streamed chat
completions reach the endpoint: a harness that asks for ``stream: true`` is refused with the reason.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import uuid
from typing import Any

import httpx
import verifiers.v1 as vf
from client_common import group_prefix, wait_to_be_stopped
from verifiers.v1.runtimes import SubprocessConfig

TOKEN_ENV = "OPENAI_API_KEY"


def taskset_options(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs (a value that parses as JSON is taken as such) for the taskset's config."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--taskset-option {pair!r}: expected KEY=VALUE")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return options


class Driver:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.base_url = args.base_url.rstrip("/")
        os.environ.setdefault(TOKEN_ENV, "none")  # verifiers reads the key from the variable it is named
        self.env = vf.load_environment(vf.SingleAgentEnvConfig(
            taskset={"id": args.taskset, **taskset_options(args.taskset_option)},
            agent=vf.AgentConfig(runtime=SubprocessConfig())))
        self.tasks = list(self.env.taskset)
        if not self.tasks:
            raise SystemExit(f"taskset {args.taskset!r} has no tasks")
        self.client = vf.EvalClientConfig(base_url=self.base_url, api_key_var=TOKEN_ENV)
        self.prefix = group_prefix("verifiers")

    def context(self, episode_id: str) -> Any:
        """The rollout's model context: its sampling carries the episode id into every call's body."""
        extra = {} if self.args.temperature is None else {"temperature": self.args.temperature}
        return vf.ModelContext(model=self.args.model, client=self.client,
                               sampling=vf.SamplingConfig(episode_id=episode_id, **extra))

    async def group(self, task: Any, name: str, http: httpx.AsyncClient, limit: asyncio.Semaphore) -> list[float]:
        """The task's G rollouts, then their finishes (all of them, or none when one failed)."""
        ids = [f"{name}-{i}" for i in range(self.args.group_size)]

        async def rollout(slot: Any, episode_id: str) -> Any:
            async with limit:
                return await self.env.run_slot(slot, self.context(episode_id))

        episodes = await asyncio.gather(*(rollout(slot, eid) for slot, eid in
                                          zip(self.env.slots(task, self.args.group_size), ids)))
        failed = [(eid, reason) for eid, reason in ((eid, why(ep)) for eid, ep in zip(ids, episodes)) if reason]
        if failed:  # none of the group is trained on: its episodes are dropped, not left open at the endpoint
            for eid in ids:
                gone = await http.delete(f"{self.base_url}/episodes/{eid}")
                if gone.status_code != 404:  # 404: that rollout never reached the policy
                    gone.raise_for_status()
            print(f"{name}: discarded, {len(failed)} rollout(s) failed: {failed}", flush=True)
            return []
        rewards = [float(ep.traces[0].reward) for ep in episodes]
        for eid, reward in zip(ids, rewards):
            done = await http.post(f"{self.base_url}/episodes/{eid}/finish", json={"reward": reward, "group": name})
            done.raise_for_status()
        return rewards

    async def run(self) -> int:
        """Play tasks (``--tasks`` of them, or until stopped), ``concurrency // G`` groups in flight at once."""
        a = self.args
        rng = random.Random(a.seed if a.seed is not None else uuid.uuid4().int)
        limit = asyncio.Semaphore(a.concurrency)
        token = os.environ[TOKEN_ENV]
        played = 0

        async def player() -> None:
            nonlocal played
            while a.tasks is None or played < a.tasks:
                name, task = f"{self.prefix}-{played}", rng.choice(self.tasks)
                played += 1
                rewards = await self.group(task, name, http, limit)
                if rewards:
                    print(f"{name}: rewards {rewards}", flush=True)

        async with self.env.serving(), httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                                         timeout=60, trust_env=False) as http:
            await asyncio.gather(*(player() for _ in range(max(1, a.concurrency // a.group_size))))
        return played


def why(episode: Any) -> str | None:
    """Why a rollout cannot be trained on, or None."""
    if not episode.ok:
        errors = list(episode.errors) + [e for trace in episode.traces for e in trace.errors]
        stops = [trace.stop_condition for trace in episode.traces if trace.stop_condition]
        return "; ".join([f"{e.type}: {e.message}"[:300] for e in errors] + stops) or "not ok"
    if len(episode.traces) != 1:
        return f"{len(episode.traces)} traces (one agent, one trace expected)"
    if episode.traces[0].reward is None:
        return "not scored"
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base-url", required=True, help="the policy endpoint, e.g. http://127.0.0.1:PORT/v1")
    p.add_argument("--model", required=True, help="the model name the endpoint serves (the run's name)")
    p.add_argument("--taskset", required=True, help="the verifiers taskset's id (its importable module name)")
    p.add_argument("--path", action="append", default=[], help="a folder to import tasksets from (repeatable)")
    p.add_argument("--taskset-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a field of the taskset's config (repeatable; JSON values parsed)")
    p.add_argument("--group-size", type=int, required=True, help="rollouts per task (rollout.samples_per_prompt)")
    p.add_argument("--temperature", type=float, default=None, help="(default: the run's rollout.temperature)")
    p.add_argument("--concurrency", type=int, default=8, help="rollouts in flight at once")
    p.add_argument("--tasks", type=int, default=None, help="play this many tasks, then wait to be stopped "
                                                           "(default: play until stopped)")
    p.add_argument("--seed", type=int, default=None, help="the task order's seed (default: random)")
    args = p.parse_args(argv)
    sys.path[:0] = [os.path.abspath(folder) for folder in args.path]
    wait_to_be_stopped(asyncio.run(Driver(args).run()))


if __name__ == "__main__":
    sys.exit(main())
