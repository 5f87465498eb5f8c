"""The SDK's protobuf messages, read and written: a ``forward_backward`` request arrives as a serialized
``ForwardBackwardRequest`` (not JSON), and its result and a sample's go back as ``ForwardBackwardOutput`` and
``SampleResponse`` (the SDK refuses them as JSON). The message classes are the SDK's own generated module, so the
server and the client cannot drift apart.

Everything that can be checked without the model is checked here, once, naming the field: token bytes that are not
whole int32s, dtypes and shapes that disagree with the datum's length, non-finite inputs, chunk kinds a text model
cannot take, loss settings that are not numbers. Token ids against the vocabulary and the context are the trainee's
to check (it knows them).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from google.protobuf.message import DecodeError

from grpo_core.outside.tinker.errors import TinkerRequestError

INT_DTYPES = {3: np.dtype("<i4"), 2: np.dtype("<i8")}        # DTYPE_INT32, DTYPE_INT64
FLOAT_DTYPES = {1: np.dtype("<f4")}                          # DTYPE_FLOAT32 (the SDK sends no other float)
INTEGER_INPUTS = ("target_tokens",)


@dataclass(frozen=True)
class TrainDatum:
    """One datum: the model's input tokens [N] and its loss inputs, each [N] (``target_tokens`` int64, the others
    float32): position i of the input predicts ``target_tokens[i]``."""

    tokens: np.ndarray
    inputs: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return int(self.tokens.shape[0])


@dataclass(frozen=True)
class ForwardBackwardCall:
    model_id: str
    seq_id: int
    loss_fn: str
    config: dict[str, float]
    forward_only: bool
    data: list[TrainDatum]


def _pb():
    from tinker.proto import tinker_public_pb2

    return tinker_public_pb2


def _tensor(msg, where: str, length: int, integer: bool) -> np.ndarray:
    if msg.HasField("sparse_csr"):
        raise TinkerRequestError(f"{where}: sparse tensors ((N, K) top-K targets) are not served yet; send a dense "
                                 "(N,) tensor", field=where)
    dtypes = INT_DTYPES if integer else FLOAT_DTYPES
    if msg.dtype not in dtypes:
        names = "int64 or int32" if integer else "float32"
        raise TinkerRequestError(f"{where}: dtype {msg.dtype} where {names} is expected", field=where)
    dtype = dtypes[msg.dtype]
    if len(msg.dense) % dtype.itemsize:
        raise TinkerRequestError(f"{where}: {len(msg.dense)} bytes is not a whole number of {dtype.name} values",
                                 field=where)
    values = np.frombuffer(msg.dense, dtype=dtype)
    shape = list(msg.shape) or [values.shape[0]]
    if shape != [length] or values.shape[0] != length:
        raise TinkerRequestError(f"{where}: shape {shape} ({values.shape[0]} values) where the datum's model_input "
                                 f"has {length} tokens: every loss input is (N,) with N = model_input.length", field=where)
    if integer:
        return values.astype(np.int64)
    if not np.isfinite(values).all():
        raise TinkerRequestError(f"{where}: holds a non-finite value (NaN or infinity)", field=where)
    return values.astype(np.float32)


def _datum(msg, i: int) -> TrainDatum:
    pieces = []
    for k, chunk in enumerate(msg.model_input):
        kind = chunk.WhichOneof("chunk") or "empty"
        where = f"data[{i}].model_input.chunks[{k}]"
        if kind != "encoded_text":
            raise TinkerRequestError(f"{where}: a {kind} chunk; this server serves text models (encoded_text only)",
                                     field=where)
        raw = chunk.encoded_text.tokens
        if len(raw) % 4:
            raise TinkerRequestError(f"{where}.tokens: {len(raw)} bytes is not a whole number of int32 token ids",
                                     field=f"{where}.tokens")
        pieces.append(np.frombuffer(raw, dtype="<i4"))
    tokens = np.concatenate(pieces).astype(np.int64) if pieces else np.zeros(0, dtype=np.int64)
    if tokens.shape[0] == 0:
        raise TinkerRequestError(f"data[{i}].model_input: no tokens", field=f"data[{i}].model_input")
    inputs = {}
    for name, tensor in msg.loss_fn_inputs.items():
        where = f'data[{i}].loss_fn_inputs["{name}"]'
        inputs[name] = _tensor(tensor, where, tokens.shape[0], integer=name in INTEGER_INPUTS)
    return TrainDatum(tokens=tokens, inputs=inputs)


def _config(msg) -> dict[str, float]:
    """The loss settings: the v2 map where the SDK wrote it (it writes both), else the legacy float map."""
    config: dict[str, float] = {}
    for key, value in msg.loss_fn_config_v2.items():
        if value.WhichOneof("value") == "text":
            raise TinkerRequestError(f'loss_fn_config["{key}"]: a text value ({value.text!r}); the served losses '
                                     "take numbers only", field=f'loss_fn_config["{key}"]')
        config[key] = float(value.number)
    for key, value in msg.loss_fn_config.items():
        config.setdefault(key, float(value))
    for key, value in config.items():
        if not math.isfinite(value):
            raise TinkerRequestError(f'loss_fn_config["{key}"] is {value}', field=f'loss_fn_config["{key}"]')
    return config


def read_forward_backward(body: bytes) -> ForwardBackwardCall:
    """A ``ForwardBackwardRequest`` body -> the call, every datum checked (``TinkerRequestError`` names the field)."""
    msg = _pb().ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except DecodeError as exc:
        raise TinkerRequestError(f"the body is not a ForwardBackwardRequest protobuf message: {exc}") from None
    if not msg.model_id:
        raise TinkerRequestError("model_id is missing", field="model_id")
    if not msg.data:
        raise TinkerRequestError("data is empty: forward_backward needs at least one datum", field="data")
    data = [_datum(d, i) for i, d in enumerate(msg.data)]
    return ForwardBackwardCall(model_id=msg.model_id, seq_id=int(msg.seq_id), loss_fn=msg.loss_fn or "",
                               config=_config(msg), forward_only=bool(msg.forward_only), data=data)


def _batched(arrays: list[np.ndarray]):
    """Per-datum float32 arrays [N_i] -> one ``BatchedTensor`` (concatenated, with byte offsets)."""
    pb = _pb()
    flat = [np.ascontiguousarray(a, dtype="<f4") for a in arrays]
    offsets = np.zeros(len(flat) + 1, dtype="<i8")
    offsets[1:] = np.cumsum([a.nbytes for a in flat])
    return pb.BatchedTensor(data=b"".join(a.tobytes() for a in flat), offsets=offsets.tobytes(),
                            dtype=pb.DTYPE_FLOAT32)


def forward_backward_output(outputs: dict[str, list[np.ndarray]], count: int, metrics: dict[str, float]) -> bytes:
    """``outputs[name][i]``: datum i's array [N_i] (``logprobs``, ``elementwise_loss``); metric keys are
    ``name:reduction`` as the SDK merges them across chunks."""
    pb = _pb()
    record = pb.ArrayRecord(type_tag="ArrayRecord", num_datums=count)
    for name, arrays in outputs.items():
        record.fields[name].CopyFrom(_batched(arrays))
    msg = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=[record])
    for key, value in metrics.items():
        msg.metrics[key] = float(value)
    return msg.SerializeToString()


# The SDK's filler for a top-k slot with no token (a position not scored, or fewer than k candidates).
TOPK_EMPTY_TOKEN, TOPK_EMPTY_LOGPROB = 0, -99999.0


@dataclass(frozen=True)
class TopK:
    """The k most likely tokens at each position, most likely first: two [positions, k] arrays (int32 ids, float32
    logprobs), empty slots filled as the SDK reads them (token 0, logprob -99999)."""

    token_ids: np.ndarray
    logprobs: np.ndarray


def _topk_message(msg, topk: TopK) -> None:
    length, k = topk.token_ids.shape
    msg.CopyFrom(_pb().TopkLogprobs(token_ids=topk.token_ids.tobytes(), logprobs=topk.logprobs.tobytes(), k=k,
                                    length=length))


@dataclass(frozen=True)
class SampledTokens:
    """One sampled sequence: its tokens (the stop token included), their sampler logprobs, and the top k at each
    position when asked."""

    tokens: list[int]
    logprobs: list[float]
    stop_reason: str  # "stop" (EOS or a stop sequence) or "length"
    topk: TopK | None = None


def sample_response(sequences: list[SampledTokens], prompt_logprobs: list[float | None] | None,
                    topk_prompt: TopK | None = None) -> bytes:
    pb = _pb()
    msg = pb.SampleResponse()
    for seq in sequences:
        added = msg.sequences.add(
            stop_reason=pb.STOP_REASON_STOP if seq.stop_reason == "stop" else pb.STOP_REASON_LENGTH,
            tokens=np.asarray(seq.tokens, dtype="<i4").tobytes(),
            logprobs=np.asarray(seq.logprobs, dtype="<f4").tobytes())
        if seq.topk is not None:
            _topk_message(added.topk_sampled_logprobs, seq.topk)
    if prompt_logprobs is not None:
        values = [math.nan if v is None else v for v in prompt_logprobs]
        msg.prompt_logprobs = np.asarray(values, dtype="<f4").tobytes()
    if topk_prompt is not None:
        _topk_message(msg.topk_prompt_logprobs, topk_prompt)
    return msg.SerializeToString()
