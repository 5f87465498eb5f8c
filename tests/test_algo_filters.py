"""Dynamic sampling (group_filter, DynamicBatch), overlong filtering and soft overlong punishment."""
import pytest
import torch

from grpo_core.algo import DynamicBatch, default_cache_length, group_filter, overlong_mask, soft_overlong_penalty


def test_dapo_range_drops_exactly_all_right_and_all_wrong():
    r = torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0], [0, 1, 0, 1]], dtype=torch.float32)
    keep, m = group_filter(r, (0.0, 1.0))
    assert keep.tolist() == [False, False, True, True, True]
    assert m["groups_kept"] == 3 and m["groups_dropped"] == 2
    assert m["group_all_right_frac"] == pytest.approx(0.2) and m["group_all_wrong_frac"] == pytest.approx(0.2)


def test_bounds_are_exclusive():
    r = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.float32)  # p = .25, .5, .75
    assert group_filter(r, (0.25, 0.75))[0].tolist() == [False, True, False]
    assert group_filter(r, (0.2, 0.8))[0].tolist() == [True, True, True]


def test_matches_loop_random():
    gen = torch.Generator().manual_seed(0)
    r = (torch.rand(50, 4, generator=gen) > 0.5).float()
    keep, _ = group_filter(r, (0.3, 0.9))
    for row, k in zip(r.tolist(), keep.tolist()):
        p = sum(row) / len(row)
        assert k == (0.3 < p < 0.9)


@pytest.mark.parametrize("bad", [(0.5, 0.5), (0.6, 0.4), (-0.1, 1.0), (0.0, 1.5)])
def test_bad_range(bad):
    with pytest.raises(ValueError, match="filter_range"):
        group_filter(torch.zeros(2, 2), bad)


def test_rewards_outside_unit_interval_rejected():
    with pytest.raises(ValueError, match="accuracy"):
        group_filter(torch.tensor([[-1.0, 1.0]]))


def _round(rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_dynamic_batch_fills_and_keeps_order():
    batch = DynamicBatch(target_groups=3, max_resample_times=5)
    batch.add(_round([[1, 1], [0, 1], [0, 0]]), ["a", "b", "c"])  # keeps b
    assert not batch.full and not batch.exhausted and batch.rounds == 1
    m = batch.add(_round([[1, 0], [1, 1], [0, 1]]), ["d", "e", "f"])  # keeps d, f
    assert batch.full and batch.rounds == 2 and m["dynamic_fill"] == 1.0
    assert batch.take() == ["b", "d", "f"]
    with pytest.raises(RuntimeError, match="done"):
        batch.add(_round([[1, 0]]), ["g"])


def test_dynamic_batch_take_exactly_target_when_overfull():
    batch = DynamicBatch(target_groups=2, max_resample_times=0)
    batch.add(_round([[1, 0], [0, 1], [1, 0]]), [0, 1, 2])
    assert batch.full and batch.take() == [0, 1]


def test_dynamic_batch_stops_after_max_resample_times():
    batch = DynamicBatch(target_groups=4, max_resample_times=2)
    rounds = 0
    while not (batch.full or batch.exhausted):
        batch.add(_round([[1, 1], [0, 1]]), [rounds * 2, rounds * 2 + 1])
        rounds += 1
    assert rounds == 3 and batch.exhausted and not batch.full
    assert batch.take() == [1, 3, 5]  # fewer than the target: everything kept


def test_dynamic_batch_errors():
    with pytest.raises(ValueError, match="target_groups"):
        DynamicBatch(0, 1)
    with pytest.raises(ValueError, match="max_resample_times"):
        DynamicBatch(1, -1)
    with pytest.raises(ValueError, match="payload_indices"):
        DynamicBatch(1, 1).add(_round([[1, 0]]), [0, 1])


def test_overlong_mask():
    keep, m = overlong_mask(torch.tensor([True, False, False, True]))
    assert keep.tolist() == [False, True, True, False] and m["truncated_frac"] == 0.5


def test_soft_overlong_hand_computed():
    # max 100, cache 20: no penalty up to 80, linear to -penalty at 100, -penalty beyond
    lengths = torch.tensor([10, 80, 81, 90, 100, 101])
    pen, m = soft_overlong_penalty(lengths, 100, 20, penalty=2.0)
    assert torch.allclose(pen, torch.tensor([0.0, 0.0, -0.1, -1.0, -2.0, -2.0]))
    assert m["overlong_penalized_frac"] == pytest.approx(4 / 6)


def test_soft_overlong_matches_loop_and_default_cache():
    lengths = torch.arange(0, 140)
    cache = default_cache_length(128)
    assert cache == 25
    pen, _ = soft_overlong_penalty(lengths, 128)
    for length, p in zip(lengths.tolist(), pen.tolist()):
        if length <= 128 - cache:
            want = 0.0
        elif length <= 128:
            want = (128 - cache - length) / cache
        else:
            want = -1.0
        assert abs(p - want) < 1e-6


def test_soft_overlong_zero_cache_means_sized_to_run():
    lengths = torch.tensor([50, 90, 100])
    assert torch.equal(soft_overlong_penalty(lengths, 100, 0)[0], soft_overlong_penalty(lengths, 100, 20)[0])


@pytest.mark.parametrize("cache", [-1, 100, 120])
def test_soft_overlong_bad_cache(cache):
    with pytest.raises(ValueError, match="cache_length"):
        soft_overlong_penalty(torch.tensor([5]), 100, cache)
