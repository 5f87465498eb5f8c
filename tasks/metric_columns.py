"""What each column of ``metrics.parquet`` means: the source of the docs' metrics reference.

Why here: ``tasks/results.py:IterationRecord.row`` builds the row, so the columns' meanings sit beside it, and a test
checks that every column a run writes is described here (``undocumented``). A name with ``<...>`` stands for a family
(``reward_<name>_mean`` for each reward component, ``eval/<set>/pass@<k>`` for each eval set and k).
"""
from __future__ import annotations

import re
from collections.abc import Iterable

# (column, meaning), grouped as the reference page shows them. Units: s = seconds; "frac" columns are shares in [0, 1].
GROUPS: dict[str, tuple[tuple[str, str], ...]] = {
    "Run and iteration": (
        ("iteration", "0-based iteration index"),
        ("run_attempt", "0 for the first start, +1 per resume: shows which iterations a resume redid"),
        ("samplers", "sampler actors (or external servers) live at the iteration's start"),
        ("resynced", "the version check before the rollout found a sampler behind the learner and synced it again"),
        ("policy_version", "the learner's policy version that sampled the iteration's first rollout round"),
        ("staleness_mean", "mean of (learner version - sampling version) over the trained rows, in iterations "
                           "(0 when synchronous)"),
        ("staleness_max", "largest such staleness; never above rollout.max_staleness"),
    ),
    "Rewards and scoring": (
        ("reward_mean", "mean total reward of the trained batch (weighted sum of reward.rewards, before "
                        "advantages)"),
        ("accuracy_mean", "mean of the accuracy reward (None when accuracy is not among reward.rewards)"),
        ("reward_<name>_mean", "mean of reward component <name> over the rows it scored (rule rewards, plugins, "
                               "reward models and judges)"),
        ("reverse_kl", "on-policy distillation: mean over the sampled tokens of log pi_student - log pi_teacher "
                       "(the k1 estimate of KL(student || teacher) per token; the student's logprobs the sampler's)"),
        ("teacher_logprob_mean", "on-policy distillation: the teacher's mean logprob of the sampled tokens"),
        ("teacher_agreement", "on-policy distillation: share of the sampled tokens that are the teacher's most "
                              "likely token there"),
        ("teacher_top_k_mass", "on-policy distillation with distill.top_k: the teacher's mean probability mass in "
                               "its top K at the sampled positions (the share of its distribution the KL sees)"),
        ("distinct_frac", "share of (response, dataset row) pairs verified once (reward.dedupe): repeats are "
                          "scored from the first"),
        ("kept_frac", "dynamic sampling (algo.filter_groups): share of sampled groups kept for training"),
        ("filtered_group_frac", "dynamic sampling: share of sampled groups dropped by algo.filter_range"),
        ("nonfinite_groups", "groups holding a reward that is NaN or infinite, left out of the step whole (their "
                             "rows unscored)"),
        ("rows_nonfinite", "kept rows the learner left out because an input (advantage, sampler or teacher "
                           "logprob) was NaN or infinite"),
        ("rollout_rounds", "rollout rounds the iteration sampled (more than 1 when dynamic sampling refills the "
                           "batch)"),
        ("inbox_groups", "groups taken from the run folder's inbox/ (an outside producer's rollouts)"),
        ("inbox_rejected", "inbox files refused this iteration (moved to inbox/rejected/ with the reason)"),
        ("outside_groups", "atropos or endpoint.clients: groups that came into the inbox for the iteration (pulled "
                           "from Atropos's /batch, or finished by the endpoint's clients)"),
        ("outside_refused", "atropos: pulled groups refused (inbox/rejected/ keeps each with its reason)"),
        ("outside_wait_s", "atropos or endpoint.clients: seconds the iteration waited for its groups"),
        ("outside_process_restarts", "environment or client processes started again after they exited"),
        ("outside_server_restarts", "atropos: times the API server stopped answering and was started again"),
        ("outside_short_groups", "groups the iteration went without: nothing came for the wait, so it trained on "
                                 "the groups it had (the rest of the batch masked-out copies of them)"),
    ),
    "Rollout": (
        ("response_length_mean", "mean response length in tokens (first rollout round)"),
        ("truncated_frac", "share of responses cut by rollout.max_new_tokens (first rollout round)"),
        ("rollout_tokens", "tokens the iteration sampled, all rounds (prompt tokens not counted)"),
        ("samplers_lost", "samplers (or servers) that died or stopped answering during the rollout; their "
                          "prompts were redone by the others"),
        ("samplers_replaced", "samplers that were out (died, or a server down) and serve again from this "
                              "iteration's sync on: a new actor where a node could hold it, or the server back"),
        ("samplers_out", "samplers still out after this iteration's sync: no node can hold a replacement yet (tried "
                         "again at every sync), or a server not answering"),
        ("turns_mean", "multi-turn: assistant turns per episode"),
        ("tool_calls_mean", "multi-turn: tool calls per episode"),
        ("tool_call_frac", "multi-turn: share of episodes with at least one tool call"),
        ("tool_errors", "multi-turn: tool calls that failed, timed out or printed too much"),
        ("episode_truncated_frac", "multi-turn: share of episodes cut by env.max_turns or a token budget before "
                                   "the policy answered"),
        ("env_errors", "multi-turn: episodes ended by an environment that raised or hung"),
        ("pool_active", "data.sampler=difficulty_pool: train prompts in the pool when the iteration drew"),
        ("pool_easy", "difficulty pool: prompts out of it because their last group was all right"),
        ("pool_hard", "difficulty pool: prompts out of it because their last group was all wrong"),
        ("pool_skipped", "difficulty pool: turns passed over to draw this iteration's prompts"),
    ),
    "Learner": (
        ("loss", "the update's total loss (policy loss plus the KL and entropy terms), mean over its mini-batches and "
                 "epochs"),
        ("grad_norm", "gradient norm before clipping (train.grad_clip), mean over the optimizer steps"),
        ("lr", "learning rate after the update's last optimizer step"),
        ("padded_frac", "share of the positions the learner's decoder computed that were padding: 0 with "
                        "train.pack_prompts (packed rows); without, each micro-batch is cut to its longest row and "
                        "train.max_tokens_per_microbatch groups rows by length"),
        ("computed_tokens_frac", "positions the learner's decoder computed / every trained row's prompt + response "
                                 "tokens: below 1 where packed rows hold each group's prompt once, above 1 with "
                                 "padding"),
        ("nll", "SFT runs: the negative log-likelihood per assistant token of the iteration's conversations, before "
                "the update (mean over its micro-batches); the loss of an SFT run is the same quantity, averaged "
                "over every assistant token of each mini-batch"),
        ("clipfrac", "share of response tokens whose ratio was clipped"),
        ("clipfrac_low", "share clipped below 1 - algo.clip_eps_low"),
        ("clipfrac_high", "share clipped above 1 + algo.clip_eps_high"),
        ("approx_kl", "k3 estimate of the KL between the policy being updated and the old policy, token mean"),
        ("kl_ref", "KL to the reference model (algo.kl_coeff > 0)"),
        ("entropy", "mean token entropy of the policy on the response tokens"),
        ("mismatch_abs_logp_mean", "mean |learner - sampler| logprob of the trained tokens before the update: the "
                                   "engines' agreement on-policy, plus the policy's drift in async RL"),
        ("mismatch_abs_logp_max", "largest such difference over every trained token"),
        ("offpolicy_weight_mean", "algo.offpolicy: mean per-token loss weight of the correction"),
        ("offpolicy_masked_frac", "algo.offpolicy: share of response tokens the correction masked (weight 0)"),
        ("offpolicy_capped_frac", "algo.offpolicy: share of response tokens whose weight was capped at "
                                  "algo.tis_cap"),
        ("top_k_kl", "on-policy distillation with distill.top_k: the learner's forward KL from the teacher's "
                     "top K (renormalised) to the policy per sampled token, averaged over the micro-batches"),
    ),
    "Turn-level credit (algo.turn_credit: step_groups; columns only in such runs)": (
        ("step_group_size_mean", "turns per step group (the group's turns taken from the same state), mean over "
                                 "the batch's turns"),
        ("step_grouped_frac", "share of the batch's turns whose state another episode of their group shares (the "
                              "others get no step-level advantage)"),
        ("step_adv_abs_mean", "mean |step-level advantage| over the batch's turns"),
    ),
    "PPO's critic (algo.preset: ppo; columns only in such runs)": (
        ("value_loss", "the critic's clipped value loss (0.5 x squared error against GAE's returns, token mean), "
                       "mean over its optimizer steps"),
        ("value_clipfrac", "share of response tokens where the clipped value term (critic.value_clip) was the larger"),
        ("value_explained_var", "1 - Var(returns - values) / Var(returns) of the critic's values before the update: "
                                "1 predicts every return, 0 no better than their mean; None when every answer of the "
                                "iteration scored alike (no spread to explain)"),
        ("values_mean", "the critic's mean value over the trained tokens, before the update"),
        ("returns_mean", "GAE's mean return over the trained tokens (the critic's target)"),
        ("vpred_mean", "the critic's mean value during its update, mean over its micro-batches"),
        ("critic_grad_norm", "the critic's gradient norm before clipping, mean over its optimizer steps"),
        ("critic_lr", "the critic's learning rate after the update's last step"),
        ("critic_seconds", "seconds of the update (time_train_s) spent on the critic: its values before the policy's "
                           "step and its own step, the slowest learner rank's"),
    ),
    "Weight sync": (
        ("sync_tensors_checked", "after a checked sync (weights.check_every): tensors whose digest matched the "
                                 "learner's on every sampler (a mismatch fails the run); None when not checked"),
        ("sync_logprob_max_diff", "after a checked sync: largest |sampler - learner| logprob over the checked "
                                  "sequences' tokens (engine numerics: bfloat16's tails reach 0.3-0.8)"),
        ("sync_logprob_p99_diff", "the same gap's 99th percentile"),
        ("sync_logprob_mean_diff", "the same gap's mean"),
        ("sync_logprob_k3", "k3 estimate of KL(sampler || learner) per checked token"),
        ("sync_logprob_max_diff_sampler<k>", "the largest gap on sampler k's sequences"),
    ),
    "Evaluation (at iterations with an evaluation, else None)": (
        ("eval_accuracy", "the first eval set's accuracy"),
        ("eval/<set>/accuracy", "greedy accuracy on eval set <set> (without greedy: the sampled responses' mean)"),
        ("eval/<set>/pass@<k>", "unbiased pass@k over eval.datasets.<set>.samples responses per prompt"),
        ("eval/<set>/prompts", "prompts evaluated"),
        ("eval/<set>/unscored", "responses that could not be scored (counted as wrong)"),
    ),
    "Time (wall seconds as the flow measured them)": (
        ("time_rollout_s", "rollout, all rounds"),
        ("time_score_s", "scoring"),
        ("time_train_s", "the update (the policy's, and the critic's in PPO)"),
        ("time_sync_s", "the weight sync"),
        ("time_sync_check_s", "the post-sync check: digests, then the logprob gap (None when not checked)"),
        ("time_eval_s", "the evaluation (iterations with one)"),
        ("time_total_s", "the whole iteration"),
        ("time_overhead_s", "the iteration minus its stages: orchestration"),
        ("time_checkpoint_s", "taking a checkpoint (iterations with one): the learner's copy to memory; the write "
                              "runs in the background"),
        ("checkpoint_snapshot_s", "the learner's part of that copy"),
        ("<stage>_started_at", "when stage rollout, score, train or sync started, seconds since the flow run "
                               "started (timeline.png draws them)"),
        ("<stage>_ended_at", "when it ended"),
    ),
}

COLUMNS: dict[str, str] = {name: meaning for group in GROUPS.values() for name, meaning in group}


def _pattern(name: str) -> re.Pattern[str]:
    """``reward_<name>_mean`` -> a regex where each ``<...>`` matches one or more characters other than '/'."""
    parts = re.split(r"<[^>]+>", name)
    return re.compile("[^/]+".join(re.escape(p) for p in parts) + r"\Z")


_PATTERNS = [_pattern(name) for name in COLUMNS]


def undocumented(columns: Iterable[str]) -> list[str]:
    """The columns no entry of ``COLUMNS`` describes, in the order given."""
    return [c for c in columns if not any(p.match(c) for p in _PATTERNS)]
