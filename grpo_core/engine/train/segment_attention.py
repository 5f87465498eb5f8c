"""Attention over packed rows by blocks: the cost of the attention the sequences need, not of the row.

A packed row lays several sequences end to end (a group's prompt once, then each of its responses, then the next
group's). With one dense mask over the row, attention costs ``row length ** 2`` however little of it the mask allows:
packing many responses into a row, or long responses on one prompt, costs more than the padded batch. Here each
block is one SDPA call over the keys its queries may see: a whole group (its prompt and responses, with a mask that
lets each response see the prompt and itself), or one sequence (a prompt causally to itself; a response to its
prompt and causally to itself), whichever ``group_blocks`` prices lower. Every query sees exactly the keys it sees in
the padded batch, so logprobs and gradients agree with it to float rounding.

What varlen flash-attention does on GPUs (verl's ``use_remove_padding``, prime-rl's packer), with a shared prefix that
varlen cannot express, written as a transformers attention function (``AttentionInterface``): the model's own layers,
RoPE and projections run unchanged. Without ``segments`` in the forward's kwargs it is transformers' SDPA attention
itself, so a model loaded with it computes the padded batch exactly as before.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

ATTENTION = "grpo_segments"


# What one SDPA call's forward + backward costs beyond its arithmetic, in (query, key) pairs x attention width (heads x
# head dim), by device type (`benchmarks/segment_attention.py` prints it). On this project's 2-core CPU (2026-11-26) a
# call took 340-360 us however small and a pair x width unit 0.15-0.22 ns: 1.6e6-2.3e6. On an H200 (bf16 and float32,
# 9-14 heads) a call took 430-530 us and a unit 0.06-1.3 ps: 3e8-7e9, so there a group is one call unless its answers
# are long. It decides when a group's answers are worth a call each: a few short answers on a tiny model cost more in
# calls than their dense group attention does.
CALL_COSTS = {"cpu": 2e6, "cuda": 1e9}


def call_cost(device: torch.device | str) -> float:
    """``CALL_COSTS`` of this device's type (the CPU's for a type not measured)."""
    return CALL_COSTS.get(torch.device(device).type, CALL_COSTS["cpu"])


@dataclass
class Block:
    """One SDPA call: queries ``start:end`` attend to ``prefix`` (a range before them: the prompt of a response;
    ``(0, 0)``: none) and to themselves, as ``mask`` says ([n, prefix + n] bool, True: may attend; None: causally)."""
    start: int
    end: int
    prefix: tuple[int, int] = (0, 0)
    mask: torch.Tensor | None = None


@dataclass
class Segments:
    """The attention of one packed row ``[1, T]``: blocks in row order, covering it."""
    blocks: list[Block]
    _on_device: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)

    def mask(self, k: int, device: torch.device) -> torch.Tensor | None:
        """Block k's mask on ``device``, moved once per forward and shared by the layers."""
        mask = self.blocks[k].mask
        if mask is None or mask.device == device:
            return mask
        if k not in self._on_device:
            self._on_device[k] = mask.to(device)
        return self._on_device[k]


def shared_prompt_mask(p: int, lengths: list[int]) -> torch.Tensor:
    """[p + N, p + N] bool (N = sum of lengths): a prompt of p tokens causal to itself, then responses of these
    lengths, each attending to the prompt and causally to itself, not to each other."""
    width = p + sum(lengths)
    mask = torch.zeros(width, width, dtype=torch.bool)
    mask[:p, :p] = torch.ones(p, p, dtype=torch.bool).tril()
    start = p
    for n in lengths:
        mask[start:start + n, :p] = True
        mask[start:start + n, start:start + n] = torch.ones(n, n, dtype=torch.bool).tril()
        start += n
    return mask


def group_blocks(p0: int, p: int, lengths: list[int], width: int, call_cost: float) -> list[Block]:
    """The blocks of a prompt at ``p0`` (p tokens) followed by responses of these lengths, by what costs less for
    an attention ``width`` (heads x head dim) and a fixed ``call_cost`` per call (``CALL_COSTS``): the group in one
    call over ``p + N`` queries and keys with ``shared_prompt_mask``, or one call per segment (the prompt causally,
    each response over prompt + itself), which computes only the pairs that count but makes ``1 + len(lengths)``
    calls."""
    if len(lengths) == 1:  # a lone sequence: plain causal attention
        return [Block(p0, p0 + p + lengths[0])]
    together = (p + sum(lengths)) ** 2 * width + call_cost
    apart = (p * p / 2 + sum(n * (p + n) for n in lengths)) * width + (1 + len(lengths)) * call_cost
    if together <= apart:
        return [Block(p0, p0 + p + sum(lengths), mask=shared_prompt_mask(p, lengths))]
    blocks, start = [Block(p0, p0 + p)], p0 + p
    for n in lengths:
        blocks.append(Block(start, start + n, (p0, p0 + p), torch.ones(n, p + n, dtype=torch.bool).tril(diagonal=p)))
        start += n
    return blocks


def segment_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      segments: Segments | None = None, **kwargs):
    """query [1, H, T, d], key/value [1, Hkv, T, d] -> ([1, T, H, d], None), as transformers' attention functions.
    Without ``segments``: ``sdpa_attention_forward`` unchanged."""
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    if segments is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    if query.shape[0] != 1:
        raise ValueError(f"segment attention takes one packed row, got a batch of {query.shape[0]}")
    groups = getattr(module, "num_key_value_groups", 1)
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    parts = []
    for k, block in enumerate(segments.blocks):
        q = query[:, :, block.start:block.end]
        keys, values = key[:, :, block.start:block.end], value[:, :, block.start:block.end]
        p0, p1 = block.prefix
        if p1 > p0:
            keys = torch.cat((key[:, :, p0:p1], keys), dim=2)
            values = torch.cat((value[:, :, p0:p1], values), dim=2)
        mask = segments.mask(k, query.device)
        parts.append(sdpa(q, keys, values, attn_mask=mask, dropout_p=dropout, scale=scaling, is_causal=mask is None))
    return torch.cat(parts, dim=2).transpose(1, 2).contiguous(), None


def attention_width(config) -> int:
    """Heads x head dim of a transformers config: what one (query, key) pair costs, in ``CALL_COSTS``' units."""
    heads = config.num_attention_heads
    return heads * (getattr(config, "head_dim", None) or config.hidden_size // heads)


def register() -> str:
    """Make ``ATTENTION`` a name ``from_pretrained(attn_implementation=...)`` accepts (its masks are SDPA's), and
    return it. Registering the same function again is harmless."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, segment_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    return ATTENTION


def require(model: torch.nn.Module) -> None:
    """Refuse a packed row for a model whose attention is not ``segment_attention``: any other attention function
    would ignore the segments and let every token see the whole row before it, silently."""
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation != ATTENTION:
        raise ValueError(f"a packed row needs the model loaded with attn_implementation={ATTENTION!r} "
                         f"(segment_attention.register()), this one has {implementation!r}")
