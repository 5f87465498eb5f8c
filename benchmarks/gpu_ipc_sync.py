"""CUDA IPC weight sync between two processes on one GPU, done the way vLLM's ``ipc`` weight-transfer backend does it.

A trainer process holds a Qwen2 0.5B / 1.5B in bf16 (random weights, tied embeddings: ``lm_head`` is not sent); a
receiver process (spawned with torch.multiprocessing) holds a same-shaped copy. One sync = one
``IPCTrainerWeightTransferEngine.send_weights`` round, with the receiver playing the vLLM worker. What it mirrors
(vllm/distributed/weight_transfer/):

  * ``packed:MiB`` (what grpo_core uses: ``grpo_core/weights/transfer.py`` builds ``IPCTrainerInitInfo(packed=True,
    packed_buffer_size_bytes=weights.bucket_mb MiB)``): trainer ``ipc_engine._send_packed`` over
    ``packed_tensor.packed_ipc_producer``: one uint8 buffer of that size, exported once per round with
    ``reduce_tensor``; the tensors are copied into it in order, and when the next one would not fit, the current
    stream is synchronized and the chunk's metadata + the buffer's handle are sent (``update_weights``, blocking),
    then ``torch.cuda.ipc_collect()`` (``_post_send_sync``). A tensor larger than the buffer raises ValueError in
    vLLM: such a mode is reported as failing, not run. Receiver ``IPCWeightTransferEngine.receive_weights`` ->
    ``packed_ipc_consumer``: ``rebuild_cuda_tensor`` of the buffer through a ``PackedBufferImporter`` (one mapping
    per round, released in ``finish_weight_update``), ``unpack_tensor`` views, a ``clone()`` of each;
  * ``unpacked``: trainer ``_send_unpacked``: ``reduce_tensor`` of every parameter (``.detach().contiguous()``,
    references kept until after finish), all handles in one ``update_weights``; receiver: ``rebuild_cuda_tensor``
    per parameter (device index, args[6], overwritten with its own);
  * both: the handles travel as ``{gpu_uuid: reduce_tensor args}`` dicts in an ``IPCWeightTransferUpdateInfo``-like
    dict; the receiver copies each tensor into its parameter (``param.copy_``: what ``model.load_weights`` ends
    in for these same-shaped parameters) and ``torch.accelerator.synchronize()``s
    (``WeightTransferEngine.update_weights``) before acknowledging; start / update / finish are blocking calls.

What it does not mirror: the RPC that carries the calls (Ray actor calls or HTTP; here a multiprocessing Pipe, so
vLLM's request serialisation, scheduling and dispatch overhead is missing), the layerwise reload
(``initialize_layerwise_reload`` / ``finalize_layerwise_reload`` in start / finish) and the model loader's
``weight_loader`` (vLLM fuses q/k/v and gate/up: its copies go into slices of fused parameters), tensor parallelism
and the multi-rank handle all-gather. The trainer's parameters are separate allocations, as in an HF model (a
DeepSpeed ZeRO-1/2 learner keeps its bf16 parameters as views of a few flat buffers: fewer IPC mappings).

Per shape and mode it prints the bytes sent, the median sync time over ``--repeats`` rounds after ``--warmup``
(wall time on the trainer from the first call to the last acknowledgement; the trainer re-randomizes its weights
before every round, outside the timing), GB/s, the receiver's own share (rebuild + clone + copy + synchronize), the
number of update calls, and a floor: one same-process ``copy_`` of every parameter. After the last round the
receiver exports its parameters back over IPC and the trainer checks them bitwise (``check ok``).

    python benchmarks/gpu_ipc_sync.py --shapes 0.5b,1.5b --repeats 10
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.multiprocessing as mp
from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

CONFIGS = {  # Qwen2-0.5B / Qwen2-1.5B (config.json of the HF checkpoints)
    "0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, vocab_size=151936),
    "1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 intermediate_size=8960, vocab_size=151936),
}
DTYPE = torch.bfloat16
device_synchronize = getattr(getattr(torch, "accelerator", None), "synchronize", None) or torch.cuda.synchronize


def named_shapes(shape: str) -> tuple[list[tuple[str, tuple[int, ...]]], str]:
    """The parameters (name, shape) of the Qwen2 in HF order, tied lm_head not listed; and where they came from."""
    c = CONFIGS[shape]
    try:
        from transformers import Qwen2Config, Qwen2ForCausalLM

        with torch.device("meta"):
            model = Qwen2ForCausalLM(Qwen2Config(**c, tie_word_embeddings=True))
        return [(n, tuple(p.shape)) for n, p in model.named_parameters()], "transformers Qwen2Config"
    except ImportError:
        pass
    h, i, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    kv = c["num_key_value_heads"] * h // c["num_attention_heads"]
    out = [("model.embed_tokens.weight", (v, h))]
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        out += [(p + "self_attn.q_proj.weight", (h, h)), (p + "self_attn.q_proj.bias", (h,)),
                (p + "self_attn.k_proj.weight", (kv, h)), (p + "self_attn.k_proj.bias", (kv,)),
                (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.v_proj.bias", (kv,)),
                (p + "self_attn.o_proj.weight", (h, h)), (p + "mlp.gate_proj.weight", (i, h)),
                (p + "mlp.up_proj.weight", (i, h)), (p + "mlp.down_proj.weight", (h, i)),
                (p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,))]
    return out + [("model.norm.weight", (h,))], "hard-coded Qwen2 shapes"


# ---------------------------------------------------------------- receiver (the vLLM worker's side)

class PackedBufferImporter:
    """packed_tensor.PackedBufferImporter: one mapping of the trainer's buffer per round, released at finish."""

    def __init__(self) -> None:
        self._entry = None

    def rebuild(self, list_args: list) -> torch.Tensor:
        key = tuple(list_args)
        if self._entry is not None and self._entry[0] == key:
            return self._entry[1]
        self._entry = (key, rebuild_cuda_tensor(*list_args))
        return self._entry[1]

    def close(self) -> None:
        self._entry = None


def receive_weights(info: dict, packed: bool, importer: PackedBufferImporter, device: int, uuid: str):
    """IPCWeightTransferEngine.receive_weights up to (not including) model.load_weights."""
    if packed:  # packed_ipc_consumer + unpack_tensor
        args = list(info["ipc_handles"][uuid])
        args[6] = device
        buf = importer.rebuild(args)[: sum(info["tensor_sizes"])]
        parts = buf.split(info["tensor_sizes"])
        return [(n, t.contiguous().view(getattr(torch, d)).view(s).clone())
                for n, s, d, t in zip(info["names"], info["shapes"], info["dtype_names"], parts)]
    weights = []
    for name, handle in zip(info["names"], info["ipc_handles"]):
        args = list(handle[uuid])
        args[6] = device
        weights.append((name, rebuild_cuda_tensor(*args)))
    return weights


def receiver(conn, shapes: list) -> None:
    torch.cuda.set_device(0)
    device = torch.cuda.current_device()
    uuid = str(torch.cuda.get_device_properties(device).uuid)
    params = {n: torch.zeros(s, dtype=DTYPE, device="cuda") for n, s in shapes}
    importer, packed = PackedBufferImporter(), False
    conn.send(("ready", 0.0))
    while True:
        msg, payload = conn.recv()
        t0 = time.perf_counter()
        reply = None
        if msg == "init":  # init_transfer_engine: the trainer's `packed`
            packed = payload["packed"]
        elif msg == "start":  # vLLM: initialize_layerwise_reload(model), not mirrored
            pass
        elif msg == "update":
            weights = receive_weights(payload, packed, importer, device, uuid)
            for name, w in weights:  # model.load_weights -> weight_loader -> param.data.copy_(w)
                params[name].copy_(w)
            del weights
            device_synchronize()  # WeightTransferEngine.update_weights: torch.accelerator.synchronize()
        elif msg == "finish":  # finalize_layerwise_reload (not mirrored) + importer.close()
            importer.close()
        elif msg == "export":  # for the check: our parameters, back over IPC
            torch.cuda.synchronize()
            reply = [(n, reduce_tensor(p)[1]) for n, p in params.items()]
        elif msg == "stop":
            conn.send(("ok", 0.0))
            return
        conn.send((reply if reply is not None else "ok", time.perf_counter() - t0))


# ---------------------------------------------------------------- trainer (IPCTrainerWeightTransferEngine)

class Client:
    """The blocking client calls (Ray / HTTP in vLLM): send, wait for the acknowledgement; sums the receiver's time."""

    def __init__(self, conn) -> None:
        self.conn, self.remote_s, self.updates = conn, 0.0, 0

    def call(self, msg: str, payload=None):
        self.conn.send((msg, payload))
        reply, remote_s = self.conn.recv()
        self.remote_s += remote_s
        self.updates += msg == "update"
        return reply


def send_unpacked(params, client: Client, uuid: str) -> None:
    client.call("start")
    refs, info = [], {"names": [], "dtype_names": [], "shapes": [], "ipc_handles": []}
    for name, tensor in params:
        weight = tensor.detach().contiguous()
        refs.append(weight)
        info["names"].append(name)
        info["dtype_names"].append(str(tensor.dtype).split(".")[-1])
        info["shapes"].append(list(tensor.shape))
        info["ipc_handles"].append({uuid: reduce_tensor(weight)[1]})
    client.call("update", info)
    client.call("finish")
    torch.cuda.ipc_collect()
    del refs


def send_packed(params, client: Client, uuid: str, buffer_bytes: int) -> None:
    client.call("start")
    buf = torch.empty(buffer_bytes, dtype=torch.uint8, device="cuda")  # packed_ipc_producer
    handle = {uuid: reduce_tensor(buf)[1]}
    info, total = {"names": [], "dtype_names": [], "shapes": [], "tensor_sizes": []}, 0

    def flush() -> None:
        torch.cuda.current_stream().synchronize()
        client.call("update", dict(info, ipc_handles=handle))
        torch.cuda.ipc_collect()  # _post_send_sync

    for name, tensor in params:
        flat = tensor.contiguous().view(-1).view(torch.uint8)
        if flat.numel() > buffer_bytes:
            raise ValueError(f"{name}: {flat.numel()} bytes > buffer {buffer_bytes}")
        if total and total + flat.numel() > buffer_bytes:
            flush()
            info, total = {"names": [], "dtype_names": [], "shapes": [], "tensor_sizes": []}, 0
        buf[total: total + flat.numel()].copy_(flat)
        info["names"].append(name)
        info["dtype_names"].append(str(tensor.dtype).split(".")[-1])
        info["shapes"].append(list(tensor.shape))
        info["tensor_sizes"].append(flat.numel())
        total += flat.numel()
    if total:
        flush()
    client.call("finish")
    torch.cuda.ipc_collect()
    del buf


def local_copy_ms(params, repeats: int) -> float:
    """Floor: one same-process copy_ of every parameter into a second set (CUDA events, median)."""
    dst = [torch.empty_like(t) for _, t in params]
    times = []
    for _ in range(repeats + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for d, (_, t) in zip(dst, params):
            d.copy_(t)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    del dst
    return statistics.median(times[1:])


def check(params, client: Client) -> None:
    exported = client.call("export")
    assert [n for n, _ in exported] == [n for n, _ in params], "parameter names differ"
    for (name, t), (_, args) in zip(params, exported):
        theirs = rebuild_cuda_tensor(*args)
        assert torch.equal(t.view(torch.int16), theirs.view(torch.int16)), f"{name} differs after the sync"
        del theirs
    torch.cuda.ipc_collect()


def bench_shape(shape: str, modes: list[str], warmup: int, repeats: int) -> list[dict]:
    shapes, source = named_shapes(shape)
    nbytes = sum(torch.Size(s).numel() for _, s in shapes) * DTYPE.itemsize
    largest = max(((n, torch.Size(s).numel() * DTYPE.itemsize) for n, s in shapes), key=lambda x: x[1])
    print(f"model {shape}: {len(shapes)} tensors, {nbytes / 2**20:.0f} MiB bf16 ({source}); largest {largest[0]} "
          f"{largest[1] / 2**20:.0f} MiB", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    params = [(n, torch.empty(s, dtype=DTYPE, device="cuda")) for n, s in shapes]
    uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
    floor = local_copy_ms(params, repeats)

    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=receiver, args=(child, shapes), daemon=True)
    proc.start()
    client = Client(conn)
    assert client.conn.recv()[0] == "ready"
    rows = []
    try:
        for mode in modes:
            row = {"shape": shape, "mode": mode, "MiB": nbytes / 2**20, "copy_floor_ms": floor}
            packed = mode.startswith("packed")
            buffer_bytes = int(mode.split(":")[1]) * 2**20 if packed else 0
            if packed and largest[1] > buffer_bytes:
                row["fail"] = (f"vLLM's packed_ipc_producer raises ValueError: {largest[0]} is "
                               f"{largest[1] / 2**20:.0f} MiB > buffer {buffer_bytes / 2**20:.0f} MiB")
                print(f"{shape} {mode}: {row['fail']}", flush=True)
                rows.append(row)
                continue
            client.call("init", {"packed": packed})
            wall, remote = [], []
            for r in range(warmup + repeats):
                for _, t in params:  # new weights every round, untimed
                    t.normal_(generator=gen)
                torch.cuda.synchronize()
                client.remote_s, client.updates = 0.0, 0
                t0 = time.perf_counter()
                if packed:
                    send_packed(params, client, uuid, buffer_bytes)
                else:
                    send_unpacked(params, client, uuid)
                if r >= warmup:
                    wall.append(time.perf_counter() - t0)
                    remote.append(client.remote_s)
            check(params, client)
            ms = statistics.median(wall) * 1e3
            row.update(ms=ms, GBps=nbytes / (ms / 1e3) / 1e9, receiver_ms=statistics.median(remote) * 1e3,
                       updates=client.updates, min_ms=min(wall) * 1e3)
            print(f"{shape} {mode}: {ms:.1f} ms (min {row['min_ms']:.1f}), {row['GBps']:.1f} GB/s, "
                  f"{client.updates} update calls; check ok", flush=True)
            rows.append(row)
        client.call("stop")
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="0.5b,1.5b", help=f"comma-separated: {','.join(CONFIGS)}")
    ap.add_argument("--modes", default="unpacked,packed:64,packed:512,packed:1024",
                    help="comma-separated: unpacked, packed:BUFFER_MIB (vLLM's default buffer: 1024; grpo_core's "
                         "weights.bucket_mb default: 64)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_ipc_sync.py needs a CUDA GPU (CUDA IPC); none is visible here.")
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    if unknown := [s for s in shapes if s not in CONFIGS]:
        sys.exit(f"unknown shape(s) {unknown}: {list(CONFIGS)}")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m != "unpacked" and not (m.startswith("packed:") and m.split(":")[1].isdigit()):
            sys.exit(f"unknown mode {m!r}: unpacked or packed:MIB")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    rows = [row for s in shapes for row in bench_shape(s, modes, args.warmup, args.repeats)]
    print("\n| shape | mode | MiB | sync ms (median) | GB/s | receiver ms | update calls | same-process copy ms |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "fail" in r:
            print(f"| {r['shape']} | {r['mode']} | {r['MiB']:.0f} | fails | - | - | - | {r['copy_floor_ms']:.1f} |")
        else:
            print(f"| {r['shape']} | {r['mode']} | {r['MiB']:.0f} | {r['ms']:.1f} | {r['GBps']:.1f} | "
                  f"{r['receiver_ms']:.1f} | {r['updates']} | {r['copy_floor_ms']:.1f} |")


if __name__ == "__main__":
    main()
