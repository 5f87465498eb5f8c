"""On-policy distillation's signal: a teacher grades every token the student sampled.

The student samples as in RL; the teacher's logprob of each sampled token against the student's gives a per-token
advantage, ``log pi_teacher(y_t) - log pi_student(y_t)``: the negative of the single-sample (k1) estimate of the
reverse KL ``KL(pi_student || pi_teacher)`` at that token. Trained with the policy objective, the student lowers its
reverse KL to the teacher on its own samples (Agarwal et al. 2024, GKD with lambda = 1; Thinking Machines' on-policy
distillation; TRL's GKD and verl's, slime's and prime-rl's on-policy distillation). Mixed with a verifiable reward's
advantage by a weight, the reward still counts where the teacher is unsure.
"""
from __future__ import annotations

from torch import Tensor


def distillation_advantages(student_logprobs: Tensor, teacher_logprobs: Tensor, mask: Tensor, *,
                            reward_advantages: Tensor | None = None, reward_weight: float = 0.0,
                            teacher_top_ids: Tensor | None = None, sampled_ids: Tensor | None = None
                            ) -> tuple[Tensor, dict[str, float]]:
    """Per-token advantages of on-policy distillation, and their metrics.

    student_logprobs:  [B, T] log pi_student of the sampled tokens (the policy that sampled them; detached).
    teacher_logprobs:  [B, T] log pi_teacher of the same tokens, given the same context.
    mask:              [B, T] 1 on the tokens the student sampled (0 on prompt, padding, environment tokens).
    reward_advantages: [B] or [B, T] the verifiable reward's advantages (GRPO's), mixed in with ``reward_weight``.
    teacher_top_ids:   [B, T] the teacher's most likely token at each position, with ``sampled_ids`` [B, T] (the
                       student's tokens): for the agreement metric.

    Returns ``A`` [B, T] = (teacher - student) + reward_weight * reward_advantages (broadcast over T), 0 where the
    mask is 0. Metrics: ``reverse_kl`` (the mean over sampled tokens of student - teacher, the k1 estimate per
    token), ``teacher_logprob_mean``, and ``teacher_agreement`` (the share of sampled tokens that are the
    teacher's top token) when the ids are given."""
    if student_logprobs.shape != teacher_logprobs.shape or student_logprobs.shape != mask.shape:
        raise ValueError(f"student {tuple(student_logprobs.shape)}, teacher {tuple(teacher_logprobs.shape)} and "
                         f"mask {tuple(mask.shape)} logprobs must have the same [B, T] shape")
    m = mask.to(student_logprobs.dtype)
    gap = (teacher_logprobs - student_logprobs) * m
    advantages = gap
    if reward_weight:
        if reward_advantages is None:
            raise ValueError("reward_weight is set but no reward_advantages were given")
        r = reward_advantages.to(gap.dtype)
        advantages = gap + reward_weight * (r.unsqueeze(1) if r.dim() == 1 else r) * m
    tokens = m.sum().clamp(min=1)
    metrics = {"reverse_kl": float(-gap.sum() / tokens),
               "teacher_logprob_mean": float((teacher_logprobs * m).sum() / tokens)}
    if teacher_top_ids is not None:
        if sampled_ids is None:
            raise ValueError("teacher_top_ids needs sampled_ids (the student's tokens) to measure agreement")
        agree = (teacher_top_ids == sampled_ids).to(m.dtype) * m
        metrics["teacher_agreement"] = float(agree.sum() / tokens)
    return advantages, metrics

