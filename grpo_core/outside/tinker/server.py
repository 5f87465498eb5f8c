"""The HTTP door of the training service: Tinker's routes under ``/api/v1``, as the unmodified ``tinker`` SDK calls
them (read from SDK 0.38: ``docs/development/tinker-protocol.md``).

127.0.0.1 by default. Every route but ``/api/v1/healthz`` needs ``X-API-Key`` equal to the server's key (the SDK
sends its ``TINKER_API_KEY``; it insists the key starts with ``tml-``); a refusal is a 401 with a JSON body (the SDK
reads an empty 4xx as a proxy's and retries it). JSON bodies are read with the SDK's own request models (unknown
fields refused, types checked, the field named), after the project's door (size, depth, non-finite numbers, 64-bit
integers, lone surrogates); ``forward_backward`` bodies are the SDK's protobuf message (``wire``). A request refused
before it is queued gets a 4xx naming the field; one refused while it runs gets ``{"error", "category": "user"}`` as
its future's result, which the SDK raises as ``RequestFailedError`` without retrying. Nothing is applied half: every
datum of a call is checked before any is computed.
"""
from __future__ import annotations

import secrets
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, StrictStr

from grpo_core.outside.endpoint import requests as door
from grpo_core.outside.tinker.errors import TinkerRequestError
from grpo_core.outside.tinker.futures import POLL_SECONDS
from grpo_core.outside.tinker.service import TinkerService
from grpo_core.outside.tinker.snapshots import SampleCall
from grpo_core.outside.tinker.trainee import AdamStep
from grpo_core.outside.tinker.wire import read_forward_backward

MAX_BODY_BYTES = 64 * 2**20  # the SDK splits forward_backward at about 5 MB; a sample's prompt is token ids
CLIENT_CONFIG = {"pjwt_auth_enabled": False, "use_pyqwest_transport": False, "parallel_fwdbwd_chunks": False,
                 "proto_compress_fwdbwd": False, "sample_use_retrieve_futures": False,
                 "custom_loss_server_side": False, "sample_join_sampling_session": False}


class WeightsInfoRequest(BaseModel):
    """``get_weights_info_by_tinker_path``'s body (the SDK sends a dict, it has no request model for it)."""
    model_config = ConfigDict(extra="forbid")
    tinker_path: StrictStr


def _typed(model_cls, body: Any):
    """A JSON body as one of the SDK's request models; pydantic's refusal as ours, naming the field."""
    from pydantic import ValidationError

    try:
        return model_cls.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise TinkerRequestError(f"{where}: {first['msg']}", field=where) from None


def _future(request_id: str, model_id: str | None = None, sequence_ids: list[str] | None = None) -> dict:
    out: dict[str, Any] = {"request_id": request_id}
    if model_id is not None:
        out["model_id"] = model_id
    if sequence_ids is not None:
        out["sample_sequence_ids"] = sequence_ids
    return out


class TinkerApp:
    def __init__(self, service: TinkerService, api_key: str):
        if not api_key.startswith("tml-"):
            raise ValueError("the API key must start with 'tml-' (the tinker SDK refuses any other)")
        self.service, self.api_key = service, api_key

    def check_key(self, headers) -> None:
        """``X-API-Key`` equal to the server's, compared as bytes in constant time; else a 401 refusal."""
        given = headers.get("x-api-key", "").encode("utf-8", "surrogatepass")
        if not secrets.compare_digest(given, self.api_key.encode("utf-8", "surrogatepass")):
            raise TinkerRequestError("missing or wrong X-API-Key", field="X-API-Key", status=401)

    # ------------------------------------------------------------------------------------------- routes
    def create_session(self, body: Any) -> dict:
        from tinker import types

        req = _typed(types.CreateSessionRequest, body)
        return self.service.create_session(req.user_metadata, req.display_name)

    def heartbeat(self, body: Any) -> dict:
        from tinker import types

        return self.service.heartbeat(_typed(types.SessionHeartbeatRequest, body).session_id)

    def create_model(self, body: Any) -> dict:
        from tinker import types

        req = _typed(types.CreateModelRequest, body)
        request_id = self.service.create_model(req.session_id, req.model_seq_id, req.base_model, req.lora_config,
                                               req.optimizer_config.type)
        return _future(request_id, f"{req.session_id}:train:{req.model_seq_id}")

    def get_info(self, body: Any) -> dict:
        from tinker import types

        return self.service.get_info(_typed(types.GetInfoRequest, body).model_id)

    def optim_step(self, body: Any) -> dict:
        from tinker import types

        req = _typed(types.OptimStepRequest, body)
        p = req.optim_params
        if not isinstance(p, types.AdamParams):
            raise TinkerRequestError(f"optimizer_params of type {getattr(p, 'type', '?')!r}: this server steps with "
                                     "AdamW (adam_params)", field="optimizer_params")
        checks = {"learning_rate": (p.learning_rate, 0, None), "beta1": (p.beta1, 0, 1), "beta2": (p.beta2, 0, 1),
                  "eps": (p.eps, 0, None), "weight_decay": (p.weight_decay, 0, None),
                  "grad_clip_norm": (p.grad_clip_norm, 0, None)}
        for name, (value, low, high) in checks.items():
            inside = value == value and value >= low and (high is None or value < high) and value != float("inf")
            if not inside:
                span = f"[{low}, {high})" if high is not None else f">= {low} and finite"
                raise TinkerRequestError(f"adam_params.{name} is {value}; {span}", field=f"adam_params.{name}")
        adam = AdamStep(p.learning_rate, p.beta1, p.beta2, p.eps, p.weight_decay, p.grad_clip_norm)
        return _future(self.service.optim_step(req.model_id, req.seq_id, adam), req.model_id)

    def save_weights(self, body: Any) -> dict:
        from tinker import types

        req = _typed(types.SaveWeightsRequest, body)
        return _future(self.service.save_state(req.model_id, req.seq_id, req.path, req.overwrite), req.model_id)

    def save_for_sampler(self, body: Any) -> dict:
        from tinker import types

        req = _typed(types.SaveWeightsForSamplerRequest, body)
        if req.kind != "snapshot":
            raise TinkerRequestError(f"kind {req.kind!r}: this server serves snapshot sampler weights",
                                     field="kind")
        return _future(self.service.save_for_sampler(req.model_id, req.seq_id, req.path,
                                                     req.sampling_session_seq_id), req.model_id)

    def load_weights(self, body: Any) -> dict:
        from tinker import types

        req = _typed(types.LoadWeightsRequest, body)
        if req.model_id is not None:
            return _future(self.service.load_state(req.model_id, req.seq_id, req.path, req.optimizer), req.model_id)
        if req.session_id is None or req.model_seq_id is None:
            raise TinkerRequestError("load_weights needs model_id (load into a model) or session_id and "
                                     "model_seq_id (a new model from the checkpoint)", field="model_id")
        request_id = self.service.create_from_state(req.session_id, req.model_seq_id, req.path, req.optimizer,
                                                    req.base_model)
        return _future(request_id, f"{req.session_id}:train:{req.model_seq_id}")

    def create_sampling_session(self, body: Any) -> dict:
        from tinker import types

        req = _typed(types.CreateSamplingSessionRequest, body)
        return self.service.create_sampling_session(req.session_id, req.sampling_session_seq_id, req.base_model,
                                                    req.model_path)

    def sample(self, body: Any) -> dict:
        from tinker import types

        req = _typed(types.SampleRequest, body)
        unsupported = {"prompt_alt_tokens_k": req.prompt_alt_tokens_k,
                       "target_prompt_logprobs": req.target_prompt_logprobs,
                       "record_stability_info": req.record_stability_info}
        for name, value in unsupported.items():
            if value:
                raise TinkerRequestError(f"{name}: not served by this server yet", field=name)
        prompt: list[int] = []
        for k, chunk in enumerate(req.prompt.chunks):
            if getattr(chunk, "type", None) != "encoded_text":
                raise TinkerRequestError(f"prompt.chunks[{k}]: a {getattr(chunk, 'type', '?')} chunk; this server "
                                         "serves text models (encoded_text only)", field=f"prompt.chunks[{k}]")
            prompt.extend(int(t) for t in chunk.tokens)
        sp = req.sampling_params
        stop = [sp.stop] if isinstance(sp.stop, str) else (list(sp.stop) if sp.stop is not None else None)
        call = SampleCall(prompt=prompt, num_samples=req.num_samples, max_tokens=sp.max_tokens,
                          temperature=float(sp.temperature), top_p=float(sp.top_p), top_k=int(sp.top_k),
                          seed=sp.seed, stop=stop, prompt_logprobs=bool(req.prompt_logprobs),
                          topk_prompt_logprobs=int(req.topk_prompt_logprobs or 0),
                          topk_sample_logprobs=int(req.topk_sample_logprobs or 0),
                          prompt_logprobs_last_n=req.prompt_logprobs_last_n)
        request_id, sequence_ids = self.service.sample(req.sampling_session_id, req.seq_id, req.model_path,
                                                       req.base_model, call)
        return _future(request_id, sequence_ids=sequence_ids)

    def weights_info(self, body: Any) -> dict:
        return self.service.weights_info(_typed(WeightsInfoRequest, body).tinker_path)

    def finish(self, body: Any, session_id: str) -> dict:
        reason = body.get("reason", {}).get("type", "") if isinstance(body, dict) else ""
        return self.service.finish(session_id, str(reason))

    def capabilities(self) -> dict:
        return {"supported_models": [{"model_name": self.service.base_folder,
                                      "max_context_length": self.service.max_model_len,
                                      "trainable": True, "sampleable": True}]}

    # ------------------------------------------------------------------------------------------- the app
    def app(self):
        import anyio
        from fastapi import FastAPI, Request
        from fastapi.responses import JSONResponse

        api = FastAPI(title="grpo tinker service", docs_url=None, redoc_url=None, openapi_url=None)

        def refused(exc: TinkerRequestError) -> JSONResponse:
            return JSONResponse(exc.body(), status_code=exc.status)

        def route(handler: Callable[..., dict], raw: bool = False, query: tuple[str, ...] = ()):
            """``query``: the query parameters the handler takes (as text, when sent)."""
            async def serve(request: Request):
                try:
                    self.check_key(request.headers)
                    body = await _body_bytes(request)
                    params = {**{k: request.query_params[k] for k in query if k in request.query_params},
                              **request.path_params}
                    out = await anyio.to_thread.run_sync(
                        lambda: handler(body if raw else _read_json(body), **params))
                except TinkerRequestError as exc:
                    return refused(exc)
                return JSONResponse(out)
            serve.__annotations__ = {"request": Request}
            return serve

        async def retrieve(request: Request):
            return await self._retrieve(request, _body_bytes, _read_json, refused)
        retrieve.__annotations__ = {"request": Request}

        async def healthz() -> dict:
            return {"status": "ok"}

        post = {"create_session": self.create_session, "session_heartbeat": self.heartbeat,
                "create_model": self.create_model, "get_info": self.get_info, "optim_step": self.optim_step,
                "save_weights": self.save_weights, "save_weights_for_sampler": self.save_for_sampler,
                "load_weights": self.load_weights, "create_sampling_session": self.create_sampling_session,
                "asample": self.sample, "client/config": lambda body: CLIENT_CONFIG,
                "telemetry": lambda body: {"status": "accepted"}, "weights_info": self.weights_info}
        for path, handler in post.items():
            api.add_api_route(f"/api/v1/{path}", route(handler), methods=["POST"])
        api.add_api_route("/api/v1/forward_backward",
                          route(lambda body: self._forward_backward(body), raw=True), methods=["POST"])
        api.add_api_route("/api/v1/sessions/{session_id}/finish", route(self.finish), methods=["POST"])
        api.add_api_route("/api/v1/sessions/{session_id}", route(
            lambda body, session_id, **query: self.service.session_info(session_id, **query),
            query=("access_scope",)), methods=["GET"])
        api.add_api_route("/api/v1/samplers/{sampler_id}",
                          route(lambda body, sampler_id: self.service.sampler_info(sampler_id)), methods=["GET"])
        reads = {"sessions": (self.service.list_sessions, ("limit", "offset", "access_scope")),
                 "training_runs": (self.service.list_training_runs, ("limit", "offset")),
                 "checkpoints": (self.service.list_user_checkpoints, ("limit", "offset")),
                 "get_server_capabilities": (self.capabilities, ())}
        for path, (listing, query) in reads.items():
            api.add_api_route(f"/api/v1/{path}", route(lambda body, _of=listing, **q: _of(**q), query=query),
                              methods=["GET"])
        runs = "/api/v1/training_runs/{model_id}"
        api.add_api_route(f"{runs}/checkpoints", route(lambda body, model_id: self.service.list_checkpoints(model_id)),
                          methods=["GET"])
        api.add_api_route(f"{runs}/checkpoints/{{checkpoint_id:path}}", route(
            lambda body, model_id, checkpoint_id: self.service.delete_checkpoint(model_id, checkpoint_id)),
            methods=["DELETE"])
        api.add_api_route(runs, route(lambda body, model_id: self.service.training_run(model_id)), methods=["GET"])
        api.add_api_route("/api/v1/retrieve_future", retrieve, methods=["POST"])
        api.add_api_route("/api/v1/healthz", healthz, methods=["GET"])

        @api.exception_handler(404)
        async def not_found(request: Request, exc: Exception):
            return refused(TinkerRequestError(f"no route {request.method} {request.url.path} on this server",
                                              status=404))

        @api.exception_handler(405)
        async def not_allowed(request: Request, exc: Exception):
            return refused(TinkerRequestError(f"{request.method} is not allowed on {request.url.path}", status=405))

        @api.exception_handler(Exception)
        async def failed(request: Request, exc: Exception):
            return JSONResponse({"detail": f"the server failed on {request.url.path}: {type(exc).__name__}: {exc}"},
                                status_code=500)
        return api

    async def _retrieve(self, request, body_bytes, read_json, refused):
        """``retrieve_future``: the result when it is ready within ``POLL_SECONDS``, else 408 "try again" (the SDK
        polls again at once, quietly); a failure as ``{"error", "category"}``; forward_backward and sample results
        as protobuf."""
        from fastapi.responses import JSONResponse, Response

        try:
            self.check_key(request.headers)
            body = read_json(await body_bytes(request))
            request_id = str(body.get("request_id", "")) if isinstance(body, dict) else ""
            if not self.service.futures.known(request_id):
                raise TinkerRequestError(f"no request {request_id!r} on this server", field="request_id",
                                         status=404)
        except TinkerRequestError as exc:
            return refused(exc)
        outcome = await self.service.futures.wait_async(request_id, POLL_SECONDS)
        if outcome is None:
            return JSONResponse({"type": "try_again", "request_id": request_id, "queue_state": "active"},
                                status_code=408)
        if outcome.error is not None:
            return JSONResponse({"error": outcome.error, "category": outcome.category})
        if outcome.proto is not None:
            return Response(outcome.proto, media_type="application/x-protobuf")
        return JSONResponse(outcome.json)

    def _forward_backward(self, body: bytes) -> dict:
        call = read_forward_backward(body)
        return _future(self.service.forward_backward(call), call.model_id)


class TinkerServer:
    """Serves a ``TinkerApp`` with uvicorn on a thread of this process."""

    def __init__(self, app: TinkerApp, host: str = "127.0.0.1", port: int = 0):
        from grpo_core.infra.app_thread import AppThread

        self.app = app
        self._served = AppThread(app.app(), host, port, "tinker service")
        self.host, self.port = self._served.host, self._served.port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> "TinkerServer":
        self._served.start(timeout)
        return self

    def stop(self) -> None:
        self._served.stop()
        self.app.service.close()


async def _body_bytes(request: Any) -> bytes:
    """A request's body, refused (413) past ``MAX_BODY_BYTES`` whether or not it declares its length."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise TinkerRequestError(f"the body is {declared} bytes; at most {MAX_BODY_BYTES}", status=413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise TinkerRequestError(f"the body passed {MAX_BODY_BYTES} bytes", status=413)
        chunks.append(chunk)
    return b"".join(chunks)


def _read_json(raw: bytes) -> Any:
    """A JSON body through the endpoint's door (depth, size, surrogates), its refusal as the service's."""
    try:
        return door.read_json(raw) if raw else {}
    except door.RequestError as exc:
        raise TinkerRequestError(str(exc), field=exc.param) from None
