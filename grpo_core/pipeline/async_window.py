"""The bounded-staleness rule of async RL in one object: which weights sample which iteration, which rollouts run
beside which update, and which rows (our own or the inbox's) an iteration may train on.

Why one object: the rule (``rollout.max_staleness`` s) decides the flow's order of stages, the version every rollout
must be sampled with, the inbox's accepted versions and the staleness the metrics report; spread over those places
it held only by statement order. Here, as prime-rl's orchestrator ``Scheduler`` owns ``max_async_level``, the flow
asks the window and the tasks check against it.

The rule: iteration k's rollouts are sampled with the weights the learner had before iteration k - s (the rollout
of k runs while k - s trains), so every row of k's batch is at most s iterations behind the learner that trains on
it. A run that starts at iteration 0 first collects the batches of 0 .. s - 1, all sampled with the first weights;
one that resumes at k finds k .. k + s - 1 complete in the run folder (collected before the interruption, each with
its own version; the rollout task refuses to sample them with other weights), so resumes are exact. s = 0 is
synchronous RL: one batch, sampled with the current weights, nothing beside the update.
"""
from __future__ import annotations

from dataclasses import dataclass


class StaleBatch(RuntimeError):
    """A batch holds rows older than the window allows; it is never trained on."""


@dataclass(frozen=True)
class AsyncWindow:
    staleness: int  # rollout.max_staleness: s
    steps_per_iteration: int  # optimizer steps (policy versions) per iteration
    iterations: int  # the run's length
    inbox_staleness: int | None = None  # how far an inbox row may lag (rollout.inbox_max_staleness; None: staleness)

    @property
    def inbox_lag(self) -> int:
        return self.staleness if self.inbox_staleness is None else self.inbox_staleness

    def learner_version(self, iteration: int) -> int:
        """The learner's policy version when ``iteration`` starts (before its update)."""
        return iteration * self.steps_per_iteration

    def sampling_version(self, iteration: int) -> int:
        """The policy version that must sample ``iteration``'s rollouts: the learner's s iterations earlier."""
        return self.learner_version(max(0, iteration - self.staleness))

    def collect_before_training(self, iteration: int, collected: set[int] | frozenset[int] = frozenset()
                                ) -> list[int]:
        """The iterations whose batches must be in hand before ``iteration`` trains, oldest first: its own and, in
        async RL, the next s - 1 (``collected``: those already in hand, so in steady state nothing or its own).
        At a start they are sampled with the first weights; at a resume they are read back from the run folder."""
        end = min(iteration + max(1, self.staleness), self.iterations)
        return [j for j in range(iteration, end) if j not in collected]

    def beside_update(self, iteration: int) -> int | None:
        """The iteration whose rollout runs while ``iteration`` trains (async RL), or None."""
        ahead = iteration + self.staleness
        return ahead if self.staleness and ahead < self.iterations else None

    def versions_for(self, iteration: int) -> tuple[int, int]:
        """(oldest, newest) policy version an inbox row of ``iteration``'s batch may have been sampled with: our own
        rollouts have exactly ``sampling_version``, an outside producer's anything from ``inbox_lag`` iterations
        back to the learner's."""
        return self.learner_version(max(0, iteration - self.inbox_lag)), self.learner_version(iteration)

    def takes_inbox(self, dynamic_sampling: bool) -> bool:
        """Whether an iteration takes experience from the inbox: in async RL, without dynamic sampling (whose
        rounds would resample the inbox's groups)."""
        return self.staleness > 0 and not dynamic_sampling

    def inbox_lookback(self, iteration: int) -> range:
        """Earlier iterations whose inbox takes a resume at ``iteration`` may have left undeleted (a crash between
        an iteration's commit and its deletes): their items are never taken again."""
        return range(max(0, iteration - self.inbox_lag - 1), iteration)

    def staleness_of(self, iteration: int, own_version: int, batch_rows: int, inbox_rows: int = 0,
                     inbox_version_sum: int = 0, inbox_version_min: int | None = None) -> tuple[float, float]:
        """(mean, max) over the batch's rows of how many iterations the learner is ahead of the weights that
        sampled them: our rollouts share ``own_version``, inbox rows carry their own. Raises ``StaleBatch`` when
        the max is beyond the window (the sampling rule makes that impossible; never train on it if it did)."""
        steps, learner = self.steps_per_iteration, self.learner_version(iteration)
        own = (learner - own_version) / steps
        if own > self.staleness:
            raise StaleBatch(f"iteration {iteration}'s rollouts are {own} iterations stale, more than "
                             f"rollout.max_staleness={self.staleness}")
        mean = worst = own
        if inbox_rows:
            outside_mean = (learner * inbox_rows - inbox_version_sum) / steps / inbox_rows
            own_rows = batch_rows - inbox_rows
            mean = (own * own_rows + outside_mean * inbox_rows) / batch_rows
            worst = max(own, (learner - (inbox_version_min if inbox_version_min is not None else learner)) / steps)
        if worst > self.inbox_lag:
            raise StaleBatch(f"iteration {iteration}'s inbox rows are {worst} iterations stale, more than "
                             f"rollout.inbox_max_staleness={self.inbox_lag}")
        return mean, worst
