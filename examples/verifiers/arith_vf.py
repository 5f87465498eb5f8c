"""A verifiers (0.4, ``verifiers.v1``) taskset for the built-in addition task: tasks from ``data/arith/train.jsonl``
($ARITH_DATA to change), a ``@vf.reward`` that is 1 when the answer's last ``\\boxed{}`` holds the sum, and a one-turn
chat harness. Nothing of the trainer: any verifiers taskset loads the same way, by its module name
(``--taskset arith_vf`` with this folder on the path).

Why a harness of its own: verifiers' built-in ones run an agent program set up with ``uv`` from PyPI (and its
default runtime is a remote sandbox), which an offline machine cannot do. This one makes its model call in process,
through the interception endpoint verifiers gives every rollout, as verifiers allows (``Harness.launch``: "a harness
may run its loop in-process ... as long as every model call goes through ``endpoint`` + ``secret``"). On a machine
with network, a taskset can keep verifiers' own harnesses: the driver is the same.
"""
from __future__ import annotations

import json
import os
from typing import Iterator

import httpx
import verifiers.v1 as vf


class ArithData(vf.TaskData):
    answer: str


class ArithTask(vf.Task[ArithData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        given = vf.extract_boxed_answer(trace.last_reply or "", strict=True).strip()
        return 1.0 if given and given == self.data.answer.strip() else 0.0


class ArithConfig(vf.TasksetConfig):
    path: str = os.environ.get("ARITH_DATA", "data/arith/train.jsonl")
    instruction: str = "Please reason step by step, and put your final answer within \\boxed{}."


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    def load(self) -> Iterator[ArithTask]:
        with open(self.config.path) as f:
            for i, line in enumerate(f):
                if not line.strip():
                    continue
                row = json.loads(line)
                user = row["messages"] if isinstance(row["messages"], dict) else row["messages"][-1]
                data = ArithData(id=f"arith-{i}", prompt=user["content"], system_prompt=self.config.instruction,
                                 answer=str(row["gt_answer"]))
                yield ArithTask(data, self.config.task)


class ChatHarnessConfig(vf.HarnessConfig):
    pass


class ChatHarness(vf.Harness[ChatHarnessConfig]):
    """One chat turn, in process, through the rollout's interception endpoint."""

    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None):
        system, prompt = self.resolve_prompt(data)
        messages = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        else:
            messages += [m.model_dump(exclude_none=True) for m in prompt]
        async with httpx.AsyncClient(timeout=None, trust_env=False) as client:
            reply = await client.post(endpoint.rstrip("/") + "/chat/completions",
                                      headers={"Authorization": f"Bearer {secret}"},
                                      json={"model": ctx.model, "messages": messages})
        ok = reply.status_code == 200
        return vf.ProgramResult(exit_code=0 if ok else 1, stdout=reply.text if ok else "",
                                stderr="" if ok else reply.text)


__all__ = ["ArithTaskset", "ChatHarness"]  # the module's Harness is its taskset's default
