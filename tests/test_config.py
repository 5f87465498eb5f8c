"""The typed config: bounds, cross-field rules, overrides and presets, with messages that name the field."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from grpo_cli.main import main as cli_main
from grpo_core.config import (PLACEHOLDER_TREE, RESUME_SAFE_FIELDS, ConfigError, build_config, load_config,
                              parse_overrides)

ROOT = Path(__file__).resolve().parents[1]
BASE = {"model": {"path": "m"}, "data": {"train_path": "t.jsonl"}}


def _tree(**sections):
    tree = {k: dict(v) for k, v in BASE.items()}
    for name, values in sections.items():
        tree.setdefault(name, {}).update(values)
    return tree


def test_defaults_resolve_and_batch_size_is_prompts_times_samples():
    cfg = build_config(_tree(rollout={"prompts_per_iteration": 4, "samples_per_prompt": 6}))
    assert cfg.batch_size == 24
    assert cfg.algo.preset == "grpo" and cfg.algo.clip_eps_low == 0.2


@pytest.mark.parametrize("section,values,field", [
    ("rollout", {"temperature": 0.0}, "rollout.temperature"),
    ("rollout", {"samples_per_prompt": 0}, "rollout.samples_per_prompt"),
    ("train", {"lr": -1.0}, "train.lr"),
    ("train", {"zero_stage": 5}, "train.zero_stage"),
    ("algo", {"clip_eps_low": 1.5}, "algo.clip_eps_low"),
    ("reward", {"type": "regex"}, "reward.type"),
    ("checkpoint", {"interval": -1}, "checkpoint.interval"),
    ("checkpoint", {"keep_last": -2}, "checkpoint.keep_last"),
    ("cluster", {"max_actor_restarts": -1}, "cluster.max_actor_restarts"),
    ("storage", {"retries": -1}, "storage.retries"),
])
def test_invalid_values_name_the_field(section, values, field):
    with pytest.raises(ConfigError) as err:
        build_config(_tree(**{section: values}))
    assert field in str(err.value)


def test_unknown_keys_are_refused():
    with pytest.raises(ConfigError, match="rollout.temprature"):
        build_config(_tree(rollout={"temprature": 0.7}))


def test_mini_batch_must_divide_the_batch():
    with pytest.raises(ConfigError, match=r"train.mini_batch_size=5 must divide the batch.*4 x 8 = 32"):
        build_config(_tree(rollout={"prompts_per_iteration": 4, "samples_per_prompt": 8},
                           train={"mini_batch_size": 5}))


def test_micro_batch_must_divide_the_mini_batch():
    with pytest.raises(ConfigError, match=r"train.micro_batch_size=3 must divide each learner rank's share of the "
                                          r"mini-batch \(16 sequences / cluster.learners=1 = 16\)"):
        build_config(_tree(rollout={"prompts_per_iteration": 4, "samples_per_prompt": 8},
                           train={"mini_batch_size": 16, "micro_batch_size": 3}))


@pytest.mark.parametrize("cluster,weights,train,message", [
    ({"placement": "colocate", "samplers": 2, "learners": 1}, {}, {},
     r"cluster.samplers \(2\) must equal cluster.learners \(1\)"),
    ({"placement": "split"}, {"transport": "inprocess"}, {}, "weights.transport=inprocess needs sampler and learner"),
    ({"placement": "colocate"}, {"transport": "broadcast"}, {}, "weights.transport=broadcast .*cluster.placement=split"),
    ({"placement": "split", "learners": 3}, {}, {}, r"cluster.learners=3 must divide the mini-batch .* 32 sequences"),
    ({"placement": "split", "learners": 2}, {}, {"micro_batch_size": 5},
     r"train.micro_batch_size=5 must divide each learner rank's share .* = 16\)"),
    ({"placement": "split"}, {"transport": "cuda_ipc"}, {}, "cuda_ipc .*num_gpus"),
    ({"placement": "external"}, {}, {}, "placement=external .*list their URLs in cluster.servers"),
    ({"placement": "external", "servers": ["http://127.0.0.1:1"], "samplers": 2}, {}, {},
     r"cluster.samplers \(2\) must equal the number of cluster.servers \(1\)"),
    ({"placement": "external", "servers": ["127.0.0.1:8000"]}, {}, {}, "cluster.servers must be http"),
    ({"placement": "external", "servers": ["http://127.0.0.1:1"]}, {"transport": "inprocess"}, {},
     "weights.transport=inprocess cannot reach a server"),
    ({"placement": "split", "servers": ["http://127.0.0.1:1"]}, {}, {}, "servers are used only with placement=external"),
])
def test_placement_constraints_name_the_fields(cluster, weights, train, message):
    with pytest.raises(ConfigError, match=message):
        build_config(_tree(rollout={"prompts_per_iteration": 4, "samples_per_prompt": 8}, cluster=cluster,
                           weights=weights, train=train))


def test_external_placement_takes_one_sampler_per_server_and_files_by_default():
    cfg = build_config(_tree(rollout={"prompts_per_iteration": 4, "samples_per_prompt": 8},
                             cluster={"placement": "external", "servers": ["http://127.0.0.1:1", "http://h:2"]}))
    assert cfg.cluster.samplers == 2 and cfg.transport == "files"


def test_tensor_parallel_needs_gpus_and_auto_transport_follows_placement():
    with pytest.raises(ConfigError, match=r"tensor_parallel_size=2 .*sampler_resources.num_gpus >= 2 \(got 0"):
        build_config(_tree(rollout={"tensor_parallel_size": 2}, cluster={"placement": "split"}))
    split = build_config(_tree(rollout={"prompts_per_iteration": 4, "samples_per_prompt": 8},
                               cluster={"placement": "split", "samplers": 3, "learners": 2},
                               train={"micro_batch_size": 4}))
    assert split.transport == "broadcast" and split.rank_batch_size == 16 and split.grad_accum_steps == 4
    assert build_config(_tree()).transport == "inprocess"


def test_async_needs_split_turns_a_correction_on_and_shifts_the_sampling_version():
    tree = dict(rollout={"prompts_per_iteration": 4, "samples_per_prompt": 8, "max_staleness": 2})
    with pytest.raises(ConfigError, match=r"rollout.max_staleness=2 .*cluster.placement=split"):
        build_config(_tree(**tree))
    cfg = build_config(_tree(**tree, cluster={"placement": "split"}, train={"mini_batch_size": 16}))
    assert cfg.resolved_algo.tis_cap is None and cfg.optimizer_steps_per_iteration == 2
    assert [cfg.window.sampling_version(i) for i in range(5)] == [0, 0, 0, 2, 4]
    # async RL's default correction (docs/benchmarks.md: the comparison), derived: the field the user left unset
    # stays unset, and the run folder's record says what ran
    assert cfg.resolved_algo.offpolicy == "neg_adv_mask" and cfg.algo.offpolicy is None
    assert cfg.recorded()["algo"]["offpolicy"] == "neg_adv_mask"
    tis = build_config(_tree(**tree, cluster={"placement": "split"}, algo={"tis_cap": 1.5})).resolved_algo
    assert tis.offpolicy == "tis" and tis.tis_cap == 1.5
    off = build_config(_tree(**tree, cluster={"placement": "split"}, algo={"offpolicy": "none"})).resolved_algo
    assert off.offpolicy == "none" and off.tis_cap is None  # an explicit none keeps the correction off
    plain = build_config(_tree()).resolved_algo
    assert plain.offpolicy == "none" and plain.tis_cap is None
    sync = build_config(_tree()).window
    assert sync.sampling_version(3) == sync.learner_version(3)


def test_an_atropos_trainer_needs_the_endpoint_no_dynamic_sampling_and_somewhere_for_groups_to_come_from():
    asynch = dict(rollout={"max_staleness": 1}, cluster={"placement": "split"})
    envs = {"envs": [["python", "env.py", "--api", "{api_url}"]]}
    with pytest.raises(ConfigError, match=r"atropos is set: its environments sample through the policy endpoint"):
        build_config(_tree(**asynch, atropos=envs))
    with pytest.raises(ConfigError, match=r"atropos is set with algo.filter_groups"):
        build_config(_tree(**asynch, endpoint={}, atropos=envs, algo={"preset": "dapo"},
                           reward={"rewards": ["accuracy"]}))
    with pytest.raises(ConfigError, match=r"atropos\b.*nothing could send it groups"):
        build_config(_tree(**asynch, endpoint={}, atropos={}))
    with pytest.raises(ConfigError, match=r"endpoint is set with algo.filter_groups: dynamic sampling takes no inbox"):
        build_config(_tree(**asynch, endpoint={}, algo={"preset": "dapo"}, reward={"rewards": ["accuracy"]}))
    joined = build_config(_tree(**asynch, endpoint={}, atropos={"api_url": "http://127.0.0.1:8000"})).atropos
    assert joined.envs == [] and joined.api_command[0] == ".venv-envs/bin/run-api"
    assert build_config(_tree(**asynch, endpoint={}, atropos={"api_port": 8000})).atropos.api_port == 8000


def test_offpolicy_kind_resolves_its_cap_and_checks_its_band():
    assert build_config(_tree(algo={"tis_cap": 1.5})).resolved_algo.offpolicy == "tis"  # a cap alone turns TIS on
    seq = build_config(_tree(algo={"offpolicy": "seq_tis"}))
    assert seq.resolved_algo.offpolicy == "seq_tis" and seq.resolved_algo.tis_cap == 2.0
    assert seq.algo.tis_cap is None  # the validator never rewrites a field: the cap is derived
    ice = build_config(_tree(algo={"offpolicy": "icepop", "offpolicy_band": [0.8, 1.25]})).resolved_algo
    assert ice.tis_cap is None and ice.offpolicy_band == (0.8, 1.25)
    with pytest.raises(ConfigError, match=r"algo.offpolicy_band must satisfy 0 < low <= 1 <= high"):
        build_config(_tree(algo={"offpolicy": "icepop", "offpolicy_band": [1.1, 2.0]}))
    with pytest.raises(ConfigError, match="algo.offpolicy"):
        build_config(_tree(algo={"offpolicy": "sequence"}))
    with pytest.raises(ConfigError, match="algo.offpolicy_kl_threshold"):
        build_config(_tree(algo={"offpolicy": "neg_adv_mask", "offpolicy_kl_threshold": 0.0}))


def test_a_run_stored_before_the_offpolicy_kinds_keeps_its_correction_off():
    """Then ``offpolicy: tis`` with ``tis_cap: null`` meant no correction; read back it is ``none``."""
    from grpo_core.config import upgrade_stored_config

    stored = build_config(_tree()).recorded()
    del stored["algo"]["offpolicy_band"], stored["algo"]["offpolicy_kl_threshold"]
    stored["algo"]["offpolicy"] = "tis"
    assert upgrade_stored_config(stored) == build_config(_tree()).recorded()


def test_colocated_samplers_follow_learners_unless_given():
    tree = dict(rollout={"prompts_per_iteration": 4, "samples_per_prompt": 8})
    assert build_config(_tree(**tree, cluster={"learners": 2})).cluster.samplers == 2
    assert build_config(_tree(**tree, cluster={"placement": "split", "learners": 2})).cluster.samplers == 1


def test_groups_need_two_samples_and_reward_weights_match():
    with pytest.raises(ConfigError, match="samples_per_prompt must be >= 2"):
        build_config(_tree(rollout={"samples_per_prompt": 1}))
    with pytest.raises(ConfigError, match="reward.weights has 1 entries but reward.rewards has 2"):
        build_config(_tree(reward={"rewards": ["accuracy", "format"], "weights": [1.0]}))


def test_dynamic_sampling_needs_accuracy():
    with pytest.raises(ConfigError, match="must include 'accuracy'"):
        build_config(_tree(algo={"preset": "dapo"}, reward={"rewards": ["format"]}))


def test_overrides_parse_yaml_scalars_and_win_over_file_and_preset(tmp_path):
    assert parse_overrides(["a.b=3", "a.c=0.5", "d=[1, 2]", "e=true"]) == {"a": {"b": 3, "c": 0.5}, "d": [1, 2],
                                                                          "e": True}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_tree(algo={"preset": "dapo"}, rollout={"temperature": 0.9})))
    cfg = load_config(path, ["rollout.temperature=0.7", "algo.clip_eps_high=0.3"])
    assert cfg.rollout.temperature == 0.7
    assert cfg.algo.clip_eps_high == 0.3  # user beats preset
    assert cfg.algo.filter_groups is True  # preset fills what the user did not set


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_tree(rollout={"top_p": 2.0})))
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    assert str(bad) in str(err.value) and "rollout.top_p" in str(err.value)
    with pytest.raises(ConfigError, match="expected key=value"):
        load_config(bad, ["rollout.top_p"])


def test_cli_config_prints_resolved_preset(capsys):
    assert cli_main(["config", "--preset", "dapo"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["algo"]["preset"] == "dapo"
    assert printed["algo"]["clip_eps_high"] == 0.28 and printed["algo"]["filter_groups"] is True


def test_cli_reports_config_errors_with_exit_code_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_tree(train={"lr": 0})))
    assert cli_main(["train", "--config", str(bad)]) == 2
    assert "train.lr" in capsys.readouterr().err


def test_derived_batch_arithmetic_and_checkpoint_cadence():
    cfg = build_config(_tree(rollout={"prompts_per_iteration": 4, "samples_per_prompt": 8},
                             train={"mini_batch_size": 16, "micro_batch_size": 4, "ppo_epochs": 2},
                             checkpoint={"interval": 3}), "t")
    assert (cfg.batch_size, cfg.mini_batch_size, cfg.micro_batch_size, cfg.grad_accum_steps) == (32, 16, 4, 4)
    assert cfg.optimizer_steps_per_iteration == 4 and cfg.window.learner_version(5) == 20
    cfg = cfg.model_copy(update={"iterations": 8})
    assert [it for it in range(8) if cfg.is_checkpoint_iteration(it)] == [2, 5, 7]  # every 3rd and the last
    assert cfg.storage.retry_delays == [1.0, 2.0, 4.0, 8.0, 16.0]
    off = build_config(_tree(checkpoint={"interval": 0}))
    assert not any(off.is_checkpoint_iteration(it) for it in range(off.iterations))


def test_a_model_path_that_is_not_an_hf_folder_is_refused_naming_the_field(tmp_path, tiny_model):
    from grpo_core.config import check_model_folder

    for path, why in ((tmp_path / "missing", "does not exist"), (tmp_path, "has no config.json")):
        with pytest.raises(ConfigError, match=rf"model.path=.* is not an HF model folder \({why}\)"):
            check_model_folder(build_config(_tree(model={"path": str(path)})))
    check_model_folder(build_config(_tree(model={"path": tiny_model}, data={"max_prompt_tokens": 96},
                                          rollout={"max_new_tokens": 16})))
    # PPO's critic starts from a folder of its own when critic.path names one
    with pytest.raises(ConfigError, match=r"critic.path=.* is not an HF model folder \(does not exist\)"):
        check_model_folder(build_config(_tree(model={"path": tiny_model}, data={"max_prompt_tokens": 96},
                                              rollout={"max_new_tokens": 16}, algo={"preset": "ppo"},
                                              critic={"path": str(tmp_path / "missing")})))
    # ... over the policy's vocabulary: the tiny reward model's is the tiny policy's (its head kept as a critic's)
    ppo = dict(model={"path": tiny_model}, data={"max_prompt_tokens": 96}, rollout={"max_new_tokens": 16},
               algo={"preset": "ppo"})
    check_model_folder(build_config(_tree(**ppo, critic={"path": str(ROOT / "models/tiny-rm")})))
    with pytest.raises(ConfigError, match=r"critic.path=.*tiny-code' has vocab_size=506 and model.path=.* "
                                          r"vocab_size=393 .* must share the policy's tokenizer"):
        check_model_folder(build_config(_tree(**ppo, critic={"path": str(ROOT / "models/tiny-code")})))
    other = tmp_path / "other-tokenizer"
    shutil.copytree(tiny_model, other)
    shutil.copy(ROOT / "models/tiny-tools/tokenizer.json", other / "tokenizer.json")  # the same size, other ids
    with pytest.raises(ConfigError, match=r"critic.path=.*other-tokenizer' has another tokenizer than model.path=.* "
                                          r"\(token .*: (absent|id \d+) there, id \d+ in the policy's\)"):
        check_model_folder(build_config(_tree(**ppo, critic={"path": str(other)})))
    # a built-in policy missing: how to get it back
    with pytest.raises(ConfigError, match=r"tiny-code' is not an HF model folder \(does not exist\); it ships with "
                                          r"the project: restore it with `git checkout -- models/`"):
        check_model_folder(build_config(_tree(model={"path": str(tmp_path / "models/tiny-code")})))


def test_a_context_longer_than_the_model_holds_is_refused_before_any_engine_starts(tiny_model):
    """The tiny policy has 256 positions: a prompt and its answer (RL), or a conversation (SFT), longer than that
    is refused naming the fields; vLLM would refuse it only inside the engine's start."""
    from grpo_core.config import check_model_folder

    with pytest.raises(ConfigError, match=r"data.max_prompt_tokens \+ rollout.max_new_tokens = 96 \+ 256 = 352 "
                                          r"tokens per sequence, but model.path='.*tiny' has max_position_embeddings=256"):
        check_model_folder(build_config(_tree(model={"path": tiny_model}, data={"max_prompt_tokens": 96},
                                              rollout={"max_new_tokens": 256})))
    sft = _tree(model={"path": tiny_model}, data={"format": "chat", "max_prompt_tokens": 96},
                rollout={"max_new_tokens": 16}, sft={"max_tokens": 300})
    with pytest.raises(ConfigError, match=r"sft.max_tokens = 300 tokens per sequence, .* max_position_embeddings=256"):
        check_model_folder(build_config(sft))
    sft["sft"]["max_tokens"] = 256
    check_model_folder(build_config(sft))  # exactly the model's positions: accepted


def test_a_run_written_before_new_fields_existed_resumes_with_their_defaults(tmp_path):
    """config.json of an older version lacks fields added since: with ``upgrade_stored_config`` they take their
    defaults and the resume goes on; a real change is still refused."""
    from grpo_core.config import RESUME_SAFE_FIELDS, upgrade_stored_config
    from grpo_core.run.storage import ConfigConflict, RunStore

    cfg = build_config(_tree()).recorded()  # as a run folder records it
    old = json.loads(json.dumps(cfg))
    del old["model"]["lora"], old["weights"]["check_every"], old["cluster"]["servers"]
    store = RunStore(str(tmp_path), "old-run")
    store.put_bytes("config.json", json.dumps(old).encode())
    with pytest.raises(ConfigConflict, match="model.lora"):
        store.check_config(cfg, may_change=RESUME_SAFE_FIELDS)
    assert store.check_config(cfg, may_change=RESUME_SAFE_FIELDS, upgrade=upgrade_stored_config) == []
    changed = build_config({**_tree(), "seed": 3}).recorded()
    with pytest.raises(ConfigConflict, match="seed"):
        store.check_config(changed, may_change=RESUME_SAFE_FIELDS, upgrade=upgrade_stored_config)


def test_a_run_name_template_takes_the_start_date_and_time():
    from datetime import datetime, timezone

    night = datetime(2026, 11, 23, 3, 0, 5, tzinfo=timezone.utc)
    tree = {**PLACEHOLDER_TREE, "run_name": "nightly-{date}"}
    assert build_config(tree, now=night).run_name == "nightly-20261123"
    tree["run_name"] = "tiny-{date}-{time}"
    assert build_config(tree, now=night).run_name == "tiny-20261123-030005"
    # the same start time (a Prefect retry of the same flow run) gives the same run folder
    assert build_config(tree, now=night).run_name == build_config(dict(tree), now=night).run_name
    assert load_config(None, ["run_name=x-{date}"], now=night).run_name == "x-20261123"
    with pytest.raises(ConfigError, match=r"\{date\} and \{time\} only"):
        build_config({**tree, "run_name": "x-{hour}"}, now=night)
    assert build_config({**PLACEHOLDER_TREE, "run_name": "plain"}).run_name == "plain"


def test_logging_backends_default_to_tensorboard_and_are_checked():
    assert load_config(None).logging.backends == ["tensorboard"]
    with pytest.raises(ConfigError, match="logging.backends"):
        load_config(None, ["logging.backends=[wandb, wandb]"])
    with pytest.raises(ConfigError, match="logging.backends"):
        load_config(None, ["logging.backends=[comet]"])
    assert "logging" in RESUME_SAFE_FIELDS  # where figures go never changes what a run computes


def test_named_eval_sets_resolve_their_defaults_and_data_eval_path_is_the_default_set():
    cfg = build_config(_tree(data={"train_path": "t.jsonl", "eval_path": "e.jsonl", "system_prompt": "Be brief."},
                             eval={"greedy": False, "samples_per_prompt": 4, "max_prompts": 10}))
    (name, only), = cfg.eval_sets().items()
    assert name == "default" and only.path == "e.jsonl" and only.reward_type == "boxed" and only.format == "math"
    assert (only.greedy, only.samples, only.ks, only.max_prompts, only.system_prompt) == (False, 4, [1], 10,
                                                                                         "Be brief.")
    cfg = build_config(_tree(data={"train_path": "t.jsonl", "system_prompt": "Be brief."}, eval={"datasets": {
        "math": {"path": "m.jsonl"},
        "code": {"path": "c.jsonl", "reward_type": "code", "samples": 8, "greedy": False},
        "tags": {"path": "t.parquet", "reward_type": "think_answer_tags", "samples": 5, "pass_k": [2, 5, 2]}}}))
    sets = cfg.eval_sets()
    assert list(sets) == ["math", "code", "tags"]  # the first set's accuracy is eval_accuracy
    assert (sets["math"].format, sets["math"].ks, sets["math"].system_prompt) == ("math", [], "Be brief.")
    assert (sets["code"].format, sets["code"].ks, sets["code"].system_prompt) == ("code", [1, 8], None)
    assert sets["tags"].ks == [2, 5] and sets["tags"].answer_key == "gt_answer"


@pytest.mark.parametrize("eval_section, message", [
    ({"datasets": {"a": {"path": "a.jsonl", "greedy": False}}}, "needs greedy=true or samples > 0"),
    ({"datasets": {"a": {"path": "a.jsonl", "samples": 4, "pass_k": [8]}}}, r"1..samples=4, got \[8\]"),
    ({"datasets": {"a": {"path": "a.jsonl", "pass_k": [1]}}}, "samples is 0"),
    ({"datasets": {"a b": {"path": "a.jsonl"}}}, "names may hold letters"),
    ({"datasets": {"a": {"path": "a.jsonl", "reward_type": "regex"}}}, "eval.datasets.a.reward_type"),
])
def test_bad_eval_sets_name_the_field(eval_section, message):
    with pytest.raises(ConfigError, match=message):
        build_config(_tree(eval=eval_section))


def test_data_eval_path_and_eval_datasets_together_are_refused():
    with pytest.raises(ConfigError, match="data.eval_path .* and eval.datasets are both set"):
        build_config(_tree(data={"train_path": "t.jsonl", "eval_path": "e.jsonl"},
                           eval={"datasets": {"x": {"path": "x.jsonl"}}}))


@pytest.mark.parametrize("name", ["qwen2.5-0.5b-gsm8k.yaml", "qwen2.5-7b-dapo-math.yaml", "tiny-code.yaml",
                                  "smollm2-arith-bf16.yaml"])
def test_shipped_real_model_and_code_configs_validate(name):
    """The schema only: the model folders of real-model configs are the user's and need not exist here."""
    cfg = load_config(ROOT / "configs" / name)
    assert cfg.eval_sets(), f"{name} evaluates nothing"
    if name.startswith("qwen2.5-7b"):
        assert cfg.cluster.placement == "split" and cfg.transport == "broadcast" and cfg.algo.filter_groups
        assert cfg.train.zero_stage == 3 and cfg.rollout.max_staleness == 1
    if name.startswith("qwen2.5-0.5b"):
        assert cfg.cluster.placement == "colocate" and cfg.cluster.learner_resources.num_gpus == 1
    if name.startswith("smollm2-arith-bf16"):
        assert cfg.model.dtype == "bfloat16" and cfg.resolved_algo.offpolicy == "tis" and cfg.train.bf16_rounding == "auto"


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_validates(path):
    """Every config in configs/ passes the schema and its bounds (model folders need not exist here)."""
    cfg = load_config(path)
    assert cfg.iterations >= 1 and cfg.run_name


def test_the_shipped_configs_are_found():
    assert len(list((ROOT / "configs").glob("*.yaml"))) >= 10


def test_every_preset_validates():
    from grpo_core.algo.presets import PRESETS

    for name in PRESETS:
        assert load_config(None, preset=name).algo.preset == name


def test_zero_stage_auto_partitions_only_across_several_ranks():
    from grpo_core.config import TrainConfig, zero_stage_for

    assert TrainConfig().zero_stage == "auto"
    assert zero_stage_for(TrainConfig(), 1) == 0 and zero_stage_for(TrainConfig(), 4) == 2
    assert zero_stage_for(TrainConfig(zero_stage=2), 1) == 2 and zero_stage_for(TrainConfig(zero_stage=3), 4) == 3


def test_few_shot_turns_are_user_assistant_pairs_and_eval_sets_inherit_them():
    turns = [{"role": "user", "content": "What is 1 + 2?"}, {"role": "assistant", "content": "\\boxed{3}"}]
    cfg = build_config(_tree(data={"few_shot": turns, "eval_path": "e.jsonl"}))
    assert [t.model_dump() for t in cfg.eval_sets()["default"].few_shot] == turns
    other = build_config(_tree(data={"few_shot": turns}, eval={"datasets": {"code": {"path": "c.jsonl",
                                                                                     "reward_type": "code"}}}))
    assert other.eval_sets()["code"].few_shot == []  # another reward type: not the run's examples
    with pytest.raises(ConfigError, match=r"data.few_shot must be pairs of turns, user then assistant"):
        build_config(_tree(data={"few_shot": turns[:1]}))
    with pytest.raises(ConfigError, match=r"data.few_shot must be pairs of turns"):
        build_config(_tree(data={"few_shot": turns[::-1]}))
    with pytest.raises(ConfigError, match=r"data.few_shot.0.role"):
        build_config(_tree(data={"few_shot": [{"role": "system", "content": "x"}, turns[1]]}))
    # a worked answer that calls a tool: assistant (the call), tool (its output), assistant (the answer)
    calls = [{"role": "user", "content": "What is 512 * 734?"},
             {"role": "assistant", "content": "<calculator>512 * 734</calculator>"},
             {"role": "tool", "content": "375808"}, {"role": "assistant", "content": "\\boxed{375808}"}]
    assert [t.role for t in build_config(_tree(data={"few_shot": calls + turns})).data.few_shot] == \
        ["user", "assistant", "tool", "assistant", "user", "assistant"]
    for bad in (calls[:3], [calls[0], calls[2], calls[3]], calls[:2] + calls[2:3] * 2):
        with pytest.raises(ConfigError, match=r"data.few_shot must be pairs of turns"):
            build_config(_tree(data={"few_shot": bad}))


def test_dtype_auto_resolves_by_the_device_and_the_logprob_bound_is_opt_in():
    from grpo_core.engine.precision import native_bf16, resolve_dtype

    assert build_config(_tree(model={"dtype": "auto"})).model.dtype == "auto"
    assert resolve_dtype("auto") == ("bfloat16" if native_bf16() else "float32")
    assert resolve_dtype("float32") == "float32"
    assert build_config(_tree()).weights.check_tolerance is None  # the digests decide; a bound only if asked for
    assert build_config(_tree(weights={"check_tolerance": 0.5})).weights.check_tolerance == 0.5
    with pytest.raises(ConfigError, match="weights.check_tolerance"):
        build_config(_tree(weights={"check_tolerance": 0}))


def test_an_sft_config_trains_on_conversations_and_refuses_what_belongs_to_rl():
    sft = {"data": {"format": "chat"}, "sft": {"conversations_per_iteration": 6}}
    cfg = build_config(_tree(**sft, rollout={"samples_per_prompt": 1, "temperature": 0.7},
                             train={"mini_batch_size": 3, "micro_batch_size": 3}))
    assert cfg.objective == "sft" and cfg.batch_size == 6 and cfg.optimizer_steps_per_iteration == 2
    assert cfg.learner_temperature == 1.0  # the data's likelihood, whatever the sampling temperature
    assert build_config(_tree(rollout={"temperature": 0.7})).learner_temperature == 0.7
    assert build_config(BASE).objective == "policy_gradient"
    with pytest.raises(ConfigError, match="data.format=chat holds conversations to fine-tune on: set sft"):
        build_config(_tree(data={"format": "chat"}))
    with pytest.raises(ConfigError, match="must hold conversations \\(data.format: chat\\)"):
        build_config(_tree(sft={}))
    with pytest.raises(ConfigError, match="env, algo.filter_groups, data.few_shot belong to RL runs"):
        build_config(_tree(sft={}, env={}, algo={"filter_groups": True},
                           data={"format": "chat", "few_shot": [{"role": "user", "content": "q"},
                                                                {"role": "assistant", "content": "a"}]}))
    with pytest.raises(ConfigError, match="must divide the batch: sft.conversations_per_iteration = 6"):
        build_config(_tree(**sft, train={"mini_batch_size": 4}))
    with pytest.raises(ConfigError, match="cannot hold the longest row: sft.max_tokens = 1024"):
        build_config(_tree(**sft, train={"max_tokens_per_microbatch": 512}))
