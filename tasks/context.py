"""What the tasks of one flow run share: the config, the run folder, the long-lived engines and the scorer.

Created once per flow run; tasks receive it and never rebuild an engine.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grpo_core.config import GRPOConfig
from grpo_core.pipeline.prompts import PromptStream
from grpo_core.rewards.scorer import Scorer
from grpo_core.storage import RunStore


@dataclass
class RunContext:
    cfg: GRPOConfig
    store: RunStore
    worker: Any                      # Ray actor handle of grpo_core.policy_worker.PolicyWorker
    scorer: Scorer
    train_prompts: PromptStream
    eval_prompts: list[dict[str, Any]] = field(default_factory=list)
