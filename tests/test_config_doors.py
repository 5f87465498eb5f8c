"""What the config lets in: every number within its bounds (and finite), a run name that is one safe folder name,
refused with a message naming the field (issue 53's hostile findings)."""
from __future__ import annotations

import math
import typing
from pathlib import Path

import pytest
from pydantic import ValidationError

import grpo_core.config.section as sections
from grpo_cli.main import main as cli_main
from grpo_core.config import PLACEHOLDER_TREE, ConfigError, GRPOConfig, build_config, load_config

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"


@pytest.mark.parametrize("override, field", [
    ("train.betas=[2, 2]", "train.betas"),
    ("train.betas=[0.9, 1.0]", "train.betas"),
    ("train.betas=[-0.1, 0.999]", "train.betas"),
    ("seed=-1", "seed"),
    (f"seed={2**63}", "seed"),
    ("train.lr=.inf", "train.lr"),
    ("train.lr=.nan", "train.lr"),
    ("train.weight_decay=2", "train.weight_decay"),
    ("train.grad_clip=.inf", "train.grad_clip"),
    ("rollout.temperature=.nan", "rollout.temperature"),
    ("rollout.top_p=1.5", "rollout.top_p"),
    ("algo.kl_coeff=.inf", "algo.kl_coeff"),
    ("algo.entropy_coeff=.nan", "algo.entropy_coeff"),
    ("algo.filter_range=[0, .inf]", "algo.filter_range.1"),
    ("algo.offpolicy_band=[.nan, 2]", "algo.offpolicy_band.0"),
    ("reward.weights=[.nan]", "reward.weights.0"),
    ("cluster.learner_resources.resources={gpu_node: -1}", "cluster.learner_resources.resources"),
    ("cluster.learner_resources.num_cpus=.inf", "cluster.learner_resources.num_cpus"),
    ("storage.retries=1000", "storage.retries"),
    ("storage.retry_delay_s=.inf", "storage.retry_delay_s"),
    ("weights.check_tolerance=.inf", "weights.check_tolerance"),
    ("gate.guards={accuracy: 2}", "gate.guards"),
    ("gate.guards={accuracy: -0.1}", "gate.guards"),
    ("logging.console_interval_s=.nan", "logging.console_interval_s"),
])
def test_a_number_out_of_bounds_is_refused_naming_the_field(override, field):
    with pytest.raises(ConfigError) as err:
        load_config(TINY, [override])
    assert field in str(err.value)


@pytest.mark.parametrize("overrides", [
    ["seed=0"], [f"seed={2**63 - 1}"], ["train.betas=[0, 0.999]"], ["train.weight_decay=0.1"],
    ["storage.retries=20", "storage.retry_delay_s=0"], ["gate.guards={accuracy: 1.0}"],
])
def test_the_bounds_themselves_are_accepted(overrides):
    load_config(TINY, overrides)


def _sections() -> list[type]:
    found, todo = [], [sections._Section]
    while todo:
        for sub in todo.pop().__subclasses__():
            found.append(sub)
            todo.append(sub)
    return found


# Sections with required fields, and what they are given here
REQUIRED = {"ModelConfig": {"path": "m"}, "DataConfig": {"train_path": "t.jsonl"}, "DistillConfig": {"teacher": "t"},
            "EvalDatasetConfig": {"path": "e.jsonl"}, "ChatTurn": {"role": "user", "content": "x"},
            "ModelRewardConfig": {"kind": "remote", "url": "http://127.0.0.1:9"},
            "AtroposConfig": {"api_url": "http://127.0.0.1:9"}}


def _instance(cls: type):
    if cls is GRPOConfig:
        return build_config(dict(PLACEHOLDER_TREE))
    return cls(**REQUIRED.get(cls.__name__, {}))


def _holding(annotation, bad: float):
    """A value of the field's type with ``bad`` where a float goes (a float, a tuple's, list's or dict's entries)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        return _holding(args[0], bad)
    if origin is tuple:
        return tuple(bad for _ in args)
    if origin is list:
        return [bad]
    if origin is dict:
        return {"accuracy": bad}
    return bad


def _holds_float(annotation) -> bool:
    """Whether the type is float or holds floats (Optional, tuple, list, dict values; Annotated bounds)."""
    return annotation is float or any(_holds_float(a) for a in typing.get_args(annotation))


def _float_fields() -> list[tuple[type, str]]:
    return [(cls, name) for cls in _sections() for name, f in cls.model_fields.items()
            if _holds_float(f.annotation)]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_no_float_of_any_section_may_be_nan_or_infinite(bad):
    fields = _float_fields()
    assert len(fields) >= 40, f"the walk over the sections found only {fields}"
    for cls, name in fields:
        section = _instance(cls)
        with pytest.raises(ValidationError) as err:
            setattr(section, name, _holding(cls.model_fields[name].annotation, bad))
        assert all(e["loc"][0] == name for e in err.value.errors()), (cls.__name__, name, err.value)
        assert any(e["type"] == "finite_number" for e in err.value.errors()), (cls.__name__, name, err.value)


@pytest.mark.parametrize("name", ["{date}/../x", "..", ".", "a/b", "../evil", ".hidden", "-rf", "a b", "x" * 129,
                                  "run\\x", "{date}/{time}", "tiny\n", "ünï"])
def test_a_run_name_that_is_not_one_safe_folder_name_is_refused(name):
    ways = [lambda: build_config({**PLACEHOLDER_TREE, "run_name": name})]
    if not name.endswith("\n"):  # an override's trailing newline is YAML's to strip
        ways.append(lambda: load_config(TINY, [f"run_name={name}"]))
    for refuse in ways:
        with pytest.raises(ConfigError) as err:
            refuse()
        message = str(err.value)
        assert "run_name" in message and ("letters, digits" in message or "at most 128" in message), message


@pytest.mark.parametrize("name, expected", [
    ("{date}", "20261123"), ("nightly-{date}-{time}", "nightly-20261123-030005"), ("a.b_c-1", "a.b_c-1"),
    ("007", "007"), ("x-{date}", "x-20261123"), ("_scratch", "_scratch")])
def test_run_names_and_filled_templates_that_are_safe_are_kept(name, expected):
    from datetime import datetime, timezone

    night = datetime(2026, 11, 23, 3, 0, 5, tzinfo=timezone.utc)
    assert load_config(TINY, [f"run_name={name}"], now=night).run_name == expected


def test_a_template_whose_placeholders_fill_an_unsafe_name_says_what_it_became():
    with pytest.raises(ConfigError, match=r"run_name='\{date\}/\.\./x' gives '\d{8}/\.\./x' once \{date\} and "
                                          r"\{time\} are filled: a run name is one folder name"):
        load_config(TINY, ["run_name={date}/../x"])
    with pytest.raises(ConfigError, match=r"run_name='\{date\.year\}': a template may use \{date\} and \{time\}"):
        load_config(TINY, ["run_name={date.year}"])


def test_grpo_train_refuses_an_unsafe_run_name_with_exit_code_2_and_no_traceback(capsys):
    assert cli_main(["train", "--config", str(TINY), "--set", "run_name={date}/../x"]) == 2
    err = capsys.readouterr().err
    assert "run_name" in err and "Traceback" not in err


def test_an_override_that_is_not_yaml_is_refused_naming_its_key():
    with pytest.raises(ConfigError, match=r"--set rollout.temperature=\[1: the value is not valid YAML"):
        load_config(TINY, ["rollout.temperature=[1"])
