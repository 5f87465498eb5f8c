"""What the engine actors and the driver's handles return, typed: these cross Ray as they are (plain dataclasses
pickle), so the flow and its tasks read fields, never keys. A misspelt field fails at once instead of becoming a
silent None column. The open-ended metric sets (an update's algorithm metrics) stay a dict inside ``TrainStep``,
reduced across ranks by ``grpo_core.engine.train.step_metrics``.
"""
from __future__ import annotations

from dataclasses import dataclass

from grpo_core.engine.precision import LogprobGap
from grpo_core.engine.train.step_metrics import merge_ranks


@dataclass(frozen=True)
class ActorInfo:
    """One engine actor after ``setup``: its roles, engines' start-up times, process and compute dtype."""
    sampler_id: int | None
    learner_rank: int | None
    sampler_load_s: float
    learner_init_s: float
    startup_s: float
    pid: int
    host: str
    dtype: str
    threads: int


@dataclass(frozen=True)
class PlacedActor:
    """Where one actor runs, as the run's status.json lists it."""
    role: str
    pid: int
    host: str
    node: str
    address: str


@dataclass(frozen=True)
class EnginesInfo:
    """The engines once placed and built (``Engines.start`` / ``recreate``)."""
    dtypes: tuple[str, ...]
    actors: list[PlacedActor]
    sampler_load_s: float
    learner_init_s: float
    setup_s: float
    recreate_s: float | None = None


@dataclass(frozen=True)
class Versions:
    """The policy version an actor's sampler serves and its learner holds (None: the actor has no such role)."""
    sampler: int | None
    learner: int | None


@dataclass(frozen=True)
class SampledPart:
    """One sampler's share of a rollout or an evaluation (its rows travel beside it as an Arrow table)."""
    seconds: float
    policy_version: int | None
    sampler_id: int | None


@dataclass(frozen=True)
class Sampled:
    """A whole rollout or evaluation across the fleet: the slowest share's seconds, the one version that sampled
    it, and what happened to the samplers."""
    seconds: float
    policy_version: int | None
    samplers_used: int = 0
    samplers_lost: int = 0  # died (or stopped answering) during it; their shares went to others
    samplers_live: int = 0


@dataclass(frozen=True)
class TrainStep:
    """One policy update: its metrics (one rank's, or merged over the ranks by ``merge``), the policy version
    after it, and how many learner ranks it merges."""
    metrics: dict[str, float]
    policy_version: int
    learners: int = 1

    @classmethod
    def merge(cls, per_rank: list["TrainStep"]) -> "TrainStep":
        return cls(merge_ranks([s.metrics for s in per_rank]), per_rank[0].policy_version, len(per_rank))

    @property
    def seconds(self) -> float:
        return float(self.metrics["seconds"])

    def to_json(self) -> dict[str, float]:
        """train.json: the metrics, the policy version and the ranks."""
        return {**self.metrics, "policy_version": self.policy_version, "learners": self.learners}


@dataclass(frozen=True)
class CheckpointStarted:
    """A learner rank copied its state to memory and writes it in the background."""
    folder: str
    snapshot_seconds: float
    policy_version: int


@dataclass(frozen=True)
class Restored:
    seconds: float
    policy_version: int


@dataclass(frozen=True)
class FinalPolicy:
    """The trained policy in HF format under the run's ``final/`` (``files``: name -> bytes)."""
    folder: str
    files: dict[str, int]
    policy_version: int


@dataclass(frozen=True)
class Loaded:
    """A sampler loaded a published version from the run store."""
    seconds: float
    version: int


@dataclass(frozen=True)
class Scaled:
    samplers_before: int
    samplers: int
    seconds: float


@dataclass(frozen=True)
class SyncResult:
    """One weight sync and, when it was checked, the tensors whose digests matched on every sampler, the logprob
    gap that remains (``LogprobGap``) and the check's seconds."""
    seconds: float
    version: int
    transport: str
    bytes: float | None = None
    tensors_checked: int | None = None
    gap: LogprobGap | None = None
    check_seconds: float | None = None  # None: not checked
    samplers_replaced: int = 0  # samplers that died earlier and serve again from this sync on
    samplers_out: int = 0  # samplers still out after it (waiting for a node that can hold them, or a server down)
