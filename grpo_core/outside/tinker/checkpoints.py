"""Tinker's checkpoint routes (the SDK's ``RestClient``): a training run's checkpoints listed (or every run's), one
deleted, one described (``weights_info``), the run described, read from the service's run folder.

A training run is a training client (``training_run_id`` is its model id); its checkpoints are the folders under
``<root>/<model>/weights/`` (``save_state``: checkpoint type ``training``) and ``sampler_weights/``
(``save_weights_for_sampler``: ``sampler``), so they are listed after a restart too. A checkpoint id is
``weights/<name>`` or ``sampler_weights/<name>``, its path ``tinker://<model id>/<checkpoint id>``. A folder still
being written (the temporary folder ``save_state`` renames when whole) is not a checkpoint yet.
"""
from __future__ import annotations

import datetime
import json
import os
import re
import shutil
from pathlib import Path

from grpo_core.outside.tinker.errors import TinkerRequestError, not_found
from grpo_core.outside.tinker.trainee import ATTENTION, MLP, PARTIAL, STATE_FILE, WEIGHTS_FILE

KINDS = {"weights": "training", "sampler_weights": "sampler"}
RUN_FILES = (WEIGHTS_FILE, "adapter_model.safetensors", "model.safetensors")  # what makes a folder a checkpoint


RUN_FOLDER = re.compile(r"^(s-[0-9a-f]+)\.train\.(\d+)$")  # a training client's folder: <session>.train.<seq>


MODEL_ID = re.compile(r"^s-[0-9a-f]+:train:\d+$")


def model_folder(root: Path, model_id: str, field: str = "training_run_id") -> Path:
    """``<root>/<session>.train.<seq>``; anything but a training model's id (``..`` say) is no run here: a 404
    naming ``field``."""
    if not MODEL_ID.match(model_id):
        raise not_found("training run", model_id, field)
    return root / model_id.replace(":", ".")


def run_ids(root: Path) -> list[str]:
    """The model ids of every training client that has a folder under ``root`` (this server's and earlier ones')."""
    found = (RUN_FOLDER.match(p.name) for p in root.iterdir() if p.is_dir()) if root.is_dir() else ()
    return sorted(f"{m.group(1)}:train:{m.group(2)}" for m in found if m)


def page(text: str, field: str, low: int, high: int) -> int:
    """A paging query parameter as an integer in [low, high]; refused naming it otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise TinkerRequestError(f"{field} {text!r}: an integer", field=field) from None
    if not low <= value <= high:
        raise TinkerRequestError(f"{field} {value}: {low} to {high}", field=field)
    return value


def paged(items: list, key: str, limit: str, offset: str) -> dict:
    """A page of ``items`` under ``key`` with the SDK's cursor; ``limit`` and ``offset`` as the query gave them
    (refused naming them unless integers in range)."""
    first, count = page(offset, "offset", 0, 2**31), page(limit, "limit", 1, 1000)
    return {key: items[first:first + count], "cursor": {"offset": first, "limit": count, "total_count": len(items)}}


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def _whole(folder: Path) -> bool:
    return (folder.is_dir() and not folder.name.startswith(".") and not folder.name.endswith(PARTIAL)
            and any((folder / f).is_file() for f in RUN_FILES))


def _described(model_id: str, kind: str, folder: Path) -> dict:
    made = datetime.datetime.fromtimestamp(folder.stat().st_mtime, tz=datetime.timezone.utc)
    return {"checkpoint_id": f"{kind}/{folder.name}", "checkpoint_type": KINDS[kind], "time": made.isoformat(),
            "tinker_path": f"tinker://{model_id}/{kind}/{folder.name}", "size_bytes": _size(folder)}


def list_checkpoints(root: Path, model_id: str, live: bool = False) -> list[dict]:
    """Every whole checkpoint of the run, oldest first (the SDK's ``Checkpoint`` fields). ``live``: the client is
    this server's, so a run with no folder yet has none rather than being unknown."""
    run = model_folder(root, model_id)
    if not run.is_dir() and not live:
        raise not_found("training run", model_id, "training_run_id")
    found = []
    for kind in KINDS:
        folders = sorted((run / kind).iterdir()) if (run / kind).is_dir() else []
        found += [_described(model_id, kind, f) for f in folders if _whole(f)]
    return sorted(found, key=lambda c: (c["time"], c["checkpoint_id"]))


def every_checkpoint(root: Path, live: list[str], limit: str, offset: str) -> dict:
    """``list_user_checkpoints``: the checkpoints of every run here (a folder under ``root``, or a ``live`` client's),
    the newest first, a page of them with the SDK's cursor."""
    found = [c for i in sorted(set(run_ids(root)) | set(live)) for c in list_checkpoints(root, i, live=True)]
    found.sort(key=lambda c: (c["time"], c["tinker_path"]), reverse=True)
    return paged(found, "checkpoints", limit, offset)


def adapters(folder: Path) -> dict:
    """What a whole checkpoint folder trains: ``lora_rank`` (0: all weights), ``train_attn``, ``train_mlp``; a
    training checkpoint says it in its state file, a sampler checkpoint by its adapter's config (none: all weights)."""
    state = folder / STATE_FILE
    if state.is_file():
        spec = json.loads(state.read_text())["spec"]
        return {k: spec[k] for k in ("lora_rank", "train_attn", "train_mlp")}
    adapter = folder / "adapter_config.json"
    if not adapter.is_file():
        return {"lora_rank": 0, "train_attn": True, "train_mlp": True}
    config = json.loads(adapter.read_text())
    targets = set(config.get("target_modules") or ())
    return {"lora_rank": int(config["r"]), "train_attn": bool(targets & set(ATTENTION)),
            "train_mlp": bool(targets & set(MLP))}


def weights_info(folder: Path, base_model: str) -> dict:
    """The SDK's ``WeightsInfoResponse`` of a checkpoint folder: its base model and what a client made from it
    trains (LoRA never trains the unembedding here; all-weights training trains everything)."""
    trains = adapters(folder)
    lora = trains["lora_rank"] > 0
    return {"base_model": base_model, "is_lora": lora, "lora_rank": trains["lora_rank"] if lora else None,
            "train_attn": trains["train_attn"] if lora else True, "train_mlp": trains["train_mlp"] if lora else True,
            "train_unembed": not lora}


def checkpoint_folder(root: Path, model_id: str, checkpoint_id: str) -> Path:
    """The folder of ``checkpoint_id`` (``weights/<name>`` or ``sampler_weights/<name>``); a 404 naming it if there is
    none."""
    kind, _, name = checkpoint_id.partition("/")
    if kind not in KINDS or not name or "/" in name or name in (".", ".."):
        raise TinkerRequestError(f"checkpoint_id {checkpoint_id!r}: weights/<name> or sampler_weights/<name>",
                                 field="checkpoint_id")
    folder = model_folder(root, model_id) / kind / name
    if not _whole(folder):
        raise not_found("checkpoint", f"{model_id}/{checkpoint_id}", "checkpoint_id")
    return folder


def delete(folder: Path) -> None:
    """Gone whole: renamed out of the listing first, then removed (a crash in between leaves a hidden folder that is
    never listed, not half a checkpoint)."""
    doomed = folder.with_name(f".deleting-{folder.name}-{os.getpid()}")
    os.replace(folder, doomed)
    shutil.rmtree(doomed)


def training_run(root: Path, model_id: str, base_model: str, lora_rank: int | None, since: float = 0.0) -> dict:
    """The SDK's ``TrainingRun``: ``lora_rank`` from the live client (not None), else from its newest training
    checkpoint; the last request's time from its folder's files, or ``since`` (a live client's creation) if later."""
    checkpoints = list_checkpoints(root, model_id, live=lora_rank is not None)
    training = [c for c in checkpoints if c["checkpoint_type"] == "training"]
    sampler = [c for c in checkpoints if c["checkpoint_type"] == "sampler"]
    if lora_rank is None and training:
        lora_rank = int(adapters(model_folder(root, model_id) / training[-1]["checkpoint_id"])["lora_rank"])
    run = model_folder(root, model_id)
    last = max([since, *(f.stat().st_mtime for f in run.rglob("*"))] if run.is_dir() else [since])
    return {"training_run_id": model_id, "base_model": base_model, "model_owner": "local",
            "is_lora": bool(lora_rank), "lora_rank": lora_rank or None,
            "last_request_time": datetime.datetime.fromtimestamp(last, tz=datetime.timezone.utc).isoformat(),
            "last_checkpoint": training[-1] if training else None,
            "last_sampler_checkpoint": sampler[-1] if sampler else None}
