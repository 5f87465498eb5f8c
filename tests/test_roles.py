"""The engine actor is composed of small roles, and the driver reaches them through methods, not strings."""
from __future__ import annotations

import ast

from tests.conftest import REPO


# The driver's handles on the engine actors (ray_cluster.py places them; reward_models.py drives other actors)
DRIVER_MODULES = ("engines.py", "learner_group.py", "fleet.py", "weight_sync.py", "weight_client.py", "calls.py")


def _remote_calls(path) -> set[str]:
    """Names ``m`` of every ``<actor>.m.remote(...)`` call in a file."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "remote"
                and isinstance(node.func.value, ast.Attribute)):
            names.add(node.func.value.attr)
    return names


def test_every_actor_call_of_the_driver_is_a_method_of_the_engine_actor():
    from grpo_core.engine.worker import EngineWorker

    called = set().union(*(_remote_calls(REPO / "grpo_core/cluster" / name) for name in DRIVER_MODULES))
    assert {"train", "publish_weights", "receive_weights", "sample", "wt_update", "setup"} <= called
    assert sorted(m for m in called if not callable(getattr(EngineWorker, m, None))) == []


def test_no_actor_method_is_reached_by_a_name_in_a_string():
    for name in DRIVER_MODULES:
        assert "getattr(" not in (REPO / "grpo_core/cluster" / name).read_text(), name


def test_each_role_is_a_module_of_its_own():
    from grpo_core.engine.worker import EngineWorker
    from grpo_core.engine.roles.learner import LearnerRole
    from grpo_core.engine.roles.sampler import SamplerRole

    assert EngineWorker.__mro__[1:3] == (SamplerRole, LearnerRole)
    sampler_side = {"sample", "generate_eval", "sampler_logprobs", "serve_checkpoint", "receive_weights",
                    "load_published", "served_receipt", "server_alive", "wt_init", "wt_start", "wt_update", "wt_finish"}
    learner_side = {"train", "learner_logprobs", "publish_weights", "publish", "join_transfer", "checkpoint_begin",
                    "checkpoint_result", "restore", "save_final", "published_receipt", "open_rendezvous"}
    assert sampler_side <= set(vars(SamplerRole)) and not sampler_side & set(vars(LearnerRole))
    assert learner_side <= set(vars(LearnerRole)) and not learner_side & set(vars(SamplerRole))
    for module in ("worker.py", "roles/sampler.py", "roles/learner.py"):
        assert len((REPO / "grpo_core/engine" / module).read_text().splitlines()) < 300, module
