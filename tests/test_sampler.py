"""The sampler's fast logprob path (flat logprobs, no detokenization in the engine, texts decoded in one batch) returns
exactly what vLLM's per-token objects and its own incremental detokenizer give."""
from __future__ import annotations

import pytest
import torch

from grpo_core.engine.rollout.model_class import inspect_in_process
from grpo_core.engine.rollout.sampler import SamplerSpec, VLLMSampler


@pytest.fixture(scope="module")
def sampler(tiny_model):
    return VLLMSampler(SamplerSpec(model_path=tiny_model, kv_cache_mb=64, max_model_len=256))


def test_without_cuda_the_model_class_is_inspected_here_not_in_a_subprocess(tiny_model, tmp_path, monkeypatch):
    """vLLM inspects a model class it has not seen in a new Python process (23 s here), caching the answer under
    VLLM_CACHE_ROOT/modelinfos; handed the imported class (grpo_core/engine/rollout/model_class.py), it reads it in
    this process: a new cache folder stays unwritten. With CUDA the class is left to vLLM's subprocess (asked here
    whichever machine this is)."""
    from vllm.config import ModelConfig

    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm"))
    for cuda, registered in ((True, []), (False, ["Qwen2ForCausalLM"])):
        with monkeypatch.context() as patch:
            patch.setattr(torch.cuda, "is_available", lambda cuda=cuda: cuda)
            assert inspect_in_process(tiny_model) == registered, cuda
    assert ModelConfig(model=tiny_model).architectures == ["Qwen2ForCausalLM"]
    assert not (tmp_path / "vllm").exists()


def _prompts(sampler) -> list[list[int]]:
    tok = sampler.llm.get_tokenizer()
    texts = [tok.apply_chat_template([{"role": "user", "content": f"What is {a} + {b}?"}], tokenize=False,
                                     add_generation_prompt=True) for a, b in ((3, 4), (12, 30), (7, 61))]
    return [tok.encode(t, add_special_tokens=False) for t in texts]


def test_fast_samples_equal_vllm_objects_and_its_detokenizer(sampler):
    from vllm import SamplingParams, TokensPrompt

    prompts, seeds = _prompts(sampler), [11, 12, 13]
    fast = sampler.generate(prompts, n=4, max_tokens=16, temperature=1.0, seeds=seeds)
    slow = sampler.llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts],
        [SamplingParams(n=4, max_tokens=16, temperature=1.0, logprobs=0, seed=s, skip_special_tokens=True)
         for s in seeds], use_tqdm=False)
    assert len(fast) == len(slow) == 3
    compared = 0
    for group, out in zip(fast, slow):
        assert len(group) == len(out.outputs) == 4
        for sample, ref in zip(group, out.outputs):
            assert sample.token_ids == list(ref.token_ids)
            assert sample.text == ref.text
            assert sample.finish_reason == str(ref.finish_reason)
            assert sample.logprobs == [step[t].logprob for t, step in zip(ref.token_ids, ref.logprobs)]
            assert len(sample.logprobs) == len(sample.token_ids) > 0
            compared += len(sample.token_ids)
    assert compared > 3 * 4


def test_greedy_and_scored_logprobs_agree(sampler):
    prompts = _prompts(sampler)
    greedy = sampler.generate_greedy(prompts, max_tokens=16)
    scored = sampler.score_tokens([p + s.token_ids for p, s in zip(prompts, greedy)], [len(p) for p in prompts])
    for sample, lp in zip(greedy, scored):
        assert sample.text and len(lp) == len(sample.token_ids)
        # greedy decoding at temperature 0 reports raw logprobs, as prompt scoring at temperature 1 does
        assert max(abs(a - b) for a, b in zip(sample.logprobs, lp)) < 1e-4



def test_shared_prompt_prefill_reads_the_cache_and_samples_what_full_prefills_do(sampler, tiny_model):
    """With prompt sharing, a prompt's whole KV blocks are computed once for its n samples (vLLM reports the others
    as cached tokens), and the samples are those of a sampler that computes every sample's prompt in full: the
    same tokens, the same logprobs up to float noise."""
    from vllm import SamplingParams, TokensPrompt

    from grpo_core.lifecycle.model.tiny import render_prompt
    from grpo_core.engine.rollout.sampler import CPU_PREFIX_BLOCK

    tok = sampler.llm.get_tokenizer()
    prompts = [tok.encode(render_prompt(f"What is {a} + {b}?"), add_special_tokens=False)
               for a, b in ((3, 4), (12, 30), (7, 61))]
    assert all(len(p) > CPU_PREFIX_BLOCK for p in prompts)  # at least one whole block to share
    seeds = [21, 22, 23]
    sampler.llm.reset_prefix_cache()
    out = sampler.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                               [SamplingParams(n=4, max_tokens=4, seed=s) for s in seeds], use_tqdm=False)
    assert [o.num_cached_tokens for o in out] == [len(p) // CPU_PREFIX_BLOCK * CPU_PREFIX_BLOCK for p in prompts]
    shared = sampler.generate(prompts, n=4, max_tokens=16, temperature=1.0, seeds=seeds)
    unshared = VLLMSampler(SamplerSpec(model_path=tiny_model, kv_cache_mb=64, max_model_len=256,
                                       share_prompt_prefill=False))
    full = unshared.generate(prompts, n=4, max_tokens=16, temperature=1.0, seeds=seeds)
    for a, b in zip(shared, full):
        for x, y in zip(a, b):
            assert x.token_ids == y.token_ids
            assert max(abs(u - v) for u, v in zip(x.logprobs, y.logprobs)) < 1e-5


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_receipt_is_what_the_loader_was_handed_and_one_ulp_in_one_weight_shows(tiny_model, dtype):
    """The sampler digests every tensor its vLLM worker's loader is handed (``served``), in the dtype it came in.
    One weight one ulp off (a corrupted sync) gives another digest naming that tensor, although the logprobs can
    hardly tell (a tolerance on them could never catch it); in float32 and bfloat16 alike."""
    import gc

    import torch
    from safetensors.torch import load_file

    from grpo_core.engine.weights_digest import WeightsDigest

    torch_dtype = getattr(torch, dtype)
    # An engine of an earlier test (the unshared one above) tears vLLM's process-wide groups down when the garbage
    # collector reaches it: let that happen now, not while this test's own engine runs.
    gc.collect()
    engine = VLLMSampler(SamplerSpec(model_path=tiny_model, dtype=dtype, kv_cache_mb=64, max_model_len=256))
    weights = {n: t.to(torch_dtype) for n, t in load_file(f"{tiny_model}/model.safetensors").items()}
    prompts = _prompts(engine)
    greedy = engine.generate_greedy(prompts, max_tokens=8)
    sequences, lens = [p + s.token_ids for p, s in zip(prompts, greedy)], [len(p) for p in prompts]

    engine.load_weights(weights.items(), version=1)
    published = WeightsDigest.of(weights.items(), tied=True)  # the tiny model is tied: the loader never sees lm_head
    assert engine.served == published and len(published.tensors) == len(weights) - ("lm_head.weight" in weights)
    before = engine.score_tokens(sequences, lens)

    name = next(n for n, t in weights.items() if "layers.0" in n and t.ndim == 2)
    nudged = dict(weights)
    nudged[name] = weights[name].clone()
    nudged[name].view(torch.int32 if dtype == "float32" else torch.int16).view(-1)[5] += 1
    engine.load_weights(nudged.items(), version=1)  # a sync that delivered one weight one ulp off
    assert published.differences(engine.served) == [f"{name}: other bytes"]
    after = engine.score_tokens(sequences, lens)
    assert max(abs(a - b) for x, y in zip(before, after) for a, b in zip(x, y)) < 1e-2

    engine.load_weights(weights.items(), version=0)
    assert engine.served == published
    del engine
    gc.collect()
