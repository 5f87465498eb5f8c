"""The gloo weight transport on vLLM's RL weight-transfer API, between real processes.

A spawned sampler process holds an in-process vLLM ``LLM`` of the tiny model created with
``weight_transfer_config={"backend": "gloo"}``; this process is the trainer: it holds the same model in transformers,
changes its weights, and pushes them with ``GlooTrainerWeightTransferEngine`` through a small pipe client that
implements vLLM's ``VLLMWeightSyncClient``. After each sync the sampler's prompt logprobs must equal the trainer's.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import subprocess
import threading
import time
import traceback
from typing import Any

import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600),
              # vLLM's pack_tensors warns about a tensor larger than the bucket: the small-bucket test wants that
              pytest.mark.filterwarnings("ignore:Tensor .* exceeds buffer_size_bytes")]

LOOPBACK = "127.0.0.1"
SEQUENCES = [[3 + (7 * i + 11 * j) % 380 for j in range(10 + 3 * i)] for i in range(4)]
SAMPLER_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_HOST_IP": LOOPBACK, "HF_HUB_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1"}


# ------------------------------------------------------------------------------------- the sampler process

def sampler_main(conn, model_path: str, max_model_len: int = 256) -> None:
    """A sampler: in-process vLLM (the settings of grpo_core/engine/rollout/sampler.py) with the gloo engine; serves
    commands from ``conn`` until "stop"."""
    os.environ.update(SAMPLER_ENV)
    try:
        from grpo_core.weights.gloo import register

        register()  # before the LLM: the worker creates its transfer engine in load_model
        from vllm import LLM

        started = time.perf_counter()
        llm = LLM(model=model_path, dtype="float32", seed=0, enforce_eager=True, max_model_len=max_model_len,
                  distributed_executor_backend="uni", kv_cache_memory_bytes=64 * 2**20,
                  worker_extension_cls="grpo_core.engine.rollout.worker_ext.WeightReceiver",
                  logprobs_mode="processed_logprobs", enable_prefix_caching=False, enable_chunked_prefill=False,
                  max_num_batched_tokens=max(8192, max_model_len), weight_transfer_config={"backend": "gloo"})
        conn.send(("ok", {"load_seconds": time.perf_counter() - started, "pid": os.getpid()}))
    except BaseException:  # noqa: BLE001 - report, the parent fails the test
        conn.send(("err", traceback.format_exc()))
        return
    while True:
        cmd, arg = conn.recv()
        if cmd == "stop":
            conn.send(("ok", None))
            return
        try:
            conn.send(("ok", _sampler_command(llm, cmd, arg)))
        except BaseException:  # noqa: BLE001
            conn.send(("err", traceback.format_exc()))


def _worker_engine(llm):
    return llm.llm_engine.model_executor.driver_worker.worker.weight_transfer_engine


def _sampler_command(llm, cmd: str, arg: Any) -> Any:
    if cmd == "init":
        llm.init_weight_transfer_engine({"init_info": arg})
        return None
    if cmd == "start":
        llm.start_weight_update()
        return None
    if cmd == "update":
        llm.update_weights({"update_info": arg})
        return dict(_worker_engine(llm).last_receive)
    if cmd == "finish":
        llm.finish_weight_update(arg)
        llm.reset_prefix_cache()
        return llm.get_weight_version()
    if cmd == "shutdown_transfer":
        llm.shutdown_weight_transfer_engine()
        return None
    if cmd == "logprobs":
        return prompt_logprobs(llm, arg)
    if cmd == "inprocess_reload":  # what worker_ext.py does today, from a safetensors file, timed
        from safetensors.torch import load_file

        weights = list(load_file(arg).items())
        started = time.perf_counter()
        llm.collective_rpc("grpo_load_weights", args=(weights,))
        llm.reset_prefix_cache()
        return time.perf_counter() - started
    raise ValueError(f"unknown command {cmd!r}")


def prompt_logprobs(llm, sequences: list[list[int]]) -> list[list[float]]:
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)
    outs = llm.generate([TokensPrompt(prompt_token_ids=s) for s in sequences], params, use_tqdm=False)
    return [[out.prompt_logprobs[i][s[i]].logprob for i in range(1, len(s))] for s, out in zip(sequences, outs)]


class PipeClient:
    """``VLLMWeightSyncClient`` over a pipe to the sampler process: each call blocks until the sampler answered."""

    def __init__(self, conn, process, timeout_s: float = 300.0) -> None:
        self.conn, self.process, self.timeout_s = conn, process, timeout_s
        self.lock = threading.Lock()
        self.last_update: dict[str, float] = {}

    def call(self, cmd: str, arg: Any = None) -> Any:
        with self.lock:
            self.conn.send((cmd, arg))
            return self._answer()

    def _answer(self) -> Any:
        deadline = time.monotonic() + self.timeout_s
        while not self.conn.poll(0.5):
            if not self.process.is_alive():
                raise RuntimeError(f"sampler process died (exit code {self.process.exitcode})")
            if time.monotonic() > deadline:
                raise TimeoutError("sampler did not answer")
        status, value = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"sampler failed:\n{value}")
        return value

    # -- VLLMWeightSyncClient
    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.call("init", init_info)

    def start_weight_update(self) -> None:
        self.call("start")

    def update_weights(self, update_info) -> None:
        self.last_update = self.call("update", update_info)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.call("finish", weight_version)


class FanOutClient:
    """One ``VLLMWeightSyncClient`` over several samplers: every call goes to all of them at once (init and update
    block until the whole group is there); sampler k's workers sit at ``rank_offset + k``."""

    def __init__(self, clients: list[PipeClient]) -> None:
        self.clients = clients

    def _all(self, fn) -> None:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(len(self.clients)) as pool:
            for future in [pool.submit(fn, k, c) for k, c in enumerate(self.clients)]:
                future.result()

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._all(lambda k, c: c.init_weight_transfer_engine({**init_info,
                                                              "rank_offset": init_info["rank_offset"] + k}))

    def start_weight_update(self) -> None:
        self._all(lambda k, c: c.start_weight_update())

    def update_weights(self, update_info) -> None:
        self._all(lambda k, c: c.update_weights(update_info))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._all(lambda k, c: c.finish_weight_update(weight_version))


def start_sampler(model_path: str, **kwargs):
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=sampler_main, args=(child, model_path), kwargs=kwargs, daemon=True)
    process.start()
    client = PipeClient(parent, process)
    info = client._answer()
    return process, client, info


def stop_sampler(process, client) -> None:
    try:
        if process.is_alive():
            client.call("stop")
    except Exception:  # noqa: BLE001
        pass
    process.join(30)
    if process.is_alive():
        process.kill()
        process.join(10)


# ------------------------------------------------------------------------------------------ the trainer side

def hf_logprobs(model, sequences: list[list[int]]) -> list[list[float]]:
    out = []
    with torch.no_grad():
        for s in sequences:
            ids = torch.tensor([s])
            logp = torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)[0]
            out.append([logp[i - 1, s[i]].item() for i in range(1, len(s))])
    return out


def max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


def perturb(model, seed: int, scale: float = 0.02) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * scale)


def listeners(pids: set[int]) -> set[tuple[str, int]]:
    """(local address, pid) of every TCP socket listening in ``pids`` (``ss -tlnp``)."""
    import re

    text = subprocess.run(["ss", "-Htlnp"], capture_output=True, text=True, check=True).stdout
    found = set()
    for line in text.splitlines():
        cols = line.split()
        if len(cols) < 6:
            continue
        for pid in re.findall(r"pid=(\d+)", cols[5]):
            if int(pid) in pids:
                found.add((cols[3], int(pid)))
    return found


# ----------------------------------------------------------------------------------------------------- tests

@pytest.fixture(scope="module")
def sampler(tiny_model):
    process, client, info = start_sampler(tiny_model)
    try:
        yield client, info
    finally:
        stop_sampler(process, client)


@pytest.fixture(scope="module")
def trainer_model(tiny_model):
    from transformers import AutoModelForCausalLM

    from grpo_core.weights.gloo import register

    register()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    model.eval()
    assert model.config.tie_word_embeddings, "the tiny model has tied embeddings: the test covers the lm_head rule"
    return model


def _trainer_engine(client, model, bucket_bytes: int, source=None, world_size: int = 2):
    from vllm.distributed.weight_transfer import ModuleSource, WeightTransferTrainerFactory

    from grpo_core.weights.gloo import GlooTrainerInitInfo, GlooTrainerWeightTransferEngine

    info = GlooTrainerInitInfo(master_address=LOOPBACK, master_port=0, world_size=world_size,
                               bucket_bytes=bucket_bytes, timeout_s=120, rank=0)
    engine = WeightTransferTrainerFactory.trainer_init(info, client=client, source=source or ModuleSource(model))
    assert isinstance(engine, GlooTrainerWeightTransferEngine)
    return engine


def _largest_and_total(model) -> tuple[int, int]:
    sizes = [p.numel() * p.element_size() for p in model.parameters()]
    return max(sizes), sum(sizes)


def test_small_buckets_two_syncs_reuse_the_group(sampler, trainer_model):
    client, info = sampler
    model = trainer_model
    largest, total = _largest_and_total(model)
    bucket = largest // 4  # smaller than the largest tensor (the embedding)
    original = hf_logprobs(model, SEQUENCES)
    served = client.call("logprobs", SEQUENCES)
    # Sanity: vLLM serves what transformers computes (the checkpoint, or the last sync of an earlier test).
    assert max_diff(served, original) < 1e-4

    pids = {os.getpid(), info["pid"]}
    before = listeners(pids) if shutil.which("ss") else None
    engine = _trainer_engine(client, model, bucket)
    try:
        if before is not None:  # everything the group opened listens on loopback only
            new = listeners(pids) - before
            assert new, "the gloo group opened no listening socket?"
            assert all(addr.startswith(f"{LOOPBACK}:") for addr, _ in new), new

        for step, seed in enumerate((1, 2)):
            perturb(model, seed)
            expected = hf_logprobs(model, SEQUENCES)
            assert max_diff(expected, original) > 1e-3, "the change must move the logprobs, or the test proves nothing"
            engine.send_weights(weight_version=f"v{step + 1}")
            got = client.call("logprobs", SEQUENCES)
            assert max_diff(got, expected) < 1e-4, f"sync {step + 1}: sampler does not serve the trainer's weights"
            assert engine.last_send["buckets"] > len(list(model.parameters())) / 2  # really bucketed
            assert client.last_update["buckets"] == engine.last_send["buckets"]
            assert engine.last_send["bytes"] == total == client.last_update["bytes"]
            original = expected
    finally:
        client.call("shutdown_transfer")
        engine.shutdown()


def test_one_bucket_larger_than_the_model_and_a_state_dict_source(sampler, trainer_model):
    """A new group after the previous one was shut down, one bucket for everything, and a source built from the
    state dict, which carries ``lm_head.weight`` of the tied model: the sampler must ignore it."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class StateDictSource(WeightSource):
        def __init__(self, module):
            self.module = module

        def metadata(self):
            return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in self.module.state_dict().items()]

        def __iter__(self):
            yield from self.module.state_dict().items()

    client, _ = sampler
    model = trainer_model
    _, total = _largest_and_total(model)
    assert "lm_head.weight" in model.state_dict()
    engine = _trainer_engine(client, model, bucket_bytes=4 * total, source=StateDictSource(model))
    try:
        before = hf_logprobs(model, SEQUENCES)
        perturb(model, 3)
        expected = hf_logprobs(model, SEQUENCES)
        assert max_diff(expected, before) > 1e-3
        engine.send_weights()
        assert engine.last_send["buckets"] == 1
        assert engine.last_send["bytes"] > total  # lm_head.weight travelled (and was dropped by the sampler)
        assert max_diff(client.call("logprobs", SEQUENCES), expected) < 1e-4
    finally:
        client.call("shutdown_transfer")
        engine.shutdown()


def test_two_samplers_in_one_group(sampler, trainer_model, tiny_model):
    """Trainer + two sampler processes (ranks 1 and 2): one broadcast reaches both."""
    first, _ = sampler
    process, second, _ = start_sampler(tiny_model)
    engine = None
    try:
        client = FanOutClient([first, second])
        engine = _trainer_engine(client, trainer_model, bucket_bytes=2**20, world_size=3)
        before = hf_logprobs(trainer_model, SEQUENCES)
        perturb(trainer_model, 4)
        expected = hf_logprobs(trainer_model, SEQUENCES)
        assert max_diff(expected, before) > 1e-3
        engine.send_weights(weight_version="two")
        for c in (first, second):
            assert max_diff(c.call("logprobs", SEQUENCES), expected) < 1e-4
    finally:
        for c in (first, second):
            try:
                c.call("shutdown_transfer")
            except Exception:  # noqa: BLE001
                pass
        if engine is not None:
            engine.shutdown()
        stop_sampler(process, second)
