"""An Atropos environment for the built-in addition task: atroposlib's own ``BaseEnv``, run by atroposlib's CLI in
a process (and virtual environment, `make envs`) of its own. It knows nothing of the trainer beyond Atropos's
protocol: it registers with the API server, samples each group through the policy's OpenAI-compatible server with
``server_type: vllm`` (``ManagedServer`` keeps the sampled tokens, their mask and logprobs), scores the answers
itself and sends the scored groups to the API server.

    .venv-envs/bin/python examples/atropos/arith_env.py serve \\
        --env.tokenizer_name models/tiny --env.rollout_server_url http://127.0.0.1:8000 \\
        --env.group_size 8 --openai.base_url http://127.0.0.1:<endpoint port>/v1   # token: $OPENAI_API_KEY

The data are local (``data/arith/train.jsonl`` by default: no hub); the reward is 1 when the last ``\\boxed{}`` of the
answer holds the right sum, else 0.
"""
from __future__ import annotations

import json
import os
import random
import re
from typing import Any

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup

SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
# A worked example before the question (``--env.worked_example True``), as configs/smollm2-arith.yaml gives SmolLM2
WORKED_EXAMPLE = [{"role": "user", "content": "What is 52 + 7?"},
                  {"role": "assistant", "content": "52 + 7 = 59. The answer is \\boxed{59}."}]
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


class ArithEnvConfig(BaseEnvConfig):
    data_path: str = "data/arith/train.jsonl"
    seed: int = 0
    max_tokens: int = 16
    temperature: float = 1.0
    worked_example: bool = False


def reward(answer: str, expected: str) -> float:
    boxes = _BOXED.findall(answer)
    return 1.0 if boxes and boxes[-1].strip() == expected else 0.0


class ArithEnv(BaseEnv):
    name = "arith"
    env_config_cls = ArithEnvConfig

    @classmethod
    def config_init(cls) -> tuple[ArithEnvConfig, list[APIServerConfig]]:
        env = ArithEnvConfig(tokenizer_name="models/tiny", group_size=8, use_wandb=False,
                             wandb_name="arith", total_steps=-1, max_batches_offpolicy=32, max_num_workers=8,
                             steps_per_eval=10**9, max_token_length=112)
        server = APIServerConfig(model_name="policy", base_url="http://127.0.0.1:8001/v1",
                                 api_key=os.environ.get("OPENAI_API_KEY", "none"), server_type="vllm",
                                 num_max_requests_at_once=8, num_requests_for_eval=8, timeout=120)
        return env, [server]

    async def setup(self) -> None:
        with open(self.config.data_path) as f:
            self.rows = [json.loads(line) for line in f if line.strip()]
        self.rng = random.Random(self.config.seed)
        self.order: list[int] = []

    async def get_next_item(self) -> dict[str, Any]:
        if not self.order:
            self.order = list(range(len(self.rows)))
            self.rng.shuffle(self.order)
        row = self.rows[self.order.pop()]
        user = row["messages"] if isinstance(row["messages"], dict) else row["messages"][-1]
        return {"question": user["content"], "answer": str(row["gt_answer"])}

    async def collect_trajectories(self, item: dict[str, Any]) -> tuple[ScoredDataGroup | None, list]:
        messages = [{"role": "system", "content": SYSTEM_PROMPT},
                    *(WORKED_EXAMPLE if self.config.worked_example else []),
                    {"role": "user", "content": item["question"]}]
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            completion = await managed.chat_completion(messages=messages, n=self.config.group_size,
                                                       max_tokens=self.config.max_tokens,
                                                       temperature=self.config.temperature)
            nodes = managed.get_state()["nodes"]
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], inference_logprobs=[])
        for choice, node in zip(completion.choices, nodes):
            group["tokens"].append(node.tokens)
            group["masks"].append(node.masked_tokens)
            group["inference_logprobs"].append(node.logprobs)
            group["scores"].append(reward(choice.message.content or "", item["answer"]))
        return group, []

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        """The trainer evaluates the policy on held-out problems itself (eval in its config)."""
        return None


if __name__ == "__main__":
    ArithEnv.cli()
