"""The sections of where a run lives: ``cluster``, ``weights``, ``storage``, ``checkpoint``, ``logging``, the model
``registry`` and the eval ``gate``."""
from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from grpo_core.config.section import _Section
from grpo_core.config.placements import PLACEMENTS

METRIC_BACKENDS = ("tensorboard", "wandb", "mlflow")  # grpo_core.run.metric_sinks; the Tinker service's --metrics


class RoleResources(_Section):
    """What one actor of a role reserves from Ray, and where it may run (custom resources pin it to nodes)."""

    num_cpus: float = Field(default=1.0, gt=0.0, description="Ray CPUs reserved (fractions allowed)")
    num_gpus: float = Field(default=0.0, ge=0.0, description="GPUs reserved (fractions share one GPU)")
    resources: dict[str, float] = Field(
        default_factory=dict, description="custom Ray resources, e.g. {sampler_node: 0.01} to pin to such nodes; "
                                          "amounts >= 0")
    torch_threads: int | None = Field(default=None, ge=1, description="threads inside the actor (default: all "
                                                                      "cores of its node)")

    @field_validator("resources")
    @classmethod
    def _amounts(cls, resources: dict[str, float]) -> dict[str, float]:
        negative = {k: v for k, v in resources.items() if v < 0}
        if negative:
            raise ValueError(f"custom resources are amounts >= 0, got {negative}")
        return resources


class ClusterConfig(_Section):
    placement: Literal["colocate", "split", "external"] = Field(
        default="colocate", description="colocate: each actor holds a sampler and a learner rank, weights move "
                                        "in-process; split: sampler actors and learner actors apart; external: "
                                        "samplers are OpenAI-compatible vLLM servers (cluster.servers), each driven "
                                        "by a light actor (cluster.sampler_resources)")
    samplers: int = Field(default=1, ge=1, description="vLLM engines, one Ray actor each (colocate: defaults to "
                                                       "cluster.learners)")
    learners: int = Field(default=1, ge=1, description="DeepSpeed data-parallel ranks, one Ray actor each")
    sampler_resources: RoleResources = Field(default_factory=RoleResources,
                                             description="what one sampler actor reserves (split and external "
                                                         "placement)")
    learner_resources: RoleResources = Field(
        default_factory=RoleResources, description="also what a colocated actor (sampler + learner) reserves")
    reward_resources: RoleResources = Field(
        default_factory=RoleResources, description="what one model-reward actor reserves (reward.models)")
    ray_address: str | None = Field(default=None, description="None: start a local Ray on 127.0.0.1")
    max_actor_restarts: int = Field(
        default=3, ge=0, description="times the flow recreates a dead engine actor from the latest checkpoint "
                                     "before it gives up")
    servers: list[str] = Field(
        default_factory=list, description="placement=external: base URLs of OpenAI-compatible vLLM servers started "
                                          "with `grpo serve` (e.g. http://127.0.0.1:8000), one sampler each")
    server_timeout_s: float = Field(
        default=120.0, gt=0.0, description="placement=external: seconds one HTTP request to a server may take "
                                           "before it is retried")
    server_retries: int = Field(
        default=2, ge=0, description="placement=external: retries of a request that timed out or could not "
                                     "connect; then the server counts as down and its share goes to the others")

    @model_validator(mode="before")
    @classmethod
    def _samplers_follow_placement(cls, data: Any) -> Any:
        """Colocated actors hold one sampler and one learner rank each: `cluster.learners=2` alone means two.
        External samplers are the listed servers."""
        if not isinstance(data, dict):
            return data
        placement = PLACEMENTS.get(data.get("placement", "colocate"))  # an unknown name: the field's own error
        samplers = placement().default_samplers(data) if placement is not None else None
        if "samplers" not in data and samplers is not None:
            data = {**data, "samplers": samplers}
        return data


class WeightsConfig(_Section):
    transport: Literal["auto", "inprocess", "broadcast", "files", "cuda_ipc"] = Field(
        default="auto", description="how new weights reach the samplers: inprocess (colocate), broadcast (split: "
                                    "learner rank 0 -> every sampler worker, gloo on CPU / NCCL on GPU), files "
                                    "(weights/v-N/ in the run store), cuda_ipc (same GPU, other process); auto: "
                                    "inprocess for colocate, broadcast for split, files for external")
    bucket_mb: int = Field(default=64, ge=1, description="broadcast: tensors travel packed in buckets of this size")
    check_samples: int = Field(
        default=4, ge=0, description="after a checked sync, every sampler's weights are compared with the "
                                     "learner's by digest (a sampler with other weights fails the run), and the "
                                     "logprob gap measured on this many rollout sequences of every sampler "
                                     "(metrics sync_logprob_*); 0: no check")
    check_every: int = Field(
        default=1, ge=1, description="run that check after every n-th iteration's sync (and the last); the "
                                     "version check before every rollout is never skipped")
    check_tolerance: float | None = Field(
        default=None, gt=0.0, description="optional bound on sync_logprob_max_diff: beyond it the run fails. None "
                                          "(default): no bound, the digests decide (bfloat16 engines differ by up "
                                          "to ~0.8 on a real model's rare tokens with identical weights)")


class StorageConfig(_Section):
    root: str = Field(default="runs", description="local folder or s3://bucket/prefix")
    options: dict[str, Any] = Field(default_factory=dict, description="fsspec options, e.g. client_kwargs")
    retries: int = Field(
        default=5, ge=0, le=20, description="Prefect retries of a stage whose run-folder I/O failed transiently "
                                            "(connection refused, timeout, object-store error)")
    retry_delay_s: float = Field(
        default=1.0, ge=0.0, le=600.0, description="delay before the first retry; doubles each time (1, 2, 4, 8, "
                                                   "16 s)")

    @property
    def retry_delays(self) -> list[float]:
        """Seconds to wait before each retry: exponential backoff."""
        return [self.retry_delay_s * 2**i for i in range(self.retries)]


class CheckpointConfig(_Section):
    interval: int = Field(
        default=10, ge=0, description="iterations between checkpoints (and always after the last one); "
                                      "0: none but the final policy")
    keep_last: int = Field(default=2, ge=0, description="complete checkpoints kept; 0 keeps all")


class LoggingConfig(_Section):
    """Where a run's figures and logs go besides metrics.parquet and the Prefect UI."""

    backends: list[Literal[METRIC_BACKENDS]] = Field(
        default_factory=lambda: ["tensorboard"],
        description="metric sinks: tensorboard (event files in the run folder's tensorboard/, the default), wandb "
                    "and mlflow (when installed; offline unless WANDB_MODE / MLFLOW_TRACKING_URI say otherwise)")
    project: str = Field(default="grpo-flow", description="W&B project / MLflow experiment name")
    verbose: bool = Field(default=False, description="show the libraries' log lines (vLLM, DeepSpeed, Ray, "
                          "Prefect) on the terminal; otherwise they go to logs/ in the run folder (`grpo train -v`)")
    console_interval_s: float = Field(
        default=10.0, ge=0.0, le=3600.0,
        description="the Prefect UI's progress and metrics-table artifacts are published at most this often (and at "
                    "every evaluation and the run's end); 0: after every iteration. Each is a request carrying the "
                    "whole table")

    @model_validator(mode="after")
    def _unique(self) -> "LoggingConfig":
        if len(set(self.backends)) != len(self.backends):
            raise ValueError(f"logging.backends lists a backend twice: {self.backends}")
        return self


REGISTRY_FOLDER = "registry"  # under storage.root: the default home of the model registry
CHAMPION = "champion"         # model.init_from: the registry's champion


class RegistryConfig(_Section):
    """Where the champion and every gated challenger are recorded (``grpo registry show``). MLflow's model registry by
    default (the ``champion`` alias on a registered model), or a plain JSON document in a folder."""

    kind: Literal["mlflow", "folder"] = Field(
        default="mlflow", description="mlflow: MLflow's model registry (a SQLite store under storage.root, or "
                                      "registry.uri); folder: one registry.json in a folder (local or fsspec URL)")
    uri: str | None = Field(
        default=None, description="mlflow: a tracking URI (sqlite:///path.db, http://host:5000); folder: a folder "
                                  "or fsspec URL. None: storage.root/registry (mlflow: its mlflow.db)")
    name: str = Field(default="grpo-policy", pattern=r"^[A-Za-z0-9._-]+$",
                      description="the registered model: the lineage of policies one champion is chosen from")
    timeout_s: float = Field(
        default=10.0, gt=0.0, le=600.0,
        description="how long one request to a registry server may take (MLflow over HTTP) before the registry "
                    "counts as unavailable")


class GateConfig(_Section):
    """The eval gate at the end of a run: its final policy (the challenger) and the registry's champion are
    evaluated on the gate sets with the same prompts and seeds; the challenger becomes champion only if it wins.

    ``metric`` is a per-set figure of the eval sets (``accuracy``, or ``pass@k`` of a set with samples), averaged
    over the gate sets; promotion needs ``challenger - champion >= margin`` and, for each of ``guards``, a loss of
    at most its tolerance. Without a champion yet the challenger is promoted when it reaches ``min_value``."""

    sets: list[str] | None = Field(
        default=None, description="names of eval sets to gate on (eval.datasets, or 'default' for data.eval_path); "
                                  "None: every eval set")
    metric: str = Field(default="accuracy", pattern=r"^(accuracy|pass@[0-9]+)$",
                        description="the figure compared: accuracy or pass@k, the mean over the gate sets")
    margin: float = Field(default=0.02, ge=0.0, le=1.0,
                          description="the challenger must beat the champion by at least this much on metric")
    guards: dict[str, float] = Field(
        default_factory=dict, description="other figures (accuracy, pass@k) the challenger may lose by at most the "
                                          "given tolerance in [0, 1], e.g. {pass@8: 0.05}")
    min_value: float = Field(default=0.0, ge=0.0, le=1.0,
                             description="the first champion (no champion yet) needs metric >= this")

    @model_validator(mode="after")
    def _guards(self) -> "GateConfig":
        bad = [k for k in self.guards if not re.fullmatch(r"accuracy|pass@[0-9]+", k)]
        if bad:
            raise ValueError(f"gate.guards names {bad}: a guard is accuracy or pass@k")
        out_of_range = {k: v for k, v in self.guards.items() if not 0.0 <= v <= 1.0}
        if out_of_range:
            raise ValueError(f"gate.guards tolerances are in [0, 1] (accuracy and pass@k are), got {out_of_range}")
        if self.sets is not None and (not self.sets or len(set(self.sets)) != len(self.sets)):
            raise ValueError(f"gate.sets must name at least one set, each once: {self.sets}")
        return self

    @property
    def figures(self) -> list[str]:
        """The per-set figures the gate reads: metric, then the guarded ones."""
        return [self.metric] + [k for k in self.guards if k != self.metric]
