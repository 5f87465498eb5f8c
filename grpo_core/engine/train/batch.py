"""Packing scored rollouts into padded tensors for the learner.

Every per-token tensor lives in "shifted" space: column j holds the prediction of token j+1 from the logits at
position j, so logprobs, old logprobs, sampler logprobs and the response mask line up without re-indexing.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch

from grpo_core.engine.train.segment_attention import Segments, group_blocks


@dataclass
class TokenBatch:
    input_ids: torch.Tensor        # [B, L] prompt + response, right-padded with pad_id
    attention_mask: torch.Tensor   # [B, L]
    response_mask: torch.Tensor    # [B, L-1] 1.0 where column j predicts a response token the policy sampled
    sampler_logprobs: torch.Tensor  # [B, L-1] the sampler's logprob of that token (0 elsewhere)
    advantages: torch.Tensor       # [B], or [B, L-1] per token (on-policy distillation: 0 off the response)
    row_mask: torch.Tensor         # [B] 1.0 for rows that count in the loss (kept, not filtered)
    has_sampler_logprobs: bool = True  # False: packed without them (sampler_logprobs is all zeros)
    # On-policy distillation with distill.top_k = K: the teacher's K most likely tokens where column j predicts a
    # response token, and their logprobs ([B, L-1, K]; 0 elsewhere)
    teacher_top_ids: torch.Tensor | None = None
    teacher_top_logprobs: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, idx: slice | torch.Tensor) -> "TokenBatch":
        return TokenBatch(*(t[idx] for t in (self.input_ids, self.attention_mask, self.response_mask,
                                              self.sampler_logprobs, self.advantages, self.row_mask)),
                          has_sampler_logprobs=self.has_sampler_logprobs,
                          **{k: None if t is None else t[idx] for k, t in self._teacher_top().items()})

    def _teacher_top(self) -> dict[str, torch.Tensor | None]:
        return {"teacher_top_ids": self.teacher_top_ids, "teacher_top_logprobs": self.teacher_top_logprobs}

    @property
    def loss_mask(self) -> torch.Tensor:
        """[B, L-1]: response tokens of rows that count."""
        return self.response_mask * self.row_mask[:, None]

    @property
    def lengths(self) -> torch.Tensor:
        """[B] prompt + response tokens of each row (right-padded: its first ``length`` columns)."""
        return self.attention_mask.sum(1)

    def prompt_runs(self) -> list[tuple[int, list[int]]]:
        """(prompt length, rows) of each run of consecutive rows with the same prompt (what precedes a row's first
        response column), rows without response tokens left out (they have no logprob to compute)."""
        resp = self.response_mask
        has_resp = (resp.sum(1) > 0).tolist()
        first = resp.argmax(1).tolist()
        runs: list[tuple[int, list[int]]] = []
        previous: list[int] | None = None
        for i in range(len(self)):
            if not has_resp[i]:
                continue
            prompt = self.input_ids[i, :first[i] + 1].tolist()
            if runs and prompt == previous:
                runs[-1][1].append(i)
            else:
                runs.append((len(prompt), [i]))
            previous = prompt
        return runs

    def packed_tokens(self) -> int:
        """The tokens of ``pack_row``'s row for this batch: each run's prompt once and its rows' responses."""
        lengths = self.lengths.tolist()
        return sum(p + sum(lengths[i] - p for i in rows) for p, rows in self.prompt_runs())

    def trimmed(self) -> "TokenBatch":
        """The same rows without the padding columns none of them uses: a micro-batch of short rows taken from a
        batch with long ones computes ``rows x its own longest row`` tokens, not the batch's."""
        width = max(int(self.lengths.max()), 2) if len(self) else self.input_ids.shape[1]
        if width >= self.input_ids.shape[1]:
            return self
        return TokenBatch(self.input_ids[:, :width], self.attention_mask[:, :width],
                          self.response_mask[:, :width - 1], self.sampler_logprobs[:, :width - 1],
                          self.advantages if self.advantages.dim() == 1 else self.advantages[:, :width - 1],
                          self.row_mask, has_sampler_logprobs=self.has_sampler_logprobs,
                          **{k: None if t is None else t[:, :width - 1] for k, t in self._teacher_top().items()})


def plan_micro_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Rows into micro-batches of at most ``max_tokens`` padded tokens each (rows x the longest row of the
    micro-batch), by length (verl's ``use_dynamic_bsz``, NeMo-RL's dynamic batching): longest rows first, each
    micro-batch filled while the next row fits. A row longer than the budget is a micro-batch of its own (the config
    refuses a budget below the longest possible row). Each micro-batch lists its rows in their original order.

    Rows of similar length land together, so a micro-batch pads little; the optimizer step does not depend on how
    rows are grouped (loss denominators are the mini-batch's), only float summation order does."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # stable: equal lengths keep their order
    plan: list[list[int]] = []
    for i in order:
        if plan and (len(plan[-1]) + 1) * lengths[plan[-1][0]] <= max_tokens:
            plan[-1].append(i)
        else:
            plan.append([i])
    return [sorted(rows) for rows in plan]


def plan_packed_micro_batches(runs: list[tuple[int, list[int]]], lengths: list[int],
                              max_tokens: int) -> list[list[int]]:
    """Rows into micro-batches of at most ``max_tokens`` tokens each as ``pack_row`` lays them out (no padding, a
    run's prompt once): ``runs`` are ``TokenBatch.prompt_runs`` (prompt length, rows), ``lengths`` every row's
    prompt + response. A run that does not fit the budget is cut into pieces that do, each with the prompt again;
    then pieces go largest first into the first micro-batch with room (first-fit decreasing). A row longer than the
    budget is a micro-batch of its own. Rows in no run (no response tokens) go with the first micro-batch: nothing is
    computed for them, but they stay in the batch. Each micro-batch lists its rows in their original order."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    pieces: list[tuple[int, list[int]]] = []  # (packed tokens, rows)
    for p, rows in runs:
        tokens, piece = p, []
        for i in rows:
            if piece and tokens + lengths[i] - p > max_tokens:
                pieces.append((tokens, piece))
                tokens, piece = p, []
            tokens += lengths[i] - p
            piece.append(i)
        pieces.append((tokens, piece))
    pieces.sort(key=lambda t: -t[0])  # stable
    plan: list[tuple[int, list[int]]] = []
    for tokens, rows in pieces:
        k = next((k for k, (used, _) in enumerate(plan) if used + tokens <= max_tokens), None)
        if k is None:
            plan.append((tokens, list(rows)))
        else:
            plan[k] = (plan[k][0] + tokens, plan[k][1] + rows)
    placed = {i for _, rows in plan for i in rows}
    idle = [i for i in range(len(lengths)) if i not in placed]
    if not plan:
        return [idle] if idle else []
    plan[0][1].extend(idle)
    return [sorted(rows) for _, rows in plan]


def equal_counts(plans: list[list[list[int]]]) -> list[list[list[int]]]:
    """Every rank's plan with as many micro-batches as the longest plan: under ZeRO-2/3 each backward reduces
    gradients across ranks, a collective every rank must join, so ranks run the same number of micro-batches. A
    plan with fewer splits its largest micro-batch in two (the first half the larger) until it has enough."""
    target = max((len(p) for p in plans), default=0)
    out = []
    for plan in plans:
        plan = [list(rows) for rows in plan]
        while len(plan) < target:
            k = max(range(len(plan)), key=lambda j: (len(plan[j]), -j))
            rows = plan[k]
            if len(rows) < 2:
                raise ValueError(f"cannot split {len(plan)} micro-batches into {target}: too few rows")
            half = (len(rows) + 1) // 2
            plan[k:k + 1] = [rows[:half], rows[half:]]
        out.append(plan)
    return out


def finite_rows(kept: list[bool], *columns: list | None) -> tuple[list[bool], int]:
    """``kept`` with every row cleared that holds a NaN or an infinity in one of ``columns`` (each a list with one
    entry per row: a number, a list of numbers, or a list of lists; None, whole or for a row: absent), and how many
    kept rows that cleared. A non-finite input would make the whole step's loss NaN and the weights with it: it
    stops that row, not the run."""
    bad = np.zeros(len(kept), dtype=bool)
    for column in columns:
        if column is not None:
            bad |= _rows_not_finite(column)
    cleared = int((bad & np.asarray(kept, dtype=bool)).sum())
    return [k and not b for k, b in zip(kept, bad.tolist())], cleared


def _rows_not_finite(column: list) -> np.ndarray:
    """[B] bool: the rows of ``column`` holding a NaN or an infinity, however deep their lists (one pass in numpy)."""
    values = [() if v is None else v for v in column]  # an absent value: an empty list, nothing to check
    if any(isinstance(v, (list, tuple)) for v in values):  # one level of nesting at a time, rows kept apart
        as_lists = [v if isinstance(v, (list, tuple)) else (v,) for v in values]
        lengths = np.fromiter((len(v) for v in as_lists), dtype=np.int64, count=len(as_lists))
        inner = _rows_not_finite(list(chain.from_iterable(as_lists)))
        bad_before = np.concatenate([[0], np.cumsum(inner)])
        ends = np.cumsum(lengths)
        return (bad_before[ends] - bad_before[ends - lengths]) > 0
    return ~np.isfinite(np.fromiter(values, dtype=np.float64, count=len(values)))


def pack_batch(prompts: list[list[int]], responses: list[list[int]], sampler_logprobs: list[list[float]] | None,
               advantages: list[float], row_mask: list[bool], pad_id: int,
               response_masks: list[list[int]] | None = None,
               token_advantages: list[list[float]] | None = None,
               teacher_top: tuple[list[list[list[int]]], list[list[list[float]]]] | None = None) -> TokenBatch:
    """Right-pad ``prompt + response`` per row. Rows keep their order.

    ``token_advantages`` (on-policy distillation): one advantage per response token, used instead of ``advantages``
    (the batch's advantages are then [B, L-1], in shifted space like the logprobs). ``teacher_top`` (with
    ``distill.top_k`` = K): (ids, logprobs), per row and response token the teacher's K most likely tokens and
    their logprobs, laid out [B, L-1, K] the same way.

    ``response_masks`` (multi-turn episodes): per response token, 1 where the policy sampled it and 0 where an
    environment wrote it; those tokens stay in the sequence but out of ``response_mask`` (no loss, no gradient, no
    length or entropy). None: every response token is the policy's.

    Filled by scatter from flat arrays, not row by row: four small tensor writes per row cost 4.6 ms of the tiny
    task's 256 rows, on the train step's path."""
    n = len(prompts)
    if not (len(responses) == len(advantages) == len(row_mask) == n):
        raise ValueError("pack_batch: prompts, responses, advantages and row_mask must have the same length")
    p_len = np.fromiter(map(len, prompts), dtype=np.int64, count=n)
    r_len = np.fromiter(map(len, responses), dtype=np.int64, count=n)
    for values, what in ((sampler_logprobs, "sampler logprobs"), (response_masks, "response mask values"),
                         (token_advantages, "token advantages"), *(() if teacher_top is None else (
                             (teacher_top[0], "teacher top-k id lists"),
                             (teacher_top[1], "teacher top-k logprob lists")))):
        if values is not None:
            _check_one_per_response_token(values, r_len, what)
    seq_len = p_len + r_len
    length = int(seq_len.max())
    # (row, column) of every token of prompt + response, and of every response token in shifted space
    rows, cols = _row_and_offset(seq_len)
    tokens = np.fromiter(chain.from_iterable(chain(p, r) for p, r in zip(prompts, responses)), dtype=np.int64,
                         count=len(rows))
    r_rows, r_cols = _row_and_offset(r_len)
    r_cols += np.repeat(p_len - 1, r_len)
    input_ids = torch.full((n, length), pad_id, dtype=torch.long)
    attention = torch.zeros((n, length), dtype=torch.long)
    resp_mask = torch.zeros((n, length - 1), dtype=torch.float32)
    samp = torch.zeros((n, length - 1), dtype=torch.float32)
    at, r_at = (torch.from_numpy(rows), torch.from_numpy(cols)), (torch.from_numpy(r_rows), torch.from_numpy(r_cols))
    input_ids[at] = torch.from_numpy(tokens)
    attention[at] = 1
    if response_masks is None:
        resp_mask[r_at] = 1.0
    else:
        resp_mask[r_at] = torch.from_numpy(np.fromiter(chain.from_iterable(response_masks), dtype=np.float32,
                                                       count=len(r_rows)))
    if sampler_logprobs is not None:
        samp[r_at] = torch.from_numpy(np.fromiter(chain.from_iterable(sampler_logprobs), dtype=np.float32,
                                                  count=len(r_rows)))
    if token_advantages is None:
        adv = torch.tensor(advantages, dtype=torch.float32)
    else:
        adv = torch.zeros((n, length - 1), dtype=torch.float32)
        adv[r_at] = torch.from_numpy(np.fromiter(chain.from_iterable(token_advantages), dtype=np.float32,
                                                 count=len(r_rows)))
    top_ids = top_logprobs = None
    if teacher_top is not None:
        top_ids, top_logprobs = (_per_token_lists(values, r_at, (n, length - 1), len(r_rows), dtype, what)
                                 for values, dtype, what in ((teacher_top[0], torch.long, "teacher top-k ids"),
                                                             (teacher_top[1], torch.float32,
                                                              "teacher top-k logprobs")))
    return TokenBatch(input_ids, attention, resp_mask, samp, adv,
                      torch.tensor([1.0 if k else 0.0 for k in row_mask], dtype=torch.float32),
                      has_sampler_logprobs=sampler_logprobs is not None, teacher_top_ids=top_ids,
                      teacher_top_logprobs=top_logprobs)


def _per_token_lists(values: list[list[list]], at: tuple[torch.Tensor, torch.Tensor], shape: tuple[int, int],
                     tokens: int, dtype: torch.dtype, what: str) -> torch.Tensor:
    """[B, L-1, K] from K values per response token of each row (``at``: where each response token's column is)."""
    flat = [v for row in values for v in row]
    widths = {len(v) for v in flat}
    if len(widths) > 1:
        raise ValueError(f"pack_batch: {what} of different lengths {sorted(widths)}: K values per token expected")
    k = widths.pop() if widths else 0
    out = torch.zeros((*shape, k), dtype=dtype)
    if flat:
        out[at] = torch.tensor(flat, dtype=dtype).reshape(tokens, k)
    return out


def _check_one_per_response_token(values: list[list], r_len: np.ndarray, what: str) -> None:
    """Per-token values (sampler logprobs, a response mask, token advantages): one list per row, as long as its
    response; else an error naming the first row that is not."""
    if len(values) != len(r_len):
        raise ValueError(f"pack_batch: {len(values)} rows of {what} for {len(r_len)} rows")
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=len(r_len))
    bad = np.flatnonzero(lengths != r_len)
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"row {i}: {lengths[i]} {what} for {r_len[i]} response tokens")


def _row_and_offset(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For rows of these lengths laid end to end: each element's row and its offset within the row."""
    starts = np.cumsum(lengths) - lengths
    return np.repeat(np.arange(len(lengths)), lengths), np.arange(int(lengths.sum())) - np.repeat(starts, lengths)


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """logits [B, L, V], input_ids [B, L] -> [B, L-1] log p(input_ids[:, j+1] | prefix), in float32.

    Computed as gathered logit minus logsumexp so no [B, L, V] log-softmax tensor is kept for backward."""
    logits = logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    targets = input_ids[:, 1:].unsqueeze(-1)
    return logits.gather(-1, targets).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def token_logprobs_and_entropy(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0,
                               with_entropy: bool = True, chunk_rows: int = 1024):
    """logits [B, L, V], input_ids [B, L] -> (logprobs [B, L-1] float32, entropy [B, L-1] float32 or None).

    The values of ``token_logprobs(logits, input_ids, T)`` and of ``entropy_from_logits(logits[:, :-1].float() / T)``
    (the entropy carries no gradient: it is the metric), without a float32 copy of the [B, L, V] logits: forward
    reads the logits once and keeps one logsumexp per position; backward writes d logits = (onehot - softmax) x g / T
    straight in the logits' dtype. On CUDA (with Triton) two kernels do it, one read of the logits forward and one
    read + one write backward; elsewhere the same function runs in chunks of ``chunk_rows`` positions with torch ops.
    """
    backend = "triton" if logits.is_cuda and _triton_available() else "torch"
    logp, entropy = _FusedTokenLogprobs.apply(logits.contiguous(), input_ids[:, 1:].contiguous(), float(temperature),
                                             bool(with_entropy), backend, int(chunk_rows))
    return logp, (entropy if with_entropy else None)


class _FusedTokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, temperature, with_entropy, backend, chunk_rows):
        B, L, V = logits.shape
        f32, dev = torch.float32, logits.device
        logp = torch.empty(B, L - 1, dtype=f32, device=dev)
        lse = torch.empty(B, L - 1, dtype=f32, device=dev)
        ent = torch.empty(B, L - 1 if with_entropy else 0, dtype=f32, device=dev)
        if backend == "triton":
            _triton_forward(logits, targets, logp, lse, ent, temperature, with_entropy)
        else:
            for b in range(B):
                for j0 in range(0, L - 1, chunk_rows):
                    j1 = min(L - 1, j0 + chunk_rows)
                    z = logits[b, j0:j1].to(f32, copy=True)  # a copy: worked on in place below
                    if temperature != 1.0:
                        z.div_(temperature)
                    t = targets[b, j0:j1, None]
                    lp = torch.log_softmax(z, dim=-1)
                    lp_t = lp.gather(-1, t).squeeze(-1)
                    logp[b, j0:j1] = lp_t
                    lse[b, j0:j1] = z.gather(-1, t).squeeze(-1) - lp_t
                    if with_entropy:
                        ent[b, j0:j1] = -(lp.exp_() * z.sub_(lse[b, j0:j1, None])).sum(-1)
                    del z, lp
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature, ctx.backend, ctx.chunk_rows = temperature, backend, chunk_rows
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, _g_entropy):
        logits, targets, lse = ctx.saved_tensors
        T = ctx.temperature
        B, L, V = logits.shape
        grad = torch.empty_like(logits)
        grad[:, -1].zero_()  # the last position predicts nothing
        g_logp = g_logp.contiguous().float()
        if ctx.backend == "triton":
            _triton_backward(logits, targets, lse, g_logp, grad, T)
        else:
            for b in range(B):
                for j0 in range(0, L - 1, ctx.chunk_rows):
                    j1 = min(L - 1, j0 + ctx.chunk_rows)
                    z = logits[b, j0:j1].to(torch.float32, copy=True)
                    if T != 1.0:
                        z.div_(T)
                    p = z.sub_(lse[b, j0:j1, None]).exp_()  # softmax
                    g = g_logp[b, j0:j1, None]
                    p.mul_(-g).scatter_add_(-1, targets[b, j0:j1, None], g)
                    if T != 1.0:
                        p.div_(T)
                    grad[b, j0:j1] = p
                    del z, p
        return grad, None, None, None, None, None


@functools.lru_cache(maxsize=None)
def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
        return True
    except ImportError:
        return False


@functools.lru_cache(maxsize=None)
def _triton_kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def _lp_fwd_kernel(logits_ptr, targets_ptr, logp_ptr, lse_ptr, ent_ptr, L1, stride_b, stride_l, V, inv_t,
                       WITH_ENT: tl.constexpr, BLOCK: tl.constexpr):
        pid = tl.program_id(0)  # one position (b, j), j < L-1
        b = pid // L1
        j = pid - b * L1
        row = logits_ptr + b.to(tl.int64) * stride_b + j.to(tl.int64) * stride_l
        m = tl.full([], float("-inf"), tl.float32)  # running max
        s = tl.full([], 0.0, tl.float32)             # running sum of exp(z - m)
        t = tl.full([], 0.0, tl.float32)             # running sum of exp(z - m) * z, for the entropy
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            z = tl.load(row + offs, mask=offs < V, other=float("-inf")).to(tl.float32) * inv_t
            m_new = tl.maximum(m, tl.max(z, axis=0))
            scale = tl.exp(m - m_new)
            e = tl.exp(z - m_new)
            s = s * scale + tl.sum(e, axis=0)
            if WITH_ENT:
                t = t * scale + tl.sum(tl.where(e > 0, e * z, 0.0), axis=0)
            m = m_new
        lse = m + tl.log(s)
        z_t = tl.load(row + tl.load(targets_ptr + pid)).to(tl.float32) * inv_t
        tl.store(logp_ptr + pid, z_t - lse)
        tl.store(lse_ptr + pid, lse)
        if WITH_ENT:
            tl.store(ent_ptr + pid, lse - t / s)

    @triton.jit
    def _lp_bwd_kernel(logits_ptr, grad_ptr, targets_ptr, lse_ptr, g_ptr, L1, stride_b, stride_l, V, inv_t,
                       BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        b = pid // L1
        j = pid - b * L1
        offset = b.to(tl.int64) * stride_b + j.to(tl.int64) * stride_l
        lse = tl.load(lse_ptr + pid)
        g = tl.load(g_ptr + pid)
        tgt = tl.load(targets_ptr + pid)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < V
            z = tl.load(logits_ptr + offset + offs, mask=mask, other=0.0).to(tl.float32) * inv_t
            p = tl.exp(z - lse)
            d = tl.where(offs == tgt, g - g * p, -g * p) * inv_t
            tl.store(grad_ptr + offset + offs, d.to(grad_ptr.dtype.element_ty), mask=mask)

    return _lp_fwd_kernel, _lp_bwd_kernel


def _triton_block(V: int) -> int:
    return min(4096, 1 << max(0, (V - 1).bit_length()))


def _triton_forward(logits, targets, logp, lse, ent, temperature, with_entropy) -> None:
    fwd, _ = _triton_kernels()
    B, L, V = logits.shape
    if B * (L - 1):
        fwd[(B * (L - 1),)](logits, targets, logp, lse, ent if with_entropy else lse, L - 1, logits.stride(0),
                            logits.stride(1), V, 1.0 / temperature, WITH_ENT=with_entropy, BLOCK=_triton_block(V),
                            num_warps=8)


def _triton_backward(logits, targets, lse, g_logp, grad, temperature) -> None:
    _, bwd = _triton_kernels()
    B, L, V = logits.shape
    if B * (L - 1):
        bwd[(B * (L - 1),)](logits, grad, targets, lse, g_logp, L - 1, logits.stride(0), logits.stride(1), V,
                            1.0 / temperature, BLOCK=_triton_block(V), num_warps=8)


@dataclass
class PackedRow:
    """A micro-batch as one row without padding: each run of consecutive rows that share a prompt becomes
    ``prompt + response_1 + ... + response_k`` (the prompt written once), the runs end to end, positions restarting
    at each prompt and continuing after it in each response. ``segments`` says what attends to what (a response to
    its prompt and causally to itself; ``segment_attention``), so the forward pass computes each prompt once and no
    padding at all, and the logits are taken only where a response token is predicted. The same logprobs and
    gradients as the padded batch (verl's ``use_remove_padding``, NeMo-RL's sequence packing, with a shared prefix).

    ``src_pos``: where in the row the hidden state predicting each response token sits (a response's first token is
    predicted by its prompt's last position); ``dst_row, dst_col``: where that token's logprob goes in the batch's
    shifted ``[B, L-1]`` space; ``targets``: the token ids."""
    input_ids: torch.Tensor      # [1, T]
    position_ids: torch.Tensor   # [1, T]
    segments: Segments
    src_pos: torch.Tensor        # [N]
    dst_row: torch.Tensor        # [N]
    dst_col: torch.Tensor        # [N]
    targets: torch.Tensor        # [N]

    @property
    def tokens(self) -> int:
        return int(self.input_ids.shape[1])


def pack_row(batch: TokenBatch, attention_width: int, call_cost: float) -> PackedRow:
    """``batch``'s rows as one packed row, each run of consecutive rows with the same prompt sharing it
    (``TokenBatch.prompt_runs``; rows without response tokens are left out). ``attention_width`` (the model's heads x
    head dim) and ``call_cost`` (``segment_attention.CALL_COSTS``) price each group's attention (``group_blocks``)."""
    ids, lengths = batch.input_ids, batch.lengths.tolist()
    runs = [(ids[rows[0], :p].tolist(), [(ids[i, p:lengths[i]].tolist(), i) for i in rows])
            for p, rows in batch.prompt_runs()]
    tokens: list[int] = []
    positions: list[int] = []
    blocks = []
    src_pos, dst_row, dst_col, targets = [], [], [], []
    for prompt, responses in runs:
        p, p0 = len(prompt), len(tokens)
        blocks += group_blocks(p0, p, [len(r) for r, _ in responses], attention_width, call_cost)
        tokens += prompt
        positions += range(p)
        for response, i in responses:
            n, start = len(response), len(tokens)
            tokens += response
            positions += range(p, p + n)
            src_pos += [p0 + p - 1, *range(start, start + n - 1)]
            dst_row += [i] * n
            dst_col += range(p - 1, p - 1 + n)
            targets += response
    as_long = lambda v: torch.tensor(v, dtype=torch.long)  # noqa: E731
    return PackedRow(as_long(tokens)[None], as_long(positions)[None], Segments(blocks), as_long(src_pos),
                     as_long(dst_row), as_long(dst_col), as_long(targets))
