"""The policy endpoint: an OpenAI-compatible HTTP API in front of the run's policy, for environments and agents
written elsewhere (anything that speaks ``/v1/completions`` or ``/v1/chat/completions``).

Each answer carries what a trainer needs besides the text: the sampled token ids (``token_ids``, as vLLM's
``return_token_ids``), the prompt's (``prompt_token_ids``), their logprobs when asked (OpenAI's ``logprobs`` fields)
and the policy version that sampled them (``policy_version``). A call tagged with an episode id (the
``X-Episode-Id`` header, or ``episode_id`` in the body: the OpenAI SDK's ``extra_headers`` / ``extra_body``) is
recorded by the ``EpisodeRecorder``; ``POST /v1/episodes/{id}/finish`` (with the episode's reward) turns it into
one training sample, handed to the endpoint's sink (in a run: grouped, then written to the inbox);
``DELETE /v1/episodes/{id}`` drops one its client gave up (a failed rollout), so that it is not left open.

127.0.0.1 by default; with a token set, every route but ``/health`` needs ``Authorization: Bearer <token>``. Bad
requests get OpenAI-style error bodies (``{"error": {"message", "type", "param", "code"}}``). While the policy is
being updated (``gate.closed``) a call waits at most ``wait_s`` for it to reopen, then gets 503 with
``Retry-After``; a stopping run answers 503 at once.

Every request passes the door first (``grpo_core.outside.endpoint.requests``): a body larger than ``max_body_bytes`` is
refused (413) before it is read, JSON that is too deep, holds a non-finite number, a 64-bit-overflowing integer or a
lone surrogate is refused naming the field, and so is every field out of its range; a prompt is measured (text before
it is rendered, token ids counted) before it is tokenised, then checked in the tokens the engine will see against the
context less one answer token. ``/health`` answers on the event loop, never behind the sampling calls' threads.
"""
from __future__ import annotations

import secrets
import threading
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any, Callable, Protocol

from grpo_core.outside.endpoint import requests as door
from grpo_core.outside.endpoint.groups import GroupFate
from grpo_core.outside.endpoint.ledger import SampledLedger
from grpo_core.outside.endpoint.recorder import EpisodeRecorder, FinishedEpisode, TurnPlan
from grpo_core.outside.endpoint.requests import RequestError
from grpo_core.outside.endpoint.sampling import SamplingRequest
from grpo_core.engine.rollout.sampler import Sample


class Policy(Protocol):
    """What the endpoint samples from: the run's samplers (any placement), or one engine in tests."""

    max_model_len: int

    def sample(self, prompt_ids: list[int], request: SamplingRequest) -> tuple[list[Sample], int]:
        """``request.n`` samples of one prompt and the policy version that drew them."""


class EpisodeSink(Protocol):
    """Where finished episodes go (``grpo_core.outside.endpoint.groups.EpisodeGroups`` in a run)."""

    def check(self, group: str | None) -> None:
        """Refuse (``RequestError``) an episode that could not be kept, before it is closed."""

    def add(self, episode: FinishedEpisode) -> GroupFate:
        """Keep a finished episode; what became of the group it completed, if any."""

    def incomplete(self) -> dict[str, int]:
        """Groups still short of their episodes."""


class PolicyGate:
    """Open while the policy serves; closed during a weight update (calls wait, bounded) or for good when the run
    stops (calls are refused at once)."""

    def __init__(self) -> None:
        self._open = threading.Event()
        self._open.set()
        self.stopping = False
        self.reason = ""

    def close(self, reason: str) -> None:
        self.reason = reason
        self._open.clear()

    def reopen(self) -> None:
        self._open.set()

    def stop(self, reason: str) -> None:
        self.stopping, self.reason = True, reason
        self._open.clear()

    def wait(self, seconds: float) -> None:
        if self.stopping:
            raise RequestError(f"the run is stopping ({self.reason}): the policy serves no more calls",
                               code="run_stopping", status=503)
        if not self._open.wait(seconds):
            raise RequestError(f"the policy is being updated ({self.reason}); retry shortly", code="policy_updating",
                               status=503)


@dataclass
class EndpointSettings:
    model_name: str
    max_tokens: int  # default per answer (the run's rollout.max_new_tokens)
    temperature: float = 1.0
    top_p: float = 1.0
    token: str | None = None  # bearer token (None: no auth)
    wait_s: float = 30.0  # how long a call waits for a weight update to finish
    max_abs_reward: float = door.MAX_ABS_REWARD  # |reward| of a finished episode at most (why 1e6: MAX_ABS_REWARD)
    # The largest body read: a 128k-token context as token ids is about 1 MiB of JSON, as text a few MiB at most
    # (a token is a few characters); parsing and checking 12 MB of token ids took 0.73 s on 2 cores.
    max_body_bytes: int = 8 * 2**20


class PolicyEndpoint:
    """The routes' logic, independent of the HTTP framework (``app()`` wraps it in FastAPI)."""

    def __init__(self, policy: Policy, recorder: EpisodeRecorder, settings: EndpointSettings,
                 sink: EpisodeSink | None = None, ledger: SampledLedger | None = None):
        self.policy, self.recorder, self.settings = policy, recorder, settings
        self.ledger = ledger if ledger is not None else SampledLedger()  # every answer, for groups sent back
        self.gate = PolicyGate()
        self.sink = sink
        self.finished: list[FinishedEpisode] = []  # kept here when there is no sink

    # ------------------------------------------------------------------------------------------ requests
    def _sampling(self, body: dict, plan: TurnPlan, param: str) -> SamplingRequest:
        """The call's sampling request: its fields checked (``requests.sampling_fields``), the prompt's tokens -- the
        tokens the engine is given -- checked against the context less the answer's first token, and ``max_tokens``
        clamped to the room left."""
        s = self.settings
        fields = door.sampling_fields(body, s.max_tokens, s.temperature, s.top_p)
        room = self.policy.max_model_len - len(plan.prompt_ids)
        if room < 1:
            raise door.context_exceeded(param, len(plan.prompt_ids), self.policy.max_model_len)
        if plan.episode_id is not None and fields.n != 1:
            raise RequestError("an episode's call has one answer (n=1): start one episode per sample", param="n")
        return replace(fields, max_tokens=min(fields.max_tokens, room))

    def _run(self, plan: TurnPlan, request: SamplingRequest) -> tuple[list[Sample], int]:
        self.gate.wait(self.settings.wait_s)
        with self.recorder.turn(plan):  # one call at a time per episode, planned on its current state
            try:
                samples, version = self.policy.sample(plan.prompt_ids, request)
            except Exception as exc:  # noqa: BLE001 - the client gets why, as an OpenAI-style 503
                raise RequestError(f"the policy could not answer: {type(exc).__name__}: {exc}",
                                   code="policy_unavailable", status=503) from exc
            if version is None:
                raise RequestError("the policy serves no version of this run yet (it has not been synced)",
                                   code="policy_not_ready", status=503)
            self.recorder.record(plan, samples[0], version)  # an untracked call is only counted
            for s in samples:
                self.ledger.record(plan.prompt_ids, s.token_ids, s.logprobs, s.finish_reason, version)
        return samples, version

    def _check_model(self, body: dict) -> None:
        model = body.get("model")
        if model is not None and model != self.settings.model_name:
            raise RequestError(f"model {model!r} is not served here; this endpoint serves "
                               f"{self.settings.model_name!r}", param="model", code="model_not_found", status=404)

    def completions(self, body: Any, headers: dict[str, str]) -> dict[str, Any]:
        body = door.json_object(body)
        self._check_model(body)
        episode = door.episode_id(body, headers)
        door.prompt_size("prompt", body.get("prompt"), self.policy.max_model_len, self.recorder.chars_per_token)
        plan = self.recorder.plan_completion(body.get("prompt"), episode)
        request = self._sampling(body, plan, "prompt")
        want_logprobs = body.get("logprobs") is not None
        samples, version = self._run(plan, request)
        choices = [{"index": i, "text": s.text, "finish_reason": s.finish_reason, "token_ids": s.token_ids,
                    "logprobs": ({"tokens": self._pieces(s.token_ids), "token_logprobs": s.logprobs,
                                  "top_logprobs": None, "text_offset": None} if want_logprobs else None)}
                   for i, s in enumerate(samples)]
        return self._response("text_completion", "cmpl", plan, samples, version, choices)

    def chat_completions(self, body: Any, headers: dict[str, str]) -> dict[str, Any]:
        body = door.json_object(body)
        self._check_model(body)
        episode = door.episode_id(body, headers)
        door.prompt_size("messages", body.get("messages"), self.policy.max_model_len, self.recorder.chars_per_token)
        plan = self.recorder.plan_chat(body.get("messages"), episode)
        request = self._sampling(body, plan, "messages")
        want_logprobs = bool(body.get("logprobs"))
        samples, version = self._run(plan, request)
        choices = []
        for i, s in enumerate(samples):
            logprobs = {"content": [{"token": piece, "logprob": lp, "bytes": None, "top_logprobs": []}
                                    for piece, lp in zip(self._pieces(s.token_ids), s.logprobs)]}
            choices.append({"index": i, "message": {"role": "assistant", "content": s.text},
                            "finish_reason": s.finish_reason, "token_ids": s.token_ids,
                            "logprobs": logprobs if want_logprobs else None})
        return self._response("chat.completion", "chatcmpl", plan, samples, version, choices)

    def generate(self, body: Any, headers: dict[str, str]) -> dict[str, Any]:
        """vLLM's native ``POST /generate`` as Atropos's ``server_type: vllm`` calls it (``ManagedServer`` keeps the
        tokens itself): ``{"prompt": {"prompt_token_ids": [...]}, "logprobs": 0, n, max_tokens, ...}`` ->
        ``{"logprobs": [per sample: [per token: [{"<id>": logprob}]]], "finish_reasons": [...]}``, with the texts,
        the token ids and the policy version beside them."""
        body = door.json_object(body)
        prompt = body.get("prompt")
        ids = prompt.get("prompt_token_ids") if isinstance(prompt, dict) else None
        if ids is None:
            raise RequestError("prompt must be {\"prompt_token_ids\": [...]}", param="prompt")
        episode = door.episode_id(body, headers)
        door.prompt_size("prompt", ids, self.policy.max_model_len, self.recorder.chars_per_token)
        plan = self.recorder.plan_completion(ids, episode)
        request = self._sampling({k: v for k, v in body.items() if k not in ("prompt", "logprobs")}, plan, "prompt")
        samples, version = self._run(plan, request)
        return {"logprobs": [[[{str(t): lp}] for t, lp in zip(s.token_ids, s.logprobs)] for s in samples],
                "finish_reasons": [s.finish_reason for s in samples], "text": [s.text for s in samples],
                "token_ids": [s.token_ids for s in samples], "prompt_token_ids": plan.prompt_ids,
                "policy_version": version}

    def _pieces(self, ids: list[int]) -> list[str]:
        return self.recorder.tokenizer.convert_ids_to_tokens(ids)

    def _response(self, kind: str, prefix: str, plan: TurnPlan, samples: list[Sample], version: int,
                  choices: list[dict]) -> dict[str, Any]:
        completion = sum(len(s.token_ids) for s in samples)
        return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()),
                "model": self.settings.model_name, "choices": choices, "prompt_token_ids": plan.prompt_ids,
                "policy_version": version, "episode_id": plan.episode_id,
                "usage": {"prompt_tokens": len(plan.prompt_ids), "completion_tokens": completion,
                          "total_tokens": len(plan.prompt_ids) + completion}}

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.settings.model_name, "object": "model", "created": 0,
                                            "owned_by": "grpo", "max_model_len": self.policy.max_model_len}]}

    def finish(self, episode_id: str, body: Any) -> dict[str, Any]:
        """Close an episode with its reward and group. ``inbox_item``: the item its group became when it completed;
        ``group_rejected``: why the completed group cannot be trained on (then kept under ``inbox/rejected/``)."""
        door.identifier(episode_id, "episode_id", "an episode id")
        fields = door.finish_fields(body, self.settings.max_abs_reward)
        if self.sink is not None:
            self.sink.check(fields.group)
        done = self.recorder.finish(episode_id, fields.reward, fields.group)
        fate = None
        try:
            if self.sink is not None:
                fate = self.sink.add(done)
            else:
                self.finished.append(done)
        except BaseException as exc:  # the group was not written: nothing of it is lost, the episode open again
            self.recorder.settle(episode_id, kept=False)
            if isinstance(exc, OSError):  # the run folder did not take it: the same finish can be sent again
                raise RequestError(f"episode {episode_id!r} completed its group, which could not be written to the "
                                   f"run folder ({exc}); the episode is open again: finish it again",
                                   code="storage_unavailable", status=503) from exc
            raise
        self.recorder.settle(episode_id, kept=True)
        ep = done.episode
        return {"episode_id": episode_id, "turns": ep.num_turns, "tokens": len(done.prompt_ids) + len(ep.token_ids),
                "policy_tokens": sum(ep.mask), "policy_version": done.policy_version, "reward": ep.reward,
                "group": fields.group, "inbox_item": None if fate is None else fate.item,
                "group_rejected": None if fate is None else fate.rejected}

    def discard(self, episode_id: str) -> dict[str, Any]:
        """An episode its client gave up (a rollout that failed): dropped, never trained on, no longer open."""
        door.identifier(episode_id, "episode_id", "an episode id")
        return {"episode_id": episode_id, "discarded": True, "turns": self.recorder.discard(episode_id)}

    # ----------------------------------------------------------------------------------------------- HTTP
    def authorized(self, headers: dict[str, str]) -> bool:
        """The bearer token, compared as bytes in constant time (``compare_digest`` refuses non-ASCII ``str``; a
        header is Latin-1 text, a token from the environment may hold anything)."""
        token = self.settings.token
        if token is None:
            return True
        given = headers.get("authorization", "").encode("utf-8", "surrogatepass")
        return secrets.compare_digest(given, f"Bearer {token}".encode("utf-8", "surrogatepass"))

    def app(self):
        """The FastAPI application serving these routes."""
        import anyio
        from fastapi import FastAPI, Request
        from fastapi.responses import JSONResponse

        api = FastAPI(title="grpo policy endpoint", docs_url=None, redoc_url=None, openapi_url=None)
        limit = self.settings.max_body_bytes

        def error(exc: RequestError) -> JSONResponse:
            kind = "invalid_request_error" if exc.status < 500 else "server_error"
            headers = {"Retry-After": "1"} if exc.status == 503 else None
            param = None if exc.param is None else door.shown_text(exc.param)
            return JSONResponse({"error": {"message": door.shown_text(str(exc)), "type": kind, "param": param,
                                           "code": exc.code}}, status_code=exc.status, headers=headers)

        async def body_bytes(request: Request) -> bytes:
            """The body, refused (413) past ``max_body_bytes``: by its declared length before a byte is read, or as
            soon as the bytes read pass it (a chunked body)."""
            declared = request.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > limit:
                raise door.too_large(int(declared), limit)
            chunks, size = [], 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise door.too_large(size, limit)
                chunks.append(chunk)
            return b"".join(chunks)

        def route(handler: Callable[[Any, dict[str, str]], dict[str, Any]], needs_body: bool = True):
            async def serve(request: Request):
                headers = {k.lower(): v for k, v in request.headers.items()}
                if not self.authorized(headers):
                    return error(RequestError("missing or wrong bearer token (Authorization: Bearer ...)",
                                              code="invalid_api_key", status=401))
                try:
                    raw = await body_bytes(request)  # read (bounded) on every route, used where the route takes one
                    params = {**headers, **request.path_params}
                    # parsed and checked on a worker thread, as the call is: the event loop only moves bytes
                    out = await anyio.to_thread.run_sync(
                        lambda: handler(door.read_json(raw) if needs_body else None, params))
                except RequestError as exc:
                    return error(exc)
                return JSONResponse(out)
            serve.__annotations__ = {"request": Request}  # this module's annotations are strings; FastAPI needs it
            return serve

        async def health() -> dict[str, str]:
            """Liveness, answered on the event loop: never queued behind sampling calls in the thread pool."""
            return {"status": "ok"}

        api.add_api_route("/v1/models", route(lambda b, h: self.models(), needs_body=False), methods=["GET"])
        api.add_api_route("/v1/completions", route(self.completions), methods=["POST"])
        api.add_api_route("/v1/chat/completions", route(self.chat_completions), methods=["POST"])
        api.add_api_route("/v1/episodes/{episode_id}/finish",
                          route(lambda b, h: self.finish(h["episode_id"], b)), methods=["POST"])
        api.add_api_route("/v1/episodes/{episode_id}", route(lambda b, h: self.discard(h["episode_id"]),
                                                             needs_body=False), methods=["DELETE"])
        api.add_api_route("/generate", route(self.generate), methods=["POST"])  # Atropos (server_type: vllm)
        api.add_api_route("/health", health, methods=["GET"])

        @api.exception_handler(404)
        async def not_found(request: Request, exc: Exception):
            return error(RequestError(f"no route {request.method} {request.url.path}", code="not_found", status=404))

        @api.exception_handler(405)
        async def not_allowed(request: Request, exc: Exception):
            return error(RequestError(f"{request.method} is not allowed on {request.url.path}",
                                      code="method_not_allowed", status=405))

        @api.exception_handler(Exception)
        async def failed(request: Request, exc: Exception):
            """A fault of the endpoint itself: still an OpenAI-style body (the traceback goes to the server's log)."""
            return error(RequestError(f"the endpoint failed on {request.method} {request.url.path}: "
                                      f"{type(exc).__name__}: {exc}", code="internal_error", status=500))
        return api


class EndpointServer:
    """Serves an endpoint's app with uvicorn on a thread of this process (127.0.0.1 by default)."""

    def __init__(self, endpoint: PolicyEndpoint, host: str = "127.0.0.1", port: int = 0):
        from grpo_core.infra.app_thread import AppThread

        self.endpoint = endpoint
        self._served = AppThread(endpoint.app(), host, port, "policy endpoint")
        self.host, self.port = self._served.host, self._served.port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self, timeout: float = 30.0) -> "EndpointServer":
        self._served.start(timeout)
        return self

    def stop(self) -> None:
        self.endpoint.gate.stop("the endpoint is shutting down")
        self._served.stop()
