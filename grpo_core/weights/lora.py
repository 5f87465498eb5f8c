"""LoRA weight sync: each sync ships only the adapter, in peft format, never the base weights.

The base model is the same on both sides (``model.path``, frozen in the learner), so a new policy version is fully
described by its adapter: ``adapter_model.safetensors`` + ``adapter_config.json``, written by peft and read by
vLLM's LoRA loader (``VLLMSampler.load_adapter``; an OpenAI server's ``/v1/load_lora_adapter`` reads the same
folder). Colocated, the folder is a local temporary one; the files transport publishes the same files under
``weights/v-N/`` (``Learner.hf_snapshot`` gives the adapter there).
"""
from __future__ import annotations

import os
import tempfile
import time

from grpo_core.lifecycle.model.adapter_files import ADAPTER_CONFIG, ADAPTER_FILES, is_adapter_dir

__all__ = ["ADAPTER_CONFIG", "ADAPTER_FILES", "ExportError", "export_merged", "is_adapter_dir", "policy_folder",
           "push_adapter_in_process"]


def push_adapter_in_process(learner, sampler) -> dict[str, float]:
    """Colocated: the learner writes its adapter into a temporary folder and the sampler loads it (vLLM reads the
    folder while loading, so it is deleted right after)."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="grpo-adapter-") as folder:
        n_bytes = learner.save_adapter(folder)
        saved = time.perf_counter()
        sampler.load_adapter(folder, version=learner.version)
    done = time.perf_counter()
    return {"seconds": done - started, "save_seconds": saved - started, "load_seconds": done - saved,
            "bytes": float(n_bytes), "version": float(learner.version)}


# ------------------------------------------------------------------------------------------------ export

class ExportError(ValueError):
    """A run (or checkpoint) that cannot be exported, with the reason."""


# Files of a policy folder that are not the tokenizer (what `export_merged` does not copy next to the model).
_NOT_TOKENIZER = (*ADAPTER_FILES, "README.md", "MANIFEST.json", "state.json", "READY")


def policy_folder(store, checkpoint: str | None) -> str:
    """Run-relative folder of a complete policy: ``final/`` (manifest written last) or a committed checkpoint
    named ``iter-N``."""
    import re

    from grpo_core.run import checkpoint as ckpt

    if checkpoint is None:
        if not store.exists("final/MANIFEST.json"):
            raise ExportError(f"{store.url('final')}: no complete final policy (the run has not finished); pass "
                              "--checkpoint iter-N to export a checkpoint")
        return "final"
    m = re.fullmatch(r"(?:checkpoints/)?iter-(\d+)", checkpoint)
    if m is None:
        raise ExportError(f"--checkpoint {checkpoint!r}: expected iter-N (a folder under checkpoints/)")
    refs = {r.iteration: r for r in ckpt.complete_checkpoints(store)}
    if int(m.group(1)) not in refs:
        names = ", ".join(r.name for r in refs.values()) or "none"
        raise ExportError(f"--checkpoint {checkpoint}: no committed checkpoint of iteration {int(m.group(1))} in "
                          f"{store.url(ckpt.CHECKPOINTS)} (committed: {names})")
    return refs[int(m.group(1))].path


def export_merged(store, out: str, checkpoint: str | None = None) -> dict:
    """Base model + the run's LoRA adapter merged (peft ``merge_and_unload``) into a plain HF model folder at
    ``out`` (safetensors, config, tokenizer files copied byte for byte), which transformers and vLLM load as is.

    The base is the run's ``model.path`` (from its config.json); the adapter comes from ``final/`` or a committed
    checkpoint. A run trained without LoRA has nothing to merge and is refused."""
    import shutil

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    cfg = store.read_config()
    if cfg is None:
        raise ExportError(f"{store.uri}: no run there (no config.json)")
    rel = policy_folder(store, checkpoint)
    files = store.list_files(rel)
    if ADAPTER_CONFIG not in files:
        raise ExportError(f"{store.url(rel)} holds no LoRA adapter (no {ADAPTER_CONFIG}): run {store.run_name} "
                          "trained all weights (model.lora unset), and that folder is already an HF model")
    if os.path.exists(out) and os.listdir(out):
        raise ExportError(f"{out}: exists and is not empty; choose a new folder")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="grpo-export-") as tmp:
        folder = store.local_path(rel)
        if folder is None:
            folder = tmp
            for name in files:
                if "/" not in name:
                    store.get_file(f"{rel}/{name}", os.path.join(tmp, name))
        if not os.path.isdir(cfg["model"]["path"]):
            raise ExportError(f"the base model {cfg['model']['path']!r} (model.path of run {store.run_name}) is not "
                              "a folder here; run the export where the run was started (relative paths) or make "
                              "the base model available at that path")
        dtype = torch.bfloat16 if cfg["model"].get("dtype") == "bfloat16" else torch.float32
        base = AutoModelForCausalLM.from_pretrained(cfg["model"]["path"], dtype=dtype)
        merged = PeftModel.from_pretrained(base, folder).merge_and_unload()
        os.makedirs(out, exist_ok=True)
        merged.save_pretrained(out)
        copied = []
        for name in sorted(os.listdir(folder)):
            src = os.path.join(folder, name)
            if os.path.isfile(src) and name not in _NOT_TOKENIZER and not os.path.exists(os.path.join(out, name)):
                shutil.copyfile(src, os.path.join(out, name))
                copied.append(name)
    return {"source": store.url(rel), "base": cfg["model"]["path"], "out": out, "tokenizer_files": copied,
            "seconds": time.perf_counter() - started}
