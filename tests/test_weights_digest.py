"""The sync check's digests: exact in every dtype (one ulp in one weight is another digest), blind to nothing a
loader is handed (dtype, shape, names), and stable across the ways a receipt is assembled (buckets, JSON)."""
from __future__ import annotations

import pytest
import torch

from grpo_core.engine.weights_digest import Receipt, WeightsDigest, compare_receipts, describe, tensor_digest


def _state(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"model.embed_tokens.weight": torch.randn(64, 16, generator=g).to(dtype),
            "model.layers.0.mlp.up_proj.weight": torch.randn(32, 16, generator=g).to(dtype),
            "model.norm.weight": torch.ones(16, dtype=dtype),
            "lm_head.weight": torch.randn(64, 16, generator=g).to(dtype)}


def _one_ulp_up(t: torch.Tensor, index: int) -> torch.Tensor:
    """A copy with element ``index`` one unit in the last place further from zero."""
    out = t.clone()
    out.view(torch.int32 if t.dtype == torch.float32 else torch.int16).view(-1)[index] += 1
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_ulp_in_one_weight_is_another_digest_in_both_dtypes(dtype):
    state = _state(dtype)
    before = WeightsDigest.of(state.items())
    name = "model.layers.0.mlp.up_proj.weight"
    nudged = dict(state, **{name: _one_ulp_up(state[name], 77)})
    assert (nudged[name] != state[name]).sum() == 1
    assert (nudged[name].float() - state[name].float()).abs().max() < 0.02  # a tiny change, not a large one
    assert before.differences(WeightsDigest.of(nudged.items())) == [f"{name}: other bytes"]
    assert before.differences(WeightsDigest.of(state.items())) == []


def test_two_swapped_elements_another_dtype_shape_or_name_all_differ():
    state = _state(torch.float32)
    base = WeightsDigest.of(state.items())
    name = "model.embed_tokens.weight"
    swapped = state[name].clone()
    swapped.view(-1)[[3, 9]] = swapped.view(-1)[[9, 3]]
    changed = {
        "swap": (dict(state, **{name: swapped}), [f"{name}: other bytes"]),
        "dtype": (dict(state, **{name: state[name].to(torch.bfloat16)}),
                  [f"{name}: bfloat16 [64, 16] instead of float32 [64, 16]"]),
        "shape": (dict(state, **{name: state[name].reshape(16, 64)}),
                  [f"{name}: float32 [16, 64] instead of float32 [64, 16]"]),
        "missing": ({k: v for k, v in state.items() if k != name}, [f"{name}: not received"]),
        "extra": (dict(state, extra=torch.zeros(2)), ["extra: received, not published"]),
    }
    for what, (other, expected) in changed.items():
        assert base.differences(WeightsDigest.of(other.items())) == expected, what


def test_a_tied_output_layer_is_left_out_and_buckets_and_json_give_the_same_digest():
    state = _state(torch.bfloat16)
    tied = WeightsDigest.of(state.items(), tied=True)
    assert "lm_head.weight" not in tied.tensors and len(tied.tensors) == 3
    items = [(n, t) for n, t in state.items() if n != "lm_head.weight"]
    parts = WeightsDigest.merge([WeightsDigest.of(items[:1]), WeightsDigest.of(items[1:])])
    assert parts == tied and parts.summary() == tied.summary()
    assert WeightsDigest.from_json(tied.to_json()) == tied
    # a non-contiguous view digests as the values it shows (what a loader would copy)
    t = state["model.embed_tokens.weight"]
    assert tensor_digest(t.t()) == tensor_digest(t.t().contiguous())
    assert tensor_digest(torch.zeros(0)).shape == (0,)


def test_receipts_compare_versions_and_digests_and_name_what_differs():
    state = _state(torch.float32)
    published = Receipt(3, WeightsDigest.of(state.items()))
    name = "model.norm.weight"
    nudged = dict(state, **{name: _one_ulp_up(state[name], 0)})
    served = {0: Receipt(3, WeightsDigest.of(state.items())), 1: Receipt(3, WeightsDigest.of(nudged.items())),
              2: Receipt(2, WeightsDigest.of(state.items())), 3: Receipt(3, None)}
    problems = compare_receipts(published, served)
    assert problems == {0: [], 1: [f"{name}: other bytes"], 2: ["serves version 2, not 3"],
                        3: ["loaded no weights since it started"]}
    text = describe(problems, len(state))
    assert "sampler 0" not in text and f"sampler 1: {name}: other bytes" in text and "(of 4 tensors" in text
