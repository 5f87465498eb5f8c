"""Generative judges: a chat model asked to grade each response, greedily, its answer parsed (``verdicts``).

``VLLMJudge`` runs its own vLLM engine in the process that holds it (a reward actor); ``RemoteJudge`` asks an
OpenAI-compatible server (``grpo serve`` or any vLLM server) through /v1/chat/completions, a request per row, many
in flight, with a timeout and retries; rows whose requests never got an answer are unscored with the reason.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from grpo_core.rewards.models.base import ModelReward, ModelVerdict, RewardInput
from grpo_core.rewards.models.verdicts import check_template, judge_prompt, parse_verdict

TOP_LOGPROBS = 5  # alternatives of the first verdict token read for a yes/no verdict
_BACKOFF_S = 0.5


class _Judge(ModelReward):
    def __init__(self, *, template: str, verdict: str, score_range: tuple[float, float], max_tokens: int):
        check_template(template)
        self.template, self.verdict, self.score_range, self.max_tokens = template, verdict, score_range, max_tokens

    def conversation(self, row: RewardInput) -> list[dict[str, str]]:
        return [{"role": "user", "content": judge_prompt(self.template, row, self.score_range)}]

    def parse(self, text: str, top_logprobs: dict[str, float] | None) -> ModelVerdict:
        return parse_verdict(self.verdict, text, self.score_range, top_logprobs)


class VLLMJudge(_Judge):
    """A vLLM engine in this process (uni executor), greedy, the first token's top logprobs when yes/no."""

    def __init__(self, path: str, *, kv_cache_mb: int = 64, max_model_len: int | None = None, **judge: Any):
        """`max_model_len`: None is the model's own (what its KV cache of `kv_cache_mb` must hold on CPU)."""
        super().__init__(**judge)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        import torch
        from vllm import LLM

        from grpo_core.engine.rollout.model_class import inspect_in_process

        kwargs: dict[str, Any] = dict(model=path, dtype="float32" if not torch.cuda.is_available() else "auto",
                                      enforce_eager=True, distributed_executor_backend="uni")
        if max_model_len is not None:  # at most the model's own (vLLM refuses more)
            from transformers import AutoConfig

            own = getattr(AutoConfig.from_pretrained(path), "max_position_embeddings", None)
            kwargs["max_model_len"] = min(max_model_len, own) if own else max_model_len
        if torch.cuda.is_available():
            kwargs["gpu_memory_utilization"] = 0.3
        else:
            kwargs["kv_cache_memory_bytes"] = kv_cache_mb * 2**20
        inspect_in_process(path)
        self.llm = LLM(**kwargs)
        self.path = path

    def score(self, rows: list[RewardInput]) -> list[ModelVerdict]:
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=self.max_tokens,
                                logprobs=TOP_LOGPROBS if self.verdict == "yes_no" else None)
        outputs = self.llm.chat([self.conversation(r) for r in rows], params, use_tqdm=False)
        verdicts = []
        for out in outputs:
            sample = out.outputs[0]
            first = sample.logprobs[0] if sample.logprobs else None
            top = {lp.decoded_token or "": lp.logprob for lp in first.values()} if first else None
            verdicts.append(self.parse(sample.text, top))
        return verdicts

    def close(self) -> None:
        self.llm = None


class RemoteJudge(_Judge):
    def __init__(self, url: str, *, served_model: str | None = None, timeout_s: float = 60.0, retries: int = 2,
                 max_parallel: int = 32, ready_timeout_s: float = 60.0, **judge: Any):
        super().__init__(**judge)
        self.url, self.retries = url.rstrip("/"), retries
        self.http = httpx.Client(base_url=self.url, timeout=timeout_s,
                                 limits=httpx.Limits(max_connections=max_parallel))
        self.max_parallel = max_parallel
        self.model = served_model or self._first_model(ready_timeout_s)

    def _first_model(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.http.get("/v1/models").json()["data"][0]["id"]
            except (httpx.TransportError, httpx.TimeoutException) as exc:
                if time.monotonic() > deadline:
                    raise ConnectionError(f"judge server {self.url} is not answering /v1/models after "
                                          f"{timeout_s:.0f}s ({exc})") from None
                time.sleep(0.5)

    def score(self, rows: list[RewardInput]) -> list[ModelVerdict]:
        with ThreadPoolExecutor(max_workers=max(1, min(self.max_parallel, len(rows)))) as pool:
            return list(pool.map(self._one, rows))

    def _one(self, row: RewardInput) -> ModelVerdict:
        body: dict[str, Any] = {"model": self.model, "messages": self.conversation(row), "temperature": 0.0,
                                "max_tokens": self.max_tokens}
        if self.verdict == "yes_no":
            body.update(logprobs=True, top_logprobs=TOP_LOGPROBS)
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                response = self.http.post("/v1/chat/completions", json=body)
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                last = exc
                time.sleep(_BACKOFF_S * 2**attempt)
                continue
            if response.status_code >= 400:
                return ModelVerdict(None, error=f"judge server {self.url} answered {response.status_code}: "
                                                f"{response.text[:300]}")
            return self._verdict(response.json())
        return ModelVerdict(None, error=f"judge server {self.url} did not answer after {self.retries + 1} attempts: "
                                        f"{type(last).__name__}: {last}")

    def _verdict(self, answer: dict[str, Any]) -> ModelVerdict:
        choice = answer["choices"][0]
        text = choice["message"].get("content") or ""
        content = (choice.get("logprobs") or {}).get("content") or []
        top = {t["token"]: t["logprob"] for t in content[0].get("top_logprobs", [])} if content else None
        return self.parse(text, top)

    def close(self) -> None:
        self.http.close()
