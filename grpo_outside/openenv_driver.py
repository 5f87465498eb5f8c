"""Drive a run with an OpenEnv environment: G episodes per task, each sampled through the run's policy endpoint and
rewarded by the environment, finished into the task's group. Runs in .venv-envs (openenv-core, the ``openai`` SDK;
nothing of this project is imported), started by the run as one of ``endpoint.clients``:

    .venv-envs/bin/python grpo_outside/openenv_driver.py --base-url {endpoint_url} --model {model_name} \\
        --env examples/openenv/arith_env.py:make_env --action examples/openenv/arith_env.py:ArithAction \\
        --group-size {group_size}          # the endpoint's token: $OPENAI_API_KEY

An episode: ``env.reset(seed=task seed)`` (the same seed gives the G episodes of a group the same task, OpenEnv's
convention), then turns: the observation's ``--prompt-field`` as the user's message, the policy's answer (a chat
completion tagged ``X-Episode-Id``, so the endpoint records the sampled tokens) as the ``--action-field`` of an
action, ``env.step``; until the observation says ``done`` or ``--max-turns``. The episode's reward is the sum of the
step rewards (the environment's rubric); ``POST /v1/episodes/<id>/finish`` hands it over with the group.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import random
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import httpx
from client_common import group_prefix, wait_to_be_stopped
from openai import OpenAI


def load(spec: str) -> Any:
    """``module:attr`` or ``path/to/file.py:attr``."""
    where, _, attr = spec.rpartition(":")
    if where.endswith(".py"):
        path = Path(where).resolve()
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[path.stem] = module
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    return getattr(module, attr)


class Driver:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.make_env: Callable[[], Any] = load(args.env)
        self.action_type = load(args.action)
        token = os.environ.get("OPENAI_API_KEY", "none")
        self.base_url = args.base_url.rstrip("/")
        self.client = OpenAI(base_url=self.base_url, api_key=token, max_retries=args.retries, timeout=120)
        self.http = httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=60, trust_env=False)
        self.prefix = group_prefix("openenv")

    def episode(self, seed: int, group: str, episode_id: str) -> float:
        a = self.args
        env = self.make_env()
        observation = env.reset(seed=seed, episode_id=episode_id)
        messages = [{"role": "system", "content": a.system_prompt}] if a.system_prompt else []
        total = 0.0
        for _ in range(a.max_turns):
            messages.append({"role": "user", "content": str(getattr(observation, a.prompt_field))})
            reply = self.client.chat.completions.create(model=a.model, messages=messages,
                                                        extra_headers={"X-Episode-Id": episode_id})
            text = reply.choices[0].message.content or ""
            observation = env.step(self.action_type(**{a.action_field: text}))
            total += float(observation.reward or 0.0)
            if observation.done:
                break
            messages.append({"role": "assistant", "content": text})
        done = self.http.post(f"{self.base_url}/episodes/{episode_id}/finish", json={"reward": total, "group": group})
        done.raise_for_status()
        return total

    def run(self) -> None:
        a = self.args
        rng = random.Random(a.seed if a.seed is not None else uuid.uuid4().int)
        with ThreadPoolExecutor(a.concurrency) as pool:
            task = 0
            while a.tasks is None or task < a.tasks:
                seed, group = rng.randrange(2**31), f"{self.prefix}-{task}"
                futures = [pool.submit(self.episode, seed, group, f"{group}-{i}") for i in range(a.group_size)]
                rewards = [f.result() for f in futures]
                print(f"{group}: rewards {rewards}", flush=True)
                task += 1
        wait_to_be_stopped(task)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base-url", required=True, help="the policy endpoint, e.g. http://127.0.0.1:PORT/v1")
    p.add_argument("--model", required=True, help="the model name the endpoint serves (the run's name)")
    p.add_argument("--env", required=True, help="factory of the OpenEnv Environment, module:attr or file.py:attr")
    p.add_argument("--action", required=True, help="its Action class, module:attr or file.py:attr")
    p.add_argument("--group-size", type=int, required=True, help="episodes per task (rollout.samples_per_prompt)")
    p.add_argument("--prompt-field", default="prompt", help="the observation's field with the text for the policy")
    p.add_argument("--action-field", default="text", help="the action's field that takes the policy's answer")
    p.add_argument("--system-prompt", default=None)
    p.add_argument("--max-turns", type=int, default=1)
    p.add_argument("--concurrency", type=int, default=8, help="episodes in flight at once")
    p.add_argument("--tasks", type=int, default=None, help="play this many tasks, then wait to be stopped "
                                                           "(default: play until stopped)")
    p.add_argument("--seed", type=int, default=None, help="the task seeds' seed (default: random)")
    p.add_argument("--retries", type=int, default=8, help="the SDK's retries of a call (a 503 during a weight "
                                                          "update is retried)")
    Driver(p.parse_args(argv)).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
