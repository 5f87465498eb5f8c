"""The `grpo-sft-rl` flow: supervised fine-tuning, then RL from its final policy, as two subflows of one flow run.

DeepSeek-R1's recipe and most 2026 stacks start RL from an SFT cold start. Here each stage is a flow of its own
(`grpo-sft`, `grpo-train`), so the UI shows this flow run with its two child runs, each with its own tasks,
artifacts and run folder; the RL run starts from the SFT run (``model.init_from`` set to its name), which its
``init_from.json`` records: the lineage. Run names are expanded once, with this flow run's start time, so a retry of
the flow run finds the same two run folders: a finished SFT run is not redone and an RL run resumes from its
latest checkpoint.
"""
from __future__ import annotations

from typing import Any

from prefect import flow

from flows.grpo_train import flow_config, grpo_sft, grpo_train
from grpo_core.config import ConfigError
from tasks.run_log import flow_lines_at_info


def _names(sft_config_path: str, rl_config_path: str, sft_overrides: list[str] | None,
           rl_overrides: list[str] | None) -> tuple[str, str]:
    sft = flow_config(None, sft_config_path, sft_overrides)
    rl = flow_config(None, rl_config_path, rl_overrides)
    if sft.kind.flow != grpo_sft.name:
        raise ConfigError(f"{sft_config_path}: the first stage is SFT: its config must set sft (and data.format: "
                          f"chat)")
    if rl.kind.flow != grpo_train.name:
        raise ConfigError(f"{rl_config_path}: the second stage is RL: its config must not set sft")
    if sft.storage.root != rl.storage.root:
        raise ConfigError(f"the RL run starts from the SFT run by name, under one storage.root: {sft_config_path} "
                          f"has {sft.storage.root!r}, {rl_config_path} has {rl.storage.root!r}")
    return sft.run_name, rl.run_name


def _flow_run_name() -> str:
    from prefect.runtime import flow_run

    p = flow_run.parameters
    try:
        sft, rl = _names(p["sft_config_path"], p["rl_config_path"], p.get("sft_overrides"), p.get("rl_overrides"))
    except (ConfigError, OSError):
        return "grpo-sft-rl-invalid-config"  # the flow itself then fails with the error
    return f"{sft}-then-{rl}"


@flow(name="grpo-sft-rl", flow_run_name=_flow_run_name, log_prints=True)
def grpo_sft_rl(sft_config_path: str, rl_config_path: str, sft_overrides: list[str] | None = None,
                rl_overrides: list[str] | None = None) -> dict[str, Any]:
    """SFT (`sft_config_path`, a config with sft set), then RL (`rl_config_path`) from the SFT run's final policy,
    each a subflow. The RL config's own model.init_from is replaced by the SFT run."""
    sft_run, rl_run = _names(sft_config_path, rl_config_path, sft_overrides, rl_overrides)
    with flow_lines_at_info():
        print(f"stage 1: SFT run {sft_run}; stage 2: RL run {rl_run}, starting from {sft_run}'s final policy")
        sft = grpo_sft(config_path=sft_config_path, overrides=[*(sft_overrides or []), f"run_name={sft_run}"])
        rl = grpo_train(config_path=rl_config_path, overrides=[*(rl_overrides or []), f"run_name={rl_run}",
                                                                 f"model.init_from={sft_run}"])
        print(f"SFT {sft_run}: final eval accuracy {sft['final_eval_accuracy']}; RL {rl_run}: final eval accuracy "
              f"{rl['final_eval_accuracy']}")
    return {"sft": sft, "rl": rl}


# What the deployment runs: a failed flow run is retried (same parameters, same run names) after a pause; a finished
# SFT stage is then not redone and the RL stage resumes its run folder.
grpo_sft_rl_with_retries = grpo_sft_rl.with_options(retries=2, retry_delay_seconds=60)
