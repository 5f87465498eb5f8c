"""The distillation teacher in Ray actors (``distill``): loaded once per flow run in ``distill.replicas`` actors of
``cluster.reward_resources``, placed as the reward models are, and asked for every score stage's batch."""
from __future__ import annotations

from grpo_core.cluster.model_actors import ModelActors
from grpo_core.config import GRPOConfig
from grpo_core.run.logs import redirect_process_output
from grpo_core.rewards.teacher import Teacher, TeacherInput, TeacherScores
from grpo_core.rewards.teacher.causal_lm import CausalLMTeacher, check_teacher_tokenizer


def teacher_context(cfg: GRPOConfig) -> tuple[str, str | None, list[dict]] | None:
    """What the teacher renders its prompts with: None (the student's prompt tokens), or (reward type, system
    prompt, worked examples), each unset one the student's."""
    d = cfg.distill
    if d is None or not d.own_context:
        return None
    system = d.system_prompt if d.system_prompt is not None else cfg.data.system_prompt
    few_shot = d.few_shot if d.few_shot is not None else cfg.data.few_shot
    return cfg.reward.type, system, [t.model_dump() for t in few_shot]


class TeacherHost:
    """What one teacher actor runs, its output in the run's logs/."""

    def __init__(self, path: str, temperature: float, batch_size: int, context, top_k: int, threads: int,
                 output_file: str | None):
        if output_file is not None:
            redirect_process_output(output_file)
        self.teacher = CausalLMTeacher(path, student_path=None, temperature=temperature,
                                       batch_size=batch_size, context=context, threads=threads, top_k=top_k)

    def score(self, rows: list[TeacherInput]) -> list[TeacherScores]:
        return self.teacher.score(rows)


class TeacherActors(Teacher):
    """The run's teacher replicas seen as one Teacher. ``folder``: the resolved ``distill.teacher``."""

    def __init__(self, cfg: GRPOConfig, folder: str):
        d = cfg.distill
        if d is None:
            raise ValueError("TeacherActors needs a config with distill set")
        check_teacher_tokenizer(folder, cfg.model.path)  # here, before any actor: the error as it is
        self.actors = ModelActors(cfg, TeacherHost, (folder, cfg.rollout.temperature, d.batch_size,
                                                     teacher_context(cfg), d.top_k), d.replicas, "teacher")

    def score(self, rows: list[TeacherInput]) -> list[TeacherScores]:
        return self.actors.call("score", rows)

    def close(self) -> None:
        self.actors.close()
