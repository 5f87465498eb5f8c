"""The on-policy distillation teacher: a model that scores every token the student sampled (``grpo_core.rewards.teacher.base``
the interface, ``causal_lm`` the transformers model behind it). Ray actors hold it in a run
(``grpo_core.cluster.teacher``); the score stage turns its logprobs into per-token advantages
(``grpo_core.pipeline.distillation``)."""
from grpo_core.rewards.teacher.base import Teacher, TeacherInput, TeacherScores

__all__ = ["Teacher", "TeacherInput", "TeacherScores"]
