"""`grpo serve`'s arguments: a CPU KV cache too small for the model's full length serves what fits instead of
failing to start (SmolLM2's 8192 tokens need 0.35 GiB, the default cache is 256 MiB); LoRA only on the decoder."""
from __future__ import annotations

import json

import pytest

from grpo_core.lifecycle.serve import ServeOptions, fit_max_model_len, kv_bytes_per_token, vllm_argv

SMOLLM2 = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576,
           "head_dim": 64, "max_position_embeddings": 8192}


@pytest.fixture
def model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2))
    return str(tmp_path)


def test_kv_bytes_per_token_is_keys_and_values_of_every_layer(model):
    assert kv_bytes_per_token(model, "float32") == 2 * 30 * 3 * 64 * 4 == 46080
    assert kv_bytes_per_token(model, "bfloat16") == 46080 // 2


def test_a_cache_too_small_for_the_full_length_serves_what_fits(model, capsys):
    fitted = fit_max_model_len(ServeOptions(model=model, kv_cache_mb=256))
    assert fitted.max_model_len == 5632  # 256 MiB / 46080 B = 5825 tokens, in multiples of 256
    assert "serving at most 5632 tokens per sequence" in capsys.readouterr().out
    assert fit_max_model_len(ServeOptions(model=model, kv_cache_mb=512)).max_model_len is None  # 8192 fit
    assert fit_max_model_len(ServeOptions(model=model, kv_cache_mb=256, max_model_len=1024)).max_model_len == 1024
    with pytest.raises(SystemExit, match=r"--kv-cache-mb 64 holds 1456 tokens .* fewer than --max-model-len 2048: "
                                         r"give --kv-cache-mb 90 or a smaller --max-model-len"):
        fit_max_model_len(ServeOptions(model=model, kv_cache_mb=64, max_model_len=2048))
    with pytest.raises(SystemExit, match="holds only 182 tokens"):
        fit_max_model_len(ServeOptions(model=model, kv_cache_mb=8))


def test_lora_adapters_are_served_on_the_decoder_layers_only(model):
    argv = vllm_argv(ServeOptions(model=model, lora=True), cuda=False)
    i = argv.index("--lora-target-modules")
    assert argv[i + 1:i + 8] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert "--lora-target-modules" not in vllm_argv(ServeOptions(model=model), cuda=False)
