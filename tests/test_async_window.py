"""The async rule in one object (grpo_core.pipeline.async_window): the window, inbox eligibility, resume."""
from __future__ import annotations

import pytest

from grpo_core.pipeline.async_window import AsyncWindow, StaleBatch


def _schedule(window: AsyncWindow, start: int) -> list[tuple[int, int, int]]:
    """What the flow does from ``start``: (iteration collected, learner version while it is sampled, iteration being
    trained or -1), with the samplers serving the learner's weights of before the iteration that trains."""
    out, collected = [], set()
    for it in range(start, window.iterations):
        for j in window.collect_before_training(it, collected):
            out.append((j, window.learner_version(it), -1))
            collected.add(j)
        collected.discard(it)
        ahead = window.beside_update(it)
        if ahead is not None:  # sampled while `it` trains: the samplers still serve the weights before it
            out.append((ahead, window.learner_version(it), it))
            collected.add(ahead)
    return out


@pytest.mark.parametrize("staleness", [0, 1, 2, 3])
@pytest.mark.parametrize("start", [0, 1, 4])
def test_every_iteration_is_sampled_once_with_its_version_from_a_start_or_a_resume(staleness, start):
    window = AsyncWindow(staleness=staleness, steps_per_iteration=2, iterations=8)
    schedule = _schedule(window, start)
    assert sorted(j for j, _, _ in schedule) == list(range(start, 8))
    for j, serving, training in schedule:
        if start == 0 or j >= start + staleness:  # sampled now: the serving weights are the rule's
            assert serving == window.sampling_version(j), (j, serving)
        else:  # a resume's first s batches: the learner is past their version, they must come from the run folder
            assert serving > window.sampling_version(j), (j, serving)
        assert window.learner_version(j) - serving <= staleness * 2  # never beyond the window
    if staleness:
        assert all(training == j - staleness for j, _, training in schedule if training >= 0)


def test_the_window_is_bounded_and_synchronous_without_staleness():
    sync = AsyncWindow(staleness=0, steps_per_iteration=4, iterations=5)
    assert [sync.sampling_version(i) for i in range(5)] == [0, 4, 8, 12, 16]
    assert sync.beside_update(2) is None and sync.collect_before_training(2) == [2]
    assert not sync.takes_inbox(dynamic_sampling=False)
    two = AsyncWindow(staleness=2, steps_per_iteration=2, iterations=5)
    assert [two.sampling_version(i) for i in range(5)] == [0, 0, 0, 2, 4]
    assert two.collect_before_training(0) == [0, 1] and two.collect_before_training(4) == [4]
    assert two.collect_before_training(1, collected={1}) == [2]
    assert [two.beside_update(i) for i in range(5)] == [2, 3, 4, None, None]


def test_inbox_rows_are_eligible_between_the_sampling_and_the_learner_version():
    window = AsyncWindow(staleness=2, steps_per_iteration=3, iterations=10)
    assert window.versions_for(5) == (9, 15) and window.versions_for(1) == (0, 3)
    assert window.takes_inbox(dynamic_sampling=False) and not window.takes_inbox(dynamic_sampling=True)
    assert list(window.inbox_lookback(5)) == [2, 3, 4] and list(window.inbox_lookback(0)) == []


def test_staleness_is_measured_and_a_batch_beyond_the_window_is_refused():
    window = AsyncWindow(staleness=1, steps_per_iteration=2, iterations=10)
    assert window.staleness_of(3, own_version=4, batch_rows=8) == (1.0, 1.0)
    # 2 inbox rows at versions 5 and 6 beside 6 own rows at version 4, learner at 6: (6*1 + 0.5+0) / 8
    mean, worst = window.staleness_of(3, own_version=4, batch_rows=8, inbox_rows=2, inbox_version_sum=11,
                                      inbox_version_min=5)
    assert mean == pytest.approx((6 * 1.0 + 2 * 0.25) / 8) and worst == 1.0
    with pytest.raises(StaleBatch, match=r"iteration 3's inbox rows are 1.5 iterations stale.*inbox_max_staleness=1"):
        window.staleness_of(3, own_version=4, batch_rows=8, inbox_rows=1, inbox_version_sum=3, inbox_version_min=3)
    with pytest.raises(StaleBatch, match=r"iteration 3's rollouts are 2.0 iterations stale.*max_staleness=1"):
        window.staleness_of(3, own_version=2, batch_rows=8)


def test_a_wider_inbox_window_takes_older_outside_rows_and_keeps_the_own_bound():
    """rollout.inbox_max_staleness: outside episodes finish after they are sampled (the endpoint's), so they may
    lag further than the run's own rollouts, which keep rollout.max_staleness."""
    wide = AsyncWindow(staleness=1, steps_per_iteration=2, iterations=10, inbox_staleness=3)
    assert wide.versions_for(5) == (4, 10) and wide.versions_for(1) == (0, 2)
    assert [wide.sampling_version(i) for i in range(4)] == [0, 0, 2, 4]  # own rollouts: unchanged
    assert list(wide.inbox_lookback(5)) == [1, 2, 3, 4]
    assert wide.staleness_of(3, own_version=4, batch_rows=8, inbox_rows=1, inbox_version_sum=0,
                             inbox_version_min=0)[1] == 3.0
    with pytest.raises(StaleBatch, match="rollouts are 2.0 iterations stale"):
        wide.staleness_of(3, own_version=2, batch_rows=8)
