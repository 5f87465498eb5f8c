"""How often would rendering an agent's text again give other tokens than the policy sampled?

An OpenAI-API agent sends its conversation back as text. The policy endpoint continues an episode from the tokens
it recorded (``grpo_core.outside.endpoint.recorder``) and counts the later turns where the chat template applied to the
text would have given another token sequence (``retokenized_differs``): the turns a trainer that re-tokenises
would train on tokens the sampler never drew. This drives two-turn conversations on the built-in arithmetic
questions through the endpoint's logic (no HTTP) with a real engine and prints the count.

    python benchmarks/endpoint_tokens.py --model .cache/models/smollm2 --conversations 64
"""
from __future__ import annotations

import argparse
import json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--conversations", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-model-len", type=int, default=1024)
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from grpo_core.outside.endpoint.policy import EnginePolicy
    from grpo_core.outside.endpoint.recorder import EpisodeRecorder
    from grpo_core.outside.endpoint.server import EndpointSettings, PolicyEndpoint
    from grpo_core.engine.rollout.sampler import SamplerSpec, VLLMSampler

    engine = VLLMSampler(SamplerSpec(model_path=args.model, kv_cache_mb=256, max_model_len=args.max_model_len))
    endpoint = PolicyEndpoint(EnginePolicy(engine, args.max_model_len), EpisodeRecorder(AutoTokenizer.from_pretrained(args.model)),
                              EndpointSettings(model_name="policy", max_tokens=args.max_tokens,
                                               temperature=args.temperature))
    with open("data/arith/eval.jsonl") as fh:
        questions = [json.loads(line)["messages"]["content"] for line in fh][:args.conversations]
    for i, question in enumerate(questions):
        messages = [{"role": "user", "content": question}]
        first = endpoint.chat_completions({"messages": messages, "seed": i, "episode_id": f"c{i}"}, {})
        messages += [first["choices"][0]["message"], {"role": "user", "content": "Are you sure? Answer again."}]
        endpoint.chat_completions({"messages": messages, "seed": 10_000 + i, "episode_id": f"c{i}"}, {})
        endpoint.finish(f"c{i}", {"reward": None})
    stats = endpoint.recorder.stats
    print(f"model {args.model}: {stats.later_turns} later turns, {stats.retokenized_differs} "
          f"({stats.retokenized_differs / max(1, stats.later_turns):.1%}) whose text rendered again by the chat "
          f"template gives other tokens than the recorded conversation (T={args.temperature}, "
          f"max_tokens={args.max_tokens})")


if __name__ == "__main__":
    main()
