"""PPO's critic (grpo_core.engine.train.critic) on the tiny model, in this process: it learns the returns it is
trained on, and a critic restored from its checkpoint takes exactly the steps the original takes."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpo_core.algo.value import explained_variance, gae_advantages, outcome_token_rewards
from grpo_core.config import LoraConfig, build_config
from grpo_core.engine.train.batch import pack_batch
from grpo_core.engine.train.critic import Critic, CriticSpec

pytestmark = pytest.mark.timeout(600)


def _batch(n=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 300, (5 + i % 3,), generator=g).tolist() for i in range(n)]
    responses = [torch.randint(3, 300, (2 + i % 4,), generator=g).tolist() + [2] for i in range(n)]
    return pack_batch(prompts, responses, None, [0.0] * n, [True] * n, pad_id=0)


def _critic(model, lr=1e-3, micro=4, accum=2, clip=0.5, lora=None, pack=True):
    cfg = build_config({"model": {"path": model}, "data": {"train_path": "t"},
                        "rollout": {"prompts_per_iteration": 8, "samples_per_prompt": 1},
                        "algo": {"preset": "ppo"}, "train": {"lr": lr, "micro_batch_size": micro,
                                                             "lr_schedule": "cosine"}})
    torch.manual_seed(0)  # the head's initialisation
    return Critic(CriticSpec(model_path=model, lr=lr, value_clip=clip, total_steps=40, lora=lora, pack=pack), cfg.train,
                  micro_batch_size=micro, grad_accum_steps=accum, zero_stage=0)


def snap_module(folder) -> list[str]:
    """The parameter names a saved critic checkpoint holds."""
    return list(torch.load(folder / "critic" / "mp_rank_00_model_states.pt", weights_only=False)["module"])


def _targets(critic, batch, rewards):
    mask = batch.loss_mask
    values = critic.values(batch)
    token_rewards, _ = outcome_token_rewards(rewards, mask)
    _, returns, _ = gae_advantages(token_rewards, values, mask, gamma=1.0, lam=0.95)
    return values, returns


# (lora, lr, loss ratio, explained variance): the batch's returns are arbitrary labels of random token rows, which
# a rank-8 LoRA on the tiny model fits far more slowly than all its weights
@pytest.mark.parametrize("lora,lr,loss_ratio,explained_at_end",
                         [(None, 3e-3, 0.4, 0.5), (LoraConfig(rank=8, alpha=16), 1e-2, 0.6, 0.05)],
                         ids=["full", "lora"])
def test_the_critic_learns_the_returns_of_its_batch(tiny_model, lora, lr, loss_ratio, explained_at_end):
    critic = _critic(tiny_model, lr=lr, lora=lora)
    if lora is not None:  # the policy's LoRA shape: adapters and the new head train, the base stays as loaded
        trained = {n for n, p in critic.engine.module.named_parameters() if p.requires_grad}
        assert any("lora_A" in n for n in trained) and any("score" in n for n in trained)
        assert not any("embed_tokens" in n or n.endswith("q_proj.base_layer.weight") for n in trained)
    batch = _batch()
    assert float(critic.values(batch).abs().max()) == 0.0  # a new head starts at zero: no random baseline
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    losses, explained = [], []
    for _ in range(30):
        values, returns = _targets(critic, batch, rewards)
        explained.append(explained_variance(values, returns, batch.loss_mask))
        out = critic.train_step(batch, values, returns)
        losses.append(out["value_loss"])
        assert out["critic_lr"] > 0 and out["critic_grad_norm"] > 0
    # values 0 off the response tokens, where nothing is trained
    assert float(critic.values(batch)[batch.loss_mask == 0].abs().max()) == 0.0
    # a new head starts at zero: its values explain nothing; after 30 steps they explain part of the returns
    assert sum(losses[-5:]) / 5 < loss_ratio * losses[0], losses
    assert abs(explained[0]) < 0.1 and sum(explained[-5:]) / 5 > explained_at_end, explained


def _grouped_batch():
    """Rows in groups of 4 answers to one prompt (what packing shares), answers of different lengths."""
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 300, (6 + k,), generator=g).tolist() for k in range(2) for _ in range(4)]
    responses = [torch.randint(3, 300, (2 + i % 4,), generator=g).tolist() + [2] for i in range(8)]
    return pack_batch(prompts, responses, None, [0.0] * 8, [True] * 8, pad_id=0)


def test_the_packed_forward_gives_the_padded_values_and_gradients(tiny_model):
    """Each group's prompt once in a packed row, the head only where a value is read: the same values and the same
    step as the padded rows (to float rounding)."""
    rm = str(Path(__file__).resolve().parents[1] / "models" / "tiny-rm")  # a non-zero head: values to compare
    batch, rewards = _grouped_batch(), torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    packed, padded = _critic(rm, pack=True), _critic(rm, pack=False)
    torch.testing.assert_close(packed.values(batch), padded.values(batch), rtol=1e-4, atol=1e-5)
    steps = []
    for critic in (packed, padded):
        steps.append(_gradients_stepped_on(critic))
        critic.train_step(batch, *_targets(critic, batch, rewards))
    (a,), (b,) = steps  # one optimizer step each: compared on its gradients (Adam's first step is a sign)
    assert a.keys() == b.keys() and any("score" in k for k in a)
    for name in a:
        scale = float(a[name].abs().max()) or 1.0
        assert float((a[name] - b[name]).abs().max()) <= 1e-4 * scale, name


def _gradients_stepped_on(critic) -> list[dict[str, torch.Tensor]]:
    """Every optimizer step's gradients, copied as the step starts (accumulated and clipped)."""
    names = {id(p): n for n, p in critic.engine.module.named_parameters()}
    steps: list[dict[str, torch.Tensor]] = []
    critic.optimizer.register_step_pre_hook(lambda optimizer, _args, _kwargs: steps.append(
        {names[id(p)]: p.grad.detach().clone() for g in optimizer.param_groups for p in g["params"]
         if p.grad is not None}))
    return steps


def test_a_critic_started_from_a_reward_model_keeps_its_head():
    rm = str(Path(__file__).resolve().parents[1] / "models" / "tiny-rm")  # a scalar head trained on preferences
    values = _critic(rm).values(_batch())
    assert float(values.abs().max()) > 0.0 and float(values[_batch().loss_mask == 0].abs().max()) == 0.0


@pytest.mark.parametrize("lora", [None, LoraConfig(rank=4, alpha=8)], ids=["full", "lora"])
def test_a_critic_restored_from_its_snapshot_takes_the_same_steps(tiny_model, tmp_path, lora):
    from grpo_core.run.checkpoint import CheckpointWriter, Snapshot
    from grpo_core.run.storage import RunStore

    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0])
    original = _critic(tiny_model, lora=lora)
    for seed in range(2):
        original.train_step(_batch(seed=seed), *_targets(original, _batch(seed=seed), rewards))
    snap = Snapshot()
    for path, state in original.snapshot():
        snap.add_torch(path, state)
    written = CheckpointWriter(RunStore(str(tmp_path), "run"), "ckpt", snap).start().result(wait=True)
    assert "critic/mp_rank_00_model_states.pt" in written.files
    if lora is not None:  # the adapters and the head only: the frozen base is the model folder's
        saved = snap_module(tmp_path / "run" / "ckpt")
        assert saved and all("lora_" in k or "score" in k for k in saved), sorted(saved)[:5]
    for seed in range(2, 4):
        original.train_step(_batch(seed=seed), *_targets(original, _batch(seed=seed), rewards))

    restored = _critic(tiny_model, lora=lora)
    restored.load_state(str(tmp_path / "run" / "ckpt"))
    for seed in range(2, 4):
        restored.train_step(_batch(seed=seed), *_targets(restored, _batch(seed=seed), rewards))
    a = dict(original.engine.module.state_dict())
    b = dict(restored.engine.module.state_dict())
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "the restored critic diverged"
    assert restored.scheduler.get_last_lr() == original.scheduler.get_last_lr()
