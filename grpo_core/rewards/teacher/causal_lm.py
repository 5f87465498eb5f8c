"""A causal LM as the teacher: a transformers forward over (context, response), the logprob of every response token
read off the output layer at the positions that predict one, as verl's and TRL's on-policy distillation do with
their reference workers (a group's samples share one forward of their prompt: its KV cache, repeated).

The teacher must share the student's vocabulary: the advantage compares the two models' logprobs of the same token
ids, so a teacher whose tokenizer maps any token differently is refused when it loads (``check_same_vocabulary``),
naming both folders and the first token that differs.
"""
from __future__ import annotations

import torch

from grpo_core.data.prompts import chat_messages
from grpo_core.rewards.teacher.base import Teacher, TeacherInput, TeacherScores


class TeacherError(ValueError):
    """The teacher cannot grade this student; the message says which folders and why."""


def check_same_vocabulary(teacher_tokenizer, student_tokenizer, teacher_path: str, student_path: str) -> None:
    """Refuse a teacher whose tokenizer does not give every token the student's id."""
    t, s = teacher_tokenizer.get_vocab(), student_tokenizer.get_vocab()
    if t == s:
        return
    if len(t) != len(s):
        detail = f"{len(t)} tokens against the policy's {len(s)}"
    else:
        token = min((tok for tok in s if t.get(tok) != s[tok]), key=lambda tok: s[tok])
        detail = f"token {token!r} is id {t.get(token)} there and {s[token]} in the policy's"
    raise TeacherError(
        f"distill.teacher {teacher_path}: its tokenizer differs from the policy's ({student_path}): {detail}. "
        "On-policy distillation compares the two models' logprobs of the same token ids: use a teacher of the "
        "policy's model family (the same tokenizer)")


def check_teacher_tokenizer(teacher_path: str, student_path: str):
    """The teacher's tokenizer, after ``check_same_vocabulary`` against the student's."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(teacher_path)
    check_same_vocabulary(tokenizer, AutoTokenizer.from_pretrained(student_path), teacher_path, student_path)
    return tokenizer


class CausalLMTeacher(Teacher):
    """``path`` an HF causal-LM folder. ``context`` None: the teacher reads the student's prompt tokens; else
    ``(reward_type, system_prompt, few_shot)``: it renders its own prompt from each row's messages with its chat
    template (its own system prompt and worked examples). Logprobs at ``temperature`` (the sampling temperature, as
    the student's recorded ones), in float32, ``batch_size`` rows of a prompt per forward; with ``top_k`` > 0 also
    its ``top_k`` most likely tokens at every position and their logprobs."""

    def __init__(self, path: str, *, student_path: str | None, temperature: float = 1.0, batch_size: int = 16,
                 context: tuple[str, str | None, list[dict]] | None = None, threads: int | None = None,
                 top_k: int = 0):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if threads is not None:
            torch.set_num_threads(threads)
        # student_path None: the vocabulary was checked already (TeacherActors does it once, before the actors)
        self.tokenizer = AutoTokenizer.from_pretrained(path) if student_path is None \
            else check_teacher_tokenizer(path, student_path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.temperature, self.batch_size, self.context, self.top_k = temperature, batch_size, context, top_k
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None \
            else self.tokenizer.eos_token_id
        self._prompts: dict[tuple, list[int]] = {}

    def prompt_ids(self, row: TeacherInput) -> list[int]:
        """The teacher's context for ``row``: the student's prompt tokens, or its own rendering of the messages."""
        if self.context is None:
            return list(row.prompt_token_ids)
        if row.messages not in self._prompts:  # a group's samples share their prompt
            reward_type, system_prompt, few_shot = self.context
            chat = chat_messages([{"role": r, "content": c} for r, c in row.messages], reward_type, system_prompt,
                                 few_shot)
            text = self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
            self._prompts[row.messages] = self.tokenizer.encode(text, add_special_tokens=False)
        return self._prompts[row.messages]

    def score(self, rows: list[TeacherInput]) -> list[TeacherScores]:
        """Rows that share the teacher's prompt (a group's samples, consecutive) are scored together: the prompt once,
        its KV cache repeated for ``batch_size`` responses at a time, so a group of G costs one prompt and G
        responses (not G prompts), and the output layer runs only where a response token is predicted."""
        out: list[TeacherScores] = []
        start = 0
        while start < len(rows):
            prompt = self.prompt_ids(rows[start])
            end = start + 1
            while end < len(rows) and end - start < self.batch_size and self.prompt_ids(rows[end]) == prompt:
                end += 1
            out += self._forward(prompt, rows[start:end])
            start = end
        return out

    @torch.no_grad()
    def _forward(self, prompt: list[int], rows: list[TeacherInput]) -> list[TeacherScores]:
        lengths = [len(r.response_token_ids) for r in rows]
        width, n = max(lengths), len(rows)
        if width == 0:
            return [TeacherScores((), ()) for _ in rows]
        decoder, head = self.model.get_decoder(), self.model.get_output_embeddings()
        first = decoder(input_ids=torch.tensor([prompt]), use_cache=True)
        cache = first.past_key_values
        cache.batch_repeat_interleave(n)
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((n, len(prompt) + width), dtype=torch.long)
        mask[:, :len(prompt)] = 1
        for i, r in enumerate(rows):
            ids[i, :lengths[i]] = torch.tensor(r.response_token_ids)
            mask[i, len(prompt): len(prompt) + lengths[i]] = 1
        # response token t is predicted by the state before it: the prompt's last (t = 0) or response token t - 1
        hidden = decoder(input_ids=ids[:, :width - 1], attention_mask=mask[:, :len(prompt) + width - 1],
                         past_key_values=cache, use_cache=False).last_hidden_state if width > 1 else None
        last = first.last_hidden_state[0, -1]
        out = []
        for i, (r, n_i) in enumerate(zip(rows, lengths)):
            if n_i == 0:
                out.append(TeacherScores((), ()))
                continue
            states = torch.cat([last[None], hidden[i, :n_i - 1]]) if n_i > 1 else last[None]
            logits = head(states).float() / self.temperature
            log_p = torch.log_softmax(logits, dim=-1)
            taken = log_p.gather(-1, ids[i, :n_i, None]).squeeze(-1)
            top = log_p.topk(self.top_k, dim=-1) if self.top_k else None
            out.append(TeacherScores(tuple(taken.tolist()), tuple(logits.argmax(-1).tolist()),
                                     () if top is None else tuple(map(tuple, top.indices.tolist())),
                                     () if top is None else tuple(map(tuple, top.values.tolist()))))
        return out
