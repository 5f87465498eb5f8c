"""System prompts per reward type, and building the chat a prompt is sampled from.

Why per reward type: the reward only finds an answer written the way it looks for it (a ``\\boxed{}``, an
``<answer>`` tag, a fenced python block), so the default instruction tells the model exactly that.
"""
from __future__ import annotations

DEFAULT_SYSTEM_PROMPTS: dict[str, str] = {
    "boxed": "Please reason step by step, and put your final answer within \\boxed{}.",
    "think_answer_tags": (
        "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
        "The assistant first thinks about the reasoning process in the mind and then provides the user with the "
        "answer. The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> tags, "
        "respectively, i.e., <think> reasoning process here </think> <answer> answer here </answer>."
    ),
    "code": (
        "Solve the programming problem. Think it through, then write one complete Python 3 program in a single "
        "```python code block at the end of your answer. The program must read its input from standard input and "
        "write its answer to standard output; it must not print anything else."
    ),
}


def chat_messages(messages: list[dict], reward_type: str, system_prompt: str | None = None,
                  few_shot: list[dict] | None = None) -> list[dict]:
    """The chat to sample from: ``messages`` with a system turn added in front when appropriate, and the worked
    examples ``few_shot`` (user/assistant turns) between the system turn and the row's own turns.

    ``system_prompt`` None means the default for ``reward_type``; ``""`` means no system prompt. A system turn
    already in the data wins over both. The input list is not modified.
    """
    if system_prompt is None:
        if reward_type not in DEFAULT_SYSTEM_PROMPTS:
            raise ValueError(f"no default system prompt for reward type {reward_type!r}; "
                             f"known: {sorted(DEFAULT_SYSTEM_PROMPTS)} (or pass system_prompt)")
        system_prompt = DEFAULT_SYSTEM_PROMPTS[reward_type]
    turns = [dict(turn) for turn in messages]
    system = [t for t in turns if t.get("role") == "system"]
    rest = [t for t in turns if t.get("role") != "system"]
    if not system and system_prompt:
        system = [{"role": "system", "content": system_prompt}]
    return system + [dict(t) for t in few_shot or ()] + rest
