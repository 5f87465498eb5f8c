"""Does a model folder load in both engines, and do they compute the same policy?

The learner (transformers) and the samplers (vLLM) each load ``model.path`` on their own. A folder one of them
reads differently (another tokenizer, a missing tied output layer, a wrong rope setting) trains a policy that is not
the one sampled, and nothing fails: the logprob gap only shows as drift. This check runs both on a few chat prompts
and compares what matters: the token ids of the prompts, and the logprobs each engine gives the same continuation.
"""
from __future__ import annotations

from dataclasses import dataclass

# Chat prompts the check samples from: short, in the model's own chat template.
CHECK_PROMPTS = ("What is 23 + 19?", "Write a Python function that reverses a string.",
                 "Name three primary colors.")
# The largest |logprob difference| accepted between transformers and vLLM on the same float32 weights (measured:
# 4e-5 on SmolLM2-135M; a wrong tied output layer gave 27, a wrong tokenizer makes ids differ).
FLOAT32_TOLERANCE = 1e-3


class LoadCheckFailed(RuntimeError):
    """The two engines disagree on the folder; the message says where."""


@dataclass
class LoadCheck:
    folder: str
    sequences: int
    tokens: int
    max_abs_logprob_diff: float
    greedy_tokens_equal: int  # prompts whose greedy continuation is the same token for token in both engines
    tokenizers_agree: bool

    def summary(self) -> str:
        return (f"{self.sequences} sequences, {self.tokens} tokens: max |logprob(transformers) - logprob(vLLM)| "
                f"{self.max_abs_logprob_diff:.2e}, greedy continuations equal {self.greedy_tokens_equal}/"
                f"{self.sequences}, tokenizers agree: {self.tokenizers_agree}")


def check_loads(folder: str, *, gguf_tokenizer=None, max_new_tokens: int = 24,
                tolerance: float = FLOAT32_TOLERANCE) -> LoadCheck:
    """Load ``folder`` in transformers and in vLLM (float32, in this process), greedy-continue ``CHECK_PROMPTS`` with
    transformers, and score the continuations with both. Raises ``LoadCheckFailed`` when the prompt token ids differ
    (between the folder's tokenizer, vLLM's and ``gguf_tokenizer`` if given) or a logprob differs by more than
    ``tolerance``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_core.engine.rollout.sampler import SamplerSpec, VLLMSampler

    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                             add_generation_prompt=True) for q in CHECK_PROMPTS]
    ids = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    agree = gguf_tokenizer is None or all(gguf_tokenizer.encode(p, add_special_tokens=False) == i
                                          for p, i in zip(prompts, ids))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    sequences, hf_logps = [], []
    with torch.no_grad():
        for prompt in ids:
            out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 max_new_tokens=max_new_tokens, do_sample=False)
            seq = out[0].tolist()
            logits = model(torch.tensor([seq])).logits[0, len(prompt) - 1:-1].float()
            hf_logps.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(seq[len(prompt):])[:, None])
                            .squeeze(-1).tolist())
            sequences.append(seq)
    del model
    sampler = VLLMSampler(SamplerSpec(model_path=folder, dtype="float32",
                                      max_model_len=max(map(len, sequences)) + max_new_tokens + 8))
    try:
        vllm_ids = [sampler.llm.get_tokenizer().encode(p, add_special_tokens=False) for p in prompts]
        agree = agree and vllm_ids == ids
        vllm_logps = sampler.score_tokens(sequences, [len(p) for p in ids])
        greedy = sampler.generate_greedy(ids, max_tokens=max_new_tokens)
    finally:
        del sampler
    diff = max(abs(a - b) for hf, vl in zip(hf_logps, vllm_logps) for a, b in zip(hf, vl))
    equal = sum(g.token_ids == s[len(p):] for g, s, p in zip(greedy, sequences, ids))
    result = LoadCheck(folder=folder, sequences=len(sequences), tokens=sum(map(len, hf_logps)),
                       max_abs_logprob_diff=float(diff), greedy_tokens_equal=int(equal), tokenizers_agree=agree)
    if not agree:
        raise LoadCheckFailed(f"{folder}: the prompt token ids differ between the folder's tokenizer, vLLM's"
                              f"{' and the GGUF file' if gguf_tokenizer is not None else ''}: {result.summary()}")
    if diff > tolerance:
        raise LoadCheckFailed(f"{folder}: transformers and vLLM disagree on the same weights by up to {diff:.3g} "
                              f"in logprob (tolerance {tolerance:g}): {result.summary()}")
    return result
