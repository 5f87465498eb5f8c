"""A sampler on an OpenAI-compatible vLLM server (`grpo serve`): the same methods as ``VLLMSampler``, over HTTP.

Rollouts go through ``/v1/completions`` with token ids in and token ids plus the sampled tokens' logprobs out
(``return_token_ids``, ``logprobs=0``), one request per prompt (each prompt has its own seed; vLLM gives its ``n``
children ``seed + k``, as in-process). Scoring given tokens uses ``prompt_logprobs``. Weights arrive through vLLM's
RL routes (``grpo_core.weights.server_engine``) and LoRA adapters through ``/v1/load_lora_adapter``.

The policy version lives on the server (``/weight_info``), tagged with the run (``<run>:v<N>``): a fresh server
(``default``) or one left serving another run counts as serving no version, so the flow's version check syncs it
before it samples. Requests that time out or cannot connect are retried ``retries`` times; then
``ServerUnavailable`` says which server is down, and the caller sends its share elsewhere.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from grpo_core.engine.rollout.sampler import Sample, agreed_receipt, per_prompt
from grpo_core.engine.weights_digest import WeightsDigest, adapter_digest

_BACKOFF_S = 0.5


class ServerUnavailable(RuntimeError):
    """A server did not answer (connection refused, timeout) after the retries."""


class ServerSampler:
    def __init__(self, url: str, *, tag: str, timeout_s: float = 120.0, retries: int = 2, max_parallel: int = 64,
                 ready_timeout_s: float = 60.0):
        self.url = url.rstrip("/")
        self.tag = tag
        self.retries = retries
        self.max_parallel = max_parallel
        self.http = httpx.Client(base_url=self.url, timeout=timeout_s,
                                 limits=httpx.Limits(max_connections=max_parallel))
        started = time.perf_counter()
        card = self._wait_ready(ready_timeout_s)
        self.model: str = card["id"]
        self.max_model_len: int | None = card.get("max_model_len")  # tokens per sequence (prompt + response)
        self.load_seconds = time.perf_counter() - started
        self._adapter: str | None = None  # the LoRA adapter requests name (None: the base model)
        # The digest of what this client last had the server's loader take (``VLLMSampler.served``); None until then.
        self.served: WeightsDigest | None = None

    # ------------------------------------------------------------------------------------------------ http
    def _request(self, method: str, path: str, **kwargs) -> httpx.Response:
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                response = self.http.request(method, path, **kwargs)
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                last = exc
                time.sleep(_BACKOFF_S * 2**attempt)
                continue
            if response.status_code >= 400:
                raise RuntimeError(f"{self.url}{path} answered {response.status_code}: {response.text[:2000]}")
            return response
        raise ServerUnavailable(f"server {self.url} did not answer {method} {path} after {self.retries + 1} "
                                f"attempts: {type(last).__name__}: {last}")

    def _post(self, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        return self._request("POST", path, json=body)

    def _wait_ready(self, timeout_s: float) -> dict[str, Any]:
        """The served model's card from ``/v1/models`` (its ``id`` and ``max_model_len``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.http.get("/v1/models").json()["data"][0]
            except (httpx.TransportError, httpx.TimeoutException) as exc:
                if time.monotonic() > deadline:
                    raise ServerUnavailable(
                        f"server {self.url} is not answering /v1/models after {timeout_s:.0f}s ({exc}): is "
                        f"`grpo serve --model DIR --port {self.http.base_url.port}` running there? Its own output "
                        "says why it did not start") from None
                time.sleep(0.5)

    def check_length(self, needed: int, what: str) -> None:
        """Refuse a server that cannot hold ``needed`` tokens per sequence (vLLM would reject every request)."""
        if self.max_model_len is not None and self.max_model_len < needed:
            raise ValueError(f"server {self.url} serves at most {self.max_model_len} tokens per sequence, but "
                             f"{what} need {needed}: start it with `grpo serve --max-model-len {needed}` (and "
                             "enough --kv-cache-mb)")

    def alive(self, timeout_s: float = 5.0) -> bool:
        try:
            return self.http.get("/health", timeout=timeout_s).status_code == 200
        except (httpx.TransportError, httpx.TimeoutException):
            return False

    # --------------------------------------------------------------------------------------------- version
    @property
    def version(self) -> int | None:
        """The policy version the server serves for this run (None: base weights or another run's)."""
        tag = self._request("GET", "/weight_info").json().get("weight_version")
        prefix = f"{self.tag}:v"
        if isinstance(tag, str) and tag.startswith(prefix) and tag[len(prefix):].isdigit():
            return int(tag[len(prefix):])
        return None

    def _tag(self, version: int) -> str:
        return f"{self.tag}:v{version}"

    # -------------------------------------------------------------------------------------------- sampling
    def _completions(self, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
        model = self._adapter or self.model
        with ThreadPoolExecutor(max_workers=max(1, min(self.max_parallel, len(bodies)))) as pool:
            return list(pool.map(lambda b: self._post("/v1/completions", {"model": model, **b}).json(), bodies))

    def generate(self, prompts: list[list[int]], *, n: int, max_tokens: int | list[int], temperature: float = 1.0,
                 top_p: float = 1.0, seeds: list[int] | None = None) -> list[list[Sample]]:
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"seeds has {len(seeds)} entries for {len(prompts)} prompts")
        widths = per_prompt(max_tokens, len(prompts))
        bodies = [{"prompt": p, "n": n, "max_tokens": widths[i], "temperature": temperature, "top_p": top_p,
                   "logprobs": 0, "return_token_ids": True, "skip_special_tokens": True,
                   **({} if seeds is None else {"seed": seeds[i]})} for i, p in enumerate(prompts)]
        return [self._samples(r, n) for r in self._completions(bodies)]

    def generate_greedy(self, prompts: list[list[int]], *, max_tokens: int | list[int]) -> list[Sample]:
        bodies = [{"prompt": p, "n": 1, "max_tokens": w, "temperature": 0.0, "logprobs": 0,
                   "return_token_ids": True, "skip_special_tokens": True}
                  for p, w in zip(prompts, per_prompt(max_tokens, len(prompts)))]
        return [self._samples(r, 1)[0] for r in self._completions(bodies)]

    def score_tokens(self, sequences: list[list[int]], prompt_lens: list[int]) -> list[list[float]]:
        """Log-probabilities the server assigns to ``seq[prompt_len:]`` (temperature 1, vLLM's prompt logprobs)."""
        bodies = [{"prompt": s, "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0} for s in sequences]
        out = []
        for seq, start, r in zip(sequences, prompt_lens, self._completions(bodies)):
            entries = r["choices"][0]["prompt_logprobs"]  # entry i: {str(token_id): {"logprob": ...}} for seq[i]
            out.append([entries[i][str(seq[i])]["logprob"] for i in range(start, len(seq))])
        return out

    def _samples(self, response: dict[str, Any], n: int) -> list[Sample]:
        choices = sorted(response["choices"], key=lambda c: c["index"])
        if len(choices) != n:
            raise RuntimeError(f"{self.url} returned {len(choices)} completions for n={n}")
        samples = []
        for c in choices:
            token_ids = list(c.get("token_ids") or [])
            logprobs = (c.get("logprobs") or {}).get("token_logprobs")
            if logprobs is None or len(logprobs) != len(token_ids):
                raise RuntimeError(f"{self.url} returned {len(token_ids)} token ids with logprobs {logprobs!r}: a "
                                   "server started with `grpo serve` returns both")
            samples.append(Sample(token_ids=token_ids, logprobs=[float(x) for x in logprobs], text=c["text"],
                                  finish_reason=str(c["finish_reason"])))
        return samples

    # --------------------------------------------------------------------------------------------- weights
    def load_from_store(self, url: str, storage_options: dict[str, Any], version: int) -> float:
        """Files transport: the server reads the version's safetensors from ``url`` (local path or fsspec URL the
        server can reach) and serves them as ``version``."""
        return self._load_path(url, storage_options, self._tag(version))

    def _load_path(self, path: str, storage_options: dict[str, Any], weight_version: str) -> float:
        """Full weights from a folder the server reads itself (our ``grpo`` backend's files route); no adapter."""
        started = time.perf_counter()
        self._open_receipt()
        self._post("/start_weight_update")
        self._post("/update_weights", {"update_info": {"path": path, "storage_options": storage_options}})
        self._post("/finish_weight_update", {"weight_version": weight_version})
        self.served = self._close_receipt()
        self._drop_adapter()
        return time.perf_counter() - started

    def _rpc(self, method: str) -> list:
        return self._post("/collective_rpc", {"method": method}).json().get("results") or [None]

    def _open_receipt(self) -> None:
        """Digest what the server's loader is handed from now on (``WeightReceiver.grpo_receipt_begin``, through
        vLLM's dev route ``/collective_rpc``)."""
        self.served = None
        self._rpc("grpo_receipt_begin")

    def _close_receipt(self) -> WeightsDigest:
        return agreed_receipt(self._rpc("grpo_receipt_end"), f"server {self.url}")

    def _drop_adapter(self) -> None:
        if self._adapter is not None:
            self._post("/v1/unload_lora_adapter", {"lora_name": self._adapter})
            self._adapter = None

    def restore_base(self, model_dir: str) -> float:
        """Reload the base model's own weights from ``model_dir`` (a path the server can read). A LoRA run does this
        first: a server that served another run's full weights would otherwise put the adapters on top of those.
        The server then reports no version of this run, so the flow's version check syncs an adapter before it
        samples."""
        return self._load_path(model_dir, {}, f"{self.tag}:base")

    def load_adapter(self, adapter_dir: str, version: int) -> float:
        """Serve base + the peft adapter in ``adapter_dir`` (a path the server can read) as ``version``: a new
        adapter name per version (vLLM caches adapters by name), the previous one unloaded."""
        started = time.perf_counter()
        name = f"{self.tag}-v{version}"
        if name != self._adapter:
            served = adapter_digest(adapter_dir)  # the folder the server reads (LoRA servers share the run's disk)
            self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": adapter_dir})
            self.served = served
            old, self._adapter = self._adapter, name
            if old is not None:
                self._post("/v1/unload_lora_adapter", {"lora_name": old})
        self._post("/update_weight_version", {"new_version": self._tag(version)})
        return time.perf_counter() - started

    def serve_base(self, version: int) -> None:
        """LoRA: drop the adapter and serve the base model alone as ``version``."""
        self._drop_adapter()
        self.served = WeightsDigest({})  # no adapter
        self._post("/update_weight_version", {"new_version": self._tag(version)})

    # vLLM's weight-transfer lifecycle over the server's RL routes (broadcast; the gloo trainer engine drives it)
    def init_transfer(self, init_info: dict) -> None:
        self._post("/init_weight_transfer_engine", {"init_info": init_info})

    def start_transfer(self) -> None:
        self._open_receipt()
        self._post("/start_weight_update")

    def receive(self, update_info: dict) -> None:
        self._post("/update_weights", {"update_info": update_info})

    def finish_transfer(self, version: int | None) -> None:
        self._post("/finish_weight_update", None if version is None else {"weight_version": self._tag(version)})
        self.served = self._close_receipt()
        self._adapter = None

    def shutdown_transfer(self) -> None:
        self._post("/shutdown_weight_transfer_engine")

    def close(self) -> None:
        self.http.close()
