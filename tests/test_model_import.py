"""`grpo model import` / `grpo model smollm2` refuse what is not a usable language model, naming the file and the
field; `model.path` given a GGUF file says how to import it. (The import itself, with the real model and both
engines, is in test_real_model.py.)"""
from __future__ import annotations

import json

import pytest

from grpo_core.config import ConfigError, build_config, check_model_folder
from grpo_core.lifecycle.model.gguf_import import ModelImportError, end_of_turn_ids, installed_smollm2_gguf, read_gguf_info


def _gguf(path, arch: str, kind: str = "model"):
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"a {arch} header")
    w.add_type(kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_missing_file_and_a_file_that_is_no_gguf_are_named(tmp_path):
    with pytest.raises(ModelImportError, match=r"nothing\.gguf: no such GGUF file"):
        read_gguf_info(tmp_path / "nothing.gguf")
    fake = tmp_path / "weights.gguf"
    fake.write_bytes(b"PK\x03\x04 a zip file")
    with pytest.raises(ModelImportError, match=r"weights\.gguf: not a GGUF file \(its first bytes are b'PK"):
        read_gguf_info(fake)


def test_an_encoder_or_an_adapter_is_not_a_policy(tmp_path):
    with pytest.raises(ModelImportError, match=r"bert\.gguf: general\.architecture is 'bert', which is not a "
                                               r"decoder-only language model"):
        read_gguf_info(_gguf(tmp_path / "bert.gguf", "bert"))
    with pytest.raises(ModelImportError, match=r"lora\.gguf: general\.type is 'adapter', not a model"):
        read_gguf_info(_gguf(tmp_path / "lora.gguf", "llama", kind="adapter"))
    info = read_gguf_info(_gguf(tmp_path / "llama.gguf", "llama"))
    assert (info.architecture, info.name) == ("llama", "a llama header")


def test_the_installed_wheel_holds_smollm2():
    path = installed_smollm2_gguf()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 90e6
    info = read_gguf_info(path)
    assert (info.architecture, info.layers, info.context_length) == ("llama", 30, 8192)


def test_end_of_turn_ids_are_the_eos_and_every_chat_terminator_in_the_vocabulary():
    class Tok:
        eos_token_id = 7

        def get_vocab(self):
            return {"<|im_end|>": 2, "<|endoftext|>": 0, "hello": 9}

    assert end_of_turn_ids(Tok()) == [0, 2, 7]


def test_model_path_given_a_gguf_file_says_how_to_import_it(tmp_path):
    gguf_file = _gguf(tmp_path / "m.gguf", "llama")
    cfg = build_config({"model": {"path": str(gguf_file)}, "data": {"train_path": "t"}})
    with pytest.raises(ConfigError, match=r"model\.path=.*m\.gguf' is a GGUF file: import it first with `grpo "
                                          r"model import --gguf .*m\.gguf --out DIR`"):
        check_model_folder(cfg)
    missing = build_config({"model": {"path": str(tmp_path / "no-such-model")}, "data": {"train_path": "t"}})
    with pytest.raises(ConfigError, match=r"model\.path=.*no-such-model' is not an HF model folder \(does not exist\)"):
        check_model_folder(missing)
    # A folder whose config is no causal LM (an encoder) is named too.
    enc = tmp_path / "encoder"
    enc.mkdir()
    (enc / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    with pytest.raises(ConfigError, match=r"model\.path=.*encoder' holds a BertModel \(architectures in its "
                                          r"config\.json\), not a causal language model"):
        check_model_folder(build_config({"model": {"path": str(enc)}, "data": {"train_path": "t"}}))
