"""On-policy distillation's signal: a teacher grades every token the student sampled.

The student samples as in RL; the teacher's logprob of each sampled token against the student's gives a per-token
advantage, ``log pi_teacher(y_t) - log pi_student(y_t)``: the negative of the single-sample (k1) estimate of the
reverse KL ``KL(pi_student || pi_teacher)`` at that token. Trained with the policy objective, the student lowers its
reverse KL to the teacher on its own samples (Agarwal et al. 2024, GKD with lambda = 1; Thinking Machines' on-policy
distillation; TRL's GKD and verl's, slime's and prime-rl's on-policy distillation). Mixed with a verifiable reward's
advantage by a weight, the reward still counts where the teacher is unsure.

One sampled token per position is a noisy view of the teacher's distribution. With the teacher's top K tokens at
each position (``top_k_forward_kl``) the loss also matches the student to the teacher there, in a forward KL over
those K tokens: dense supervision on the student's own prefixes, as GKD's forward-KL end and the top-K logit
distillation of verl and slime keep it affordable (K values per token, not a vocabulary's).
"""
from __future__ import annotations

import torch
from torch import Tensor

from grpo_core.algo.losses import aggregate_loss


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



def top_k_forward_kl(student_top_logprobs: Tensor, teacher_top_logprobs: Tensor, mask: Tensor, *,
                     agg_mode: str = "token_mean", denominator: float | None = None,
                     norm_length: int | None = None) -> tuple[Tensor, dict[str, float]]:
    """The forward KL from the teacher's top K to the student at every sampled token, aggregated like the loss.

    student_top_logprobs: [B, T, K] log pi_student of the teacher's K tokens at each position (with gradient; the
                          full-vocabulary log-softmax gathered at those ids, at the sampling temperature).
    teacher_top_logprobs: [B, T, K] log pi_teacher of the same tokens (its K most likely).
    mask:                 [B, T] 1 on the tokens the student sampled.

    Per token: ``sum_k q_k (log q_k - log pi_student(k))`` with ``q`` the teacher's top-K probabilities renormalised
    to sum to 1 (the mass outside its top K is dropped). It is >= 0 (the student's K probabilities sum to at most 1),
    0 exactly when the student gives those K tokens the teacher's renormalised probabilities, and its gradient
    ``-sum_k q_k grad log pi_student(k)`` is the cross-entropy's to the teacher's top K. Aggregated by
    ``aggregate_loss`` with ``agg_mode`` / ``denominator`` / ``norm_length`` as the policy loss is.

    Returns (the aggregated term, metrics): ``top_k_kl``, this micro-batch's mean per sampled token."""
    if student_top_logprobs.shape != teacher_top_logprobs.shape or student_top_logprobs.dim() != 3 \
            or student_top_logprobs.shape[:2] != mask.shape:
        raise ValueError(f"student {tuple(student_top_logprobs.shape)} and teacher "
                         f"{tuple(teacher_top_logprobs.shape)} top-K logprobs must be [B, T, K] over mask "
                         f"{tuple(mask.shape)}")
    log_q = torch.log_softmax(teacher_top_logprobs.to(student_top_logprobs.dtype), dim=-1)  # renormalised top K
    per_token = (log_q.exp() * (log_q - student_top_logprobs)).sum(-1)
    value = aggregate_loss(per_token, mask, agg_mode, norm_length=norm_length, global_denominator=denominator)
    m = mask.to(per_token.dtype)
    return value, {"top_k_kl": float((per_token.detach() * m).sum() / m.sum().clamp(min=1))}
