"""The one typed config of a run: ``GRPOConfig`` (``run.py``) and its sections (``inputs``, ``sampling``,
``learning``, ``resources``), the kinds it decides (``placements``, ``transport_kinds``, ``run_kinds``), loading
(``loading``) and the model folder check (``model_folders``). Import what you need from ``grpo_core.config``."""
from __future__ import annotations

from grpo_core.config.inputs import (DEFAULT_EVAL_SET, VLLM_LORA_RANKS, ChatTurn, DataConfig, EvalConfig,
                                    EvalDatasetConfig, LoraConfig, LoraTarget, ModelConfig)
from grpo_core.config.learning import (AlgoConfig, CriticConfig, DistillConfig, ModelRewardConfig, RewardConfig,
                                      SFTConfig, TrainConfig, zero_stage_for)
from grpo_core.config.loading import (PLACEHOLDER_TREE, build_config, expand_run_name, load_config, merge_trees,
                                     parse_overrides, upgrade_stored_config)
from grpo_core.config.model_folders import check_model_folder, check_reward_model_folders
from grpo_core.config.resources import (CHAMPION, REGISTRY_FOLDER, CheckpointConfig, ClusterConfig, GateConfig,
                                       METRIC_BACKENDS, LoggingConfig, RegistryConfig, RoleResources, StorageConfig,
                                       WeightsConfig)
from grpo_core.config.run import RESUME_SAFE_FIELDS, GRPOConfig
from grpo_core.config.sampling import AtroposConfig, EndpointConfig, EnvConfig, RolloutConfig
from grpo_core.config.section import ConfigError

__all__ = ["CHAMPION", "DEFAULT_EVAL_SET", "PLACEHOLDER_TREE", "REGISTRY_FOLDER", "RESUME_SAFE_FIELDS",
           "VLLM_LORA_RANKS", "AlgoConfig", "AtroposConfig", "ChatTurn", "CheckpointConfig", "ClusterConfig",
           "ConfigError", "CriticConfig", "DataConfig", "DistillConfig", "EndpointConfig", "EnvConfig", "EvalConfig",
           "EvalDatasetConfig", "GRPOConfig", "GateConfig", "LoggingConfig", "METRIC_BACKENDS", "LoraConfig",
           "LoraTarget", "ModelConfig", "ModelRewardConfig", "RegistryConfig", "RewardConfig", "RoleResources", "RolloutConfig", "SFTConfig",
           "StorageConfig", "TrainConfig", "WeightsConfig", "build_config", "check_model_folder",
           "check_reward_model_folders", "expand_run_name", "load_config", "merge_trees", "parse_overrides",
           "upgrade_stored_config", "zero_stage_for"]
