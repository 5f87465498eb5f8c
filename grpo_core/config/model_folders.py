"""Before any engine starts: the model folders a config names are what they must be, and the context fits them."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from grpo_core.config.learning import ModelRewardConfig
from grpo_core.config.run import GRPOConfig
from grpo_core.config.section import ConfigError


SHIPPED_HINT = ("it ships with the project: restore it with `git checkout -- models/` (or rebuild it with "
                "`make models`)")
BUILT_IN_MODELS = {"tiny": SHIPPED_HINT, "tiny-code": SHIPPED_HINT, "tiny-tools": SHIPPED_HINT,
                   "tiny-rm": SHIPPED_HINT, "smollm2": "build it with `make model-smollm2`"}
CAUSAL_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


def check_model_folder(cfg: GRPOConfig) -> None:
    """Before any engine starts: ``model.path`` must be an HF folder of a causal language model (transformers would
    otherwise fail deep inside with a message about a hub "repo id", since nothing is ever downloaded here), and
    every model reward's folder one of its kind (a classifier with a scalar head, a judge that generates)."""
    path = Path(cfg.model.path)
    if path.is_file() and path.suffix == ".gguf":
        raise ConfigError(f"model.path={cfg.model.path!r} is a GGUF file: import it first with `grpo model import "
                          f"--gguf {cfg.model.path} --out DIR` and give DIR")
    hf = _hf_config("model.path", cfg.model.path)
    architectures = hf.get("architectures") or []
    bad = [a for a in architectures if not a.endswith(CAUSAL_LM_SUFFIXES)]
    if architectures and len(bad) == len(architectures):
        raise ConfigError(f"model.path={cfg.model.path!r} holds a {bad[0]} (architectures in its config.json), not a "
                          "causal language model: a policy must generate text")
    _check_context(cfg, hf.get("max_position_embeddings"))
    check_reward_model_folders(cfg.reward.models)
    if cfg.critic is not None and cfg.critic.path is not None:
        _check_critic_folder(cfg, hf)


def _check_critic_folder(cfg: GRPOConfig, policy: dict[str, Any]) -> None:
    """``critic.path``: a folder transformers can load a value model from, over the policy's vocabulary. The critic
    reads the policy's token ids; another tokenizer's model would give every token the value of some other token,
    and the run would train on that without an error."""
    folder = cfg.critic.path
    hf = _hf_config("critic.path", folder)
    if hf.get("vocab_size") != policy.get("vocab_size"):
        raise ConfigError(f"critic.path={folder!r} has vocab_size={hf.get('vocab_size')} and model.path="
                          f"{cfg.model.path!r} vocab_size={policy.get('vocab_size')} (their config.json): the critic "
                          "reads the policy's token ids, so it must share the policy's tokenizer")
    if not any((Path(folder) / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        return  # a model saved without its tokenizer: the vocabulary's size is all there is to compare
    from transformers import AutoTokenizer

    theirs, ours = (AutoTokenizer.from_pretrained(f, local_files_only=True).get_vocab()
                    for f in (folder, cfg.model.path))
    if theirs != ours:
        token = next(t for t in sorted(set(theirs) | set(ours)) if theirs.get(t) != ours.get(t))
        def where(vocab: dict[str, int]) -> str:
            return "absent" if token not in vocab else f"id {vocab[token]}"

        raise ConfigError(f"critic.path={folder!r} has another tokenizer than model.path={cfg.model.path!r} (token "
                          f"{token!r}: {where(theirs)} there, {where(ours)} in the policy's): the critic reads the "
                          "policy's token ids, so it must share the policy's tokenizer")


def _check_context(cfg: GRPOConfig, context: int | None) -> None:
    """The samplers hold a prompt and its answer, the learner the kind's longest row: both within the positions the
    model has (vLLM refuses a longer context only inside the engine's start, after Ray and the actors are up)."""
    if not context:
        return
    for tokens, what in dict.fromkeys((cfg.kind.sampler_context(cfg), cfg.kind.longest_row(cfg))):
        if tokens > context:
            raise ConfigError(f"{what} tokens per sequence, but model.path={cfg.model.path!r} has "
                              f"max_position_embeddings={context} (its config.json): lower them to fit")


def check_reward_model_folders(models: dict[str, ModelRewardConfig]) -> None:
    """Each ``reward.models`` folder one of its kind: a classifier with a scalar head, a judge that generates."""
    for name, model in models.items():
        if model.path is None:
            continue
        field = f"reward.models.{name}.path"
        hf = _hf_config(field, model.path)
        architectures = hf.get("architectures") or []
        if model.kind == "classifier":
            labels = hf.get("num_labels", len(hf.get("id2label") or {}) or 2)
            if not any(a.endswith("ForSequenceClassification") for a in architectures) or labels != 1:
                raise ConfigError(f"{field}={model.path!r} is no reward model with a scalar head (architectures "
                                  f"{architectures}, {labels} labels): a classifier reward needs an "
                                  "AutoModelForSequenceClassification saved with num_labels=1")
        elif architectures and not any(a.endswith(CAUSAL_LM_SUFFIXES) for a in architectures):
            raise ConfigError(f"{field}={model.path!r} holds a {architectures[0]}, not a causal language model: a "
                              "judge must generate its verdict")


def _hf_config(field: str, folder: str) -> dict[str, Any]:
    """The config.json of the HF model folder named by `field`, with a message naming the field if it is none."""
    import json

    path = Path(folder)
    if not (path / "config.json").is_file():
        why = "does not exist" if not path.exists() else "has no config.json"
        built_in = BUILT_IN_MODELS.get(path.name)
        hint = built_in or ("give a folder saved by transformers' save_pretrained (the built-in ones: models/tiny, "
                            "models/tiny-code, models/tiny-tools; SmolLM2 after `make model-smollm2`)")
        raise ConfigError(f"{field}={folder!r} is not an HF model folder ({why}); {hint}")
    try:
        hf = json.loads((path / "config.json").read_text())
    except ValueError as err:
        raise ConfigError(f"{field}={folder!r}: config.json is not JSON ({err})") from None
    if not isinstance(hf, dict):
        raise ConfigError(f"{field}={folder!r}: config.json is not a JSON object")
    return hf
