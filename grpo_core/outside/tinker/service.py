"""Sessions, training models, sampling sessions and checkpoints, kept in order: what each Tinker route does,
without HTTP.

Every training model's operations (forward_backward, optim_step, saves, loads) run one after another on one
training thread, in the order they arrived; the SDK sends a model's requests one at a time in ``seq_id`` order and
resends a request whose answer it lost, so a repeated ``(model_id, seq_id)`` gets the first request's id back
instead of running twice. Sampling runs on its own thread and never waits for training: it reads immutable
snapshots (adapter or weight folders written before the snapshot's future resolves).

The run folder (``root``)::

    <model>/weights/<name>/          save_state: trainable weights, AdamW state, step, spec (tinker://<model>/weights/<name>)
    <model>/sampler_weights/<name>/  save_weights_for_sampler: a peft adapter or HF weights (…/sampler_weights/<name>)
    <model>/requests.jsonl           one row per forward_backward and optim_step (loss, sizes, metrics)
    <model>/tensorboard/             one row per optim_step (step_log.py), and W&B's or MLflow's files when asked
"""
from __future__ import annotations

import json
import os
import queue
import secrets
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from grpo_core.outside.tinker import checkpoints
from grpo_core.outside.tinker.errors import TinkerRequestError, not_found
from grpo_core.outside.tinker.futures import FutureTable, Outcome
from grpo_core.outside.tinker.step_log import StepLog
from grpo_core.outside.tinker.snapshots import (
    SampleCall, SampleResult, SamplerSettings, Snapshot, SnapshotSampler, check_sample_call,
)
from grpo_core.outside.tinker.trainee import AdamStep, Trainee, TraineeSpec, read_state
from grpo_core.outside.tinker.wire import ForwardBackwardCall, forward_backward_output, sample_response
from grpo_core.run.metric_sinks import SinkSettings
from grpo_core.run.storage import RunStore

NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
SAMPLE_BATCH = 256  # sample requests at most in one engine call
EPHEMERAL_KEPT = 4  # save_weights_and_get_sampling_client snapshots kept per model (older ones are deleted)


@dataclass(frozen=True)
class ServiceSettings:
    base_model: str               # the model folder every client trains (one base model per server)
    root: Path                    # the run folder
    max_lora_rank: int = 32
    max_model_len: int | None = None  # None: the model's own context
    kv_cache_mb: int = 256
    seed: int = 0
    sample_adapters: str = "merged"  # how samplers serve LoRA snapshots (SamplerSettings.adapters)
    metric_sinks: tuple[str, ...] = ("tensorboard",)  # where each client's steps are logged (step_log.py)
    project: str = "grpo-tinker"  # W&B project / MLflow experiment


@dataclass
class Session:
    session_id: str
    created: float
    heartbeat: float
    finished: str | None = None
    user_metadata: dict[str, str] | None = None  # as the client gave it at creation (the SDK's dict[str, str])
    display_name: str | None = None


@dataclass
class Model:
    model_id: str
    base_name: str                # what the client called the base model (echoed in get_info)
    trainee: Trainee
    log: StepLog
    seen: dict[int, str] = field(default_factory=dict)  # seq_id -> request id
    ephemeral: list[Path] = field(default_factory=list)
    created: float = field(default_factory=time.time)


@dataclass(frozen=True)
class SamplingSession:
    sampling_session_id: str
    base_name: str
    snapshot: Snapshot
    model_path: str | None


# A session's labels stay in memory as long as the server runs: bounded, so that a client cannot fill it with them.
METADATA_ENTRIES, METADATA_TEXT, DISPLAY_NAME_TEXT = 64, 1024, 256


def _check_session_labels(user_metadata: dict, display_name: str | None) -> None:
    """``user_metadata`` as the SDK types it (``dict[str, str]``), within bounds; refused naming the field."""
    if len(user_metadata) > METADATA_ENTRIES:
        raise TinkerRequestError(f"user_metadata has {len(user_metadata)} entries: at most {METADATA_ENTRIES}",
                                 field="user_metadata")
    for key, value in user_metadata.items():
        if not isinstance(value, str):
            raise TinkerRequestError(f"user_metadata[{key[:64]!r}] is {type(value).__name__}: its values are text",
                                     field="user_metadata")
        if len(key) > METADATA_TEXT or len(value) > METADATA_TEXT:
            raise TinkerRequestError(f"user_metadata[{key[:64]!r}]: keys and values are at most {METADATA_TEXT} "
                                     "characters", field="user_metadata")
    if display_name is not None and len(display_name) > DISPLAY_NAME_TEXT:
        raise TinkerRequestError(f"display_name has {len(display_name)} characters: at most {DISPLAY_NAME_TEXT}",
                                 field="display_name")


def _scope(access_scope: str) -> None:
    if access_scope not in ("owned", "accessible"):
        raise TinkerRequestError(f"access_scope {access_scope!r}: 'owned' or 'accessible'", field="access_scope")


def checked_name(name: str, field_name: str) -> str:
    if not (0 < len(name) <= 128 and set(name) <= NAME_CHARS) or name in (".", ".."):
        raise TinkerRequestError(f"{field_name} {name!r}: a checkpoint name is 1 to 128 of [A-Za-z0-9._-]",
                                 field=field_name)
    return name


def parse_tinker_path(path: str, field_name: str = "path") -> tuple[str, str, str]:
    """``tinker://<model_id>/<weights|sampler_weights>/<name>`` -> its three parts."""
    if not path.startswith("tinker://"):
        raise TinkerRequestError(f"{field_name} {path!r}: a checkpoint path is tinker://<model_id>/weights/<name> "
                                 "or tinker://<model_id>/sampler_weights/<name>", field=field_name)
    parts = path[len("tinker://"):].split("/")
    if len(parts) != 3 or parts[1] not in ("weights", "sampler_weights"):
        raise TinkerRequestError(f"{field_name} {path!r}: expected tinker://<model_id>/weights/<name> or "
                                 "tinker://<model_id>/sampler_weights/<name>", field=field_name)
    return parts[0], parts[1], checked_name(parts[2], field_name)


class TinkerService:
    def __init__(self, settings: ServiceSettings):
        from transformers import AutoConfig

        self.settings = settings
        self.base_folder = str(Path(settings.base_model).resolve())
        config = AutoConfig.from_pretrained(self.base_folder)
        self.vocab_size = int(config.vocab_size)
        self.max_model_len = int(settings.max_model_len or config.max_position_embeddings)
        self.arch = str(config.model_type)
        settings.root.mkdir(parents=True, exist_ok=True)
        self.futures = FutureTable()
        self.sessions: dict[str, Session] = {}
        self.models: dict[str, Model] = {}
        self.sampling: dict[str, SamplingSession] = {}
        self._lock = threading.Lock()
        self._train = ThreadPoolExecutor(1, thread_name_prefix="tinker-train")
        self._samples: queue.Queue = queue.Queue()
        self._sampling_thread = threading.Thread(target=self._sample_loop, name="tinker-sample", daemon=True)
        self._sampling_thread.start()
        self.sampler = SnapshotSampler(SamplerSettings(base_model=self.base_folder, max_model_len=self.max_model_len,
                                                       max_lora_rank=settings.max_lora_rank,
                                                       kv_cache_mb=settings.kv_cache_mb, seed=settings.seed,
                                                       adapters=settings.sample_adapters))

    def close(self) -> None:
        self._train.shutdown(wait=True, cancel_futures=True)
        for model in self.models.values():
            model.log.close()
        self._samples.put(None)
        self._sampling_thread.join(timeout=30)

    def _sample_loop(self) -> None:
        """Sample requests as they come, every request queued meanwhile in the same engine call (the cookbook sends
        a batch's prompts as concurrent one-sample requests: one at a time, SmolLM2 spent 63 of its 76 s a step
        sampling). A batch that fails is retried one request at a time, so an error stays with its request."""
        while True:
            first = self._samples.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < SAMPLE_BATCH:
                try:
                    item = self._samples.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._samples.put(None)
                    break
                batch.append(item)
            try:
                results = self.sampler.sample_many([(snapshot, call) for _, snapshot, call in batch])
            except Exception:  # noqa: BLE001 - one bad request must not fail the others: each alone below
                for request_id, snapshot, call in batch:
                    self.futures.run(request_id, lambda s=snapshot, c=call: _sampled(self.sampler.sample(s, c)),
                                     _failure)
                continue
            for (request_id, _, _), result in zip(batch, results):
                self.futures.settle(request_id, _sampled(result))

    # ------------------------------------------------------------------------------------------- helpers
    def _submit(self, pool: ThreadPoolExecutor, work: Callable[[], Outcome]) -> str:
        request_id = self.futures.open()
        pool.submit(self.futures.run, request_id, work, _failure)
        return request_id

    def _model(self, model_id: str, field_name: str = "model_id") -> Model:
        model = self.models.get(model_id)
        if model is None:
            raise not_found("training model", model_id, field_name)
        return model

    def _session(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            raise not_found("session", session_id, "session_id")
        if session.finished:
            raise TinkerRequestError(f"session {session_id} was finished ({session.finished})", field="session_id",
                                     status=410)
        return session

    def _ordered(self, model: Model, seq_id: int | None, work: Callable[[], Outcome]) -> str:
        """Queue ``work`` on the training thread; a ``seq_id`` seen before returns the first request's id."""
        with self._lock:
            if seq_id is not None and seq_id in model.seen:
                return model.seen[seq_id]
            request_id = self._submit(self._train, work)
            if seq_id is not None:
                model.seen[seq_id] = request_id
            return request_id

    def _base_name(self, base_model: str | None, field_name: str = "base_model") -> str:
        if base_model is None:
            return self.base_folder
        served = {self.base_folder, os.path.basename(self.base_folder)}
        if base_model in served or (os.path.isdir(base_model) and
                                    Path(base_model).resolve() == Path(self.base_folder)):
            return base_model
        raise TinkerRequestError(f"{field_name} {base_model!r}: this server trains {self.base_folder} (send that "
                                 f"path or {os.path.basename(self.base_folder)!r})", field=field_name)

    def _model_dir(self, model_id: str, field_name: str = "model_id") -> Path:
        return checkpoints.model_folder(self.settings.root, model_id, field_name)

    def _new_model(self, model_id: str, base_name: str, trainee: Trainee) -> Model:
        folder = self._model_dir(model_id)
        settings = SinkSettings(self.settings.metric_sinks, self.settings.project, folder.name,
                                {**asdict(trainee.spec), "base_model": self.base_folder, "model_id": model_id})
        log = StepLog(settings, RunStore(str(folder.parent), folder.name), next_step=trainee.step + 1)
        return Model(model_id, base_name, trainee, log)

    def _record(self, model_id: str, row: dict) -> None:
        folder = self._model_dir(model_id)
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "requests.jsonl", "a") as fh:
            fh.write(json.dumps({"time": round(time.time(), 3), **row}) + "\n")

    # ------------------------------------------------------------------------------------------- sessions
    def create_session(self, user_metadata: dict | None = None, display_name: str | None = None) -> dict:
        _check_session_labels(user_metadata or {}, display_name)
        session_id = f"s-{secrets.token_hex(4)}"
        now = time.time()
        self.sessions[session_id] = Session(session_id, now, now, user_metadata=user_metadata,
                                            display_name=display_name)
        return {"session_id": session_id, "type": "create_session",
                "info_message": f"grpo training service: base model {self.base_folder}"}

    def list_sessions(self, limit: str = "20", offset: str = "0", access_scope: str = "owned") -> dict:
        """This server's sessions since it started (finished ones too), the newest first, a page of them. One key
        opens the server, so every session is the caller's: both access scopes list the same."""
        _scope(access_scope)
        newest = sorted(self.sessions.values(), key=lambda s: s.created, reverse=True)
        return checkpoints.paged([s.session_id for s in newest], "sessions", limit, offset)

    def session_info(self, session_id: str, access_scope: str = "owned") -> dict:
        """The training runs and sampling sessions a session made (its ids prefix theirs), and its metadata."""
        _scope(access_scope)
        session = self.sessions.get(session_id)
        if session is None:
            raise not_found("session", session_id, "session_id")
        mine = f"{session_id}:"
        return {"training_run_ids": sorted(m for m in self.models if m.startswith(mine)),
                "sampler_ids": sorted(s for s in self.sampling if s.startswith(mine)),
                "user_metadata": session.user_metadata, "display_name": session.display_name}

    def heartbeat(self, session_id: str) -> dict:
        self._session(session_id).heartbeat = time.time()
        return {"type": "session_heartbeat"}

    def finish(self, session_id: str, reason: str) -> dict:
        session = self.sessions.get(session_id)
        if session is None:
            raise not_found("session", session_id, "session_id")
        session.finished = reason or "finished"
        return {}

    # ------------------------------------------------------------------------------------------- models
    def create_model(self, session_id: str, model_seq_id: int, base_model: str, lora: Any | None,
                     optimizer_type: str) -> str:
        self._session(session_id)
        base_name = self._base_name(base_model)
        if optimizer_type != "adamw":
            raise TinkerRequestError(f"optimizer_config.type {optimizer_type!r}: this server trains with adamw",
                                     field="optimizer_config.type")
        rank = 0 if lora is None else int(lora.rank)
        if not 0 <= rank <= self.settings.max_lora_rank:
            raise TinkerRequestError(f"lora_config.rank {rank}: this server takes 1 to {self.settings.max_lora_rank} "
                                     "(or 0 for full fine-tuning)", field="lora_config.rank")
        seed = secrets.randbits(31) if lora is None or lora.seed is None else int(lora.seed)
        if not 0 <= seed < 2**63:
            raise TinkerRequestError(f"lora_config.seed {seed}: 0 <= seed < 2**63", field="lora_config.seed")
        spec = TraineeSpec(base_model=self.base_folder, lora_rank=rank, seed=seed,
                           train_attn=True if lora is None else bool(lora.train_attn),
                           train_mlp=True if lora is None else bool(lora.train_mlp))
        model_id = f"{session_id}:train:{model_seq_id}"
        if model_id in self.models:
            raise TinkerRequestError(f"model {model_id} exists already (model_seq_id {model_seq_id} reused)",
                                     field="model_seq_id")

        def work() -> Outcome:
            self.models[model_id] = self._new_model(model_id, base_name, Trainee(spec))
            return Outcome(json={"model_id": model_id, "type": "create_model"})
        return self._submit(self._train, work)

    def get_info(self, model_id: str) -> dict:
        model = self._model(model_id)
        rank = model.trainee.spec.lora_rank
        return {"model_id": model_id, "type": "get_info", "model_name": model.base_name,
                "model_data": {"arch": self.arch, "model_name": model.base_name, "tokenizer_id": self.base_folder},
                "is_lora": rank > 0, "lora_rank": rank if rank else None}

    def forward_backward(self, call: ForwardBackwardCall) -> str:
        model = self._model(call.model_id)
        model.trainee.check(call)  # refused at the door, before it is queued

        def work() -> Outcome:
            outputs, metrics = model.trainee.forward_backward(call)
            tokens = sum(d.length for d in call.data)
            if not call.forward_only:
                model.log.forward_backward(metrics, len(call.data), tokens)
            self._record(call.model_id, {"op": "forward" if call.forward_only else "forward_backward",
                                         "seq_id": call.seq_id, "loss_fn": call.loss_fn, "datums": len(call.data),
                                         "tokens": tokens, "metrics": metrics})
            return Outcome(proto=forward_backward_output(outputs, len(call.data), metrics))
        return self._ordered(model, call.seq_id, work)

    def optim_step(self, model_id: str, seq_id: int | None, adam: AdamStep) -> str:
        model = self._model(model_id)

        def work() -> Outcome:
            metrics = model.trainee.optim_step(adam)
            row = {"op": "optim_step", "seq_id": seq_id, "adam": adam.__dict__, "metrics": metrics}
            try:
                model.log.optim_step(metrics)
            except Exception as exc:  # noqa: BLE001 - the step is taken: its answer must say so; the row keeps why
                row["metric_sinks_error"] = repr(exc)
                print(f"{model_id}: step {int(metrics['step'])} not logged to the metric sinks: {exc!r}",
                      file=sys.stderr, flush=True)
            self._record(model_id, row)
            return Outcome(json={"type": "optim_step", "metrics": metrics})
        return self._ordered(model, seq_id, work)

    # ------------------------------------------------------------------------------------------- checkpoints
    def save_state(self, model_id: str, seq_id: int | None, name: str | None, overwrite: bool) -> str:
        model = self._model(model_id)
        name = checked_name(name, "path") if name else f"step-{time.time_ns()}"
        folder = self._model_dir(model_id) / "weights" / name
        if folder.exists() and not overwrite:
            raise TinkerRequestError(f"path {name!r}: a checkpoint of that name exists (overwrite: true replaces it)",
                                     field="path")

        def work() -> Outcome:
            model.trainee.save_state(folder, {"model_id": model_id, "base_model": model.base_name})
            return Outcome(json={"path": f"tinker://{model_id}/weights/{name}", "type": "save_weights"})
        return self._ordered(model, seq_id, work)

    def _checkpoint(self, path: str) -> tuple[Path, dict]:
        model_id, kind, name = parse_tinker_path(path)
        if kind != "weights":
            raise TinkerRequestError(f"path {path!r}: a sampler checkpoint holds no optimizer state; load_state takes "
                                     "tinker://<model_id>/weights/<name>", field="path")
        folder = self._model_dir(model_id, "path") / "weights" / name
        if not folder.is_dir():
            raise TinkerRequestError(f"path {path!r}: no such checkpoint on this server", field="path", status=404)
        return folder, read_state(folder)

    def load_state(self, model_id: str, seq_id: int | None, path: str, with_optimizer: bool) -> str:
        model = self._model(model_id)
        folder, _ = self._checkpoint(path)

        def work() -> Outcome:
            model.trainee.load_state(folder, with_optimizer)
            model.log.restart(next_step=model.trainee.step + 1)
            return Outcome(json={"path": path, "model_id": model_id, "type": "load_weights"})
        return self._ordered(model, seq_id, work)

    def create_from_state(self, session_id: str, model_seq_id: int, path: str, with_optimizer: bool,
                          base_model: str | None) -> str:
        """A new training model made from a checkpoint (its base, LoRA rank and targets, seed), then loaded."""
        self._session(session_id)
        folder, record = self._checkpoint(path)
        spec = TraineeSpec(**{**record["spec"], "base_model": self.base_folder})
        base_name = self._base_name(base_model if base_model is not None else record.get("base_model"))
        model_id = f"{session_id}:train:{model_seq_id}"
        if model_id in self.models:
            raise TinkerRequestError(f"model {model_id} exists already (model_seq_id {model_seq_id} reused)",
                                     field="model_seq_id")

        def work() -> Outcome:
            trainee = Trainee(spec)
            trainee.load_state(folder, with_optimizer)
            self.models[model_id] = self._new_model(model_id, base_name, trainee)
            return Outcome(json={"path": path, "model_id": model_id, "type": "load_weights"})
        return self._submit(self._train, work)

    def save_for_sampler(self, model_id: str, seq_id: int | None, name: str | None,
                         sampling_session_seq_id: int | None) -> str:
        """A sampler checkpoint: named (``path``: kept, tinker://<model>/sampler_weights/<name>) or for a sampling
        session at once (``sampling_session_seq_id``: an ephemeral snapshot; the newest few per model are kept)."""
        model = self._model(model_id)
        if name is None and sampling_session_seq_id is None:
            raise TinkerRequestError("path or sampling_session_seq_id is needed", field="path")
        session_id = model_id.split(":")[0]
        if name is not None:
            name = checked_name(name, "path")
        else:
            name = f"ephemeral-{sampling_session_seq_id}-{time.time_ns()}"
        folder = self._model_dir(model_id) / "sampler_weights" / name

        def work() -> Outcome:
            model.trainee.export_for_sampler(folder)
            snapshot = Snapshot(kind="adapter" if model.trainee.spec.lora_rank else "full", folder=str(folder))
            if sampling_session_seq_id is None:
                return Outcome(json={"path": f"tinker://{model_id}/sampler_weights/{name}",
                                     "type": "save_weights_for_sampler"})
            sampling_id = f"{session_id}:sample:{sampling_session_seq_id}"
            self.sampling[sampling_id] = SamplingSession(sampling_id, model.base_name, snapshot, None)
            self._forget_ephemeral(model, folder)
            return Outcome(json={"sampling_session_id": sampling_id, "type": "save_weights_for_sampler"})
        return self._ordered(model, seq_id, work)

    def _forget_ephemeral(self, model: Model, folder: Path) -> None:
        import shutil

        model.ephemeral.append(folder)
        while len(model.ephemeral) > EPHEMERAL_KEPT:
            old = model.ephemeral.pop(0)
            self.sampling = {k: s for k, s in self.sampling.items() if s.snapshot.folder != str(old)}
            shutil.rmtree(old, ignore_errors=True)

    # ------------------------------------------------------------------------------- checkpoint routes (RestClient)
    def list_checkpoints(self, model_id: str) -> dict:
        found = checkpoints.list_checkpoints(self.settings.root, model_id, live=model_id in self.models)
        return {"checkpoints": found, "cursor": None}

    def delete_checkpoint(self, model_id: str, checkpoint_id: str) -> dict:
        """Refused while a sampling session reads it; else deleted on the training thread, after every request
        queued before it (a load_state of it, say)."""
        folder = checkpoints.checkpoint_folder(self.settings.root, model_id, checkpoint_id)
        readers = sorted(s.sampling_session_id for s in self.sampling.values() if s.snapshot.folder == str(folder))
        if readers:
            raise TinkerRequestError(f"checkpoint {checkpoint_id} of {model_id} is read by sampling session "
                                     f"{readers[0]}; it can be deleted once no session samples it",
                                     field="checkpoint_id")  # 409 would be retried by the SDK
        self._train.submit(checkpoints.delete, folder).result()
        return {}

    def training_run(self, model_id: str) -> dict:
        model = self.models.get(model_id)
        return checkpoints.training_run(self.settings.root, model_id,
                                        model.base_name if model else self.base_folder,
                                        model.trainee.spec.lora_rank if model else None,
                                        model.created if model else 0.0)

    def list_user_checkpoints(self, limit: str = "100", offset: str = "0") -> dict:
        return checkpoints.every_checkpoint(self.settings.root, list(self.models), limit, offset)

    def weights_info(self, path: str) -> dict:
        """``get_weights_info_by_tinker_path``: a checkpoint's base model and what it trains (a training client made
        from it trains the same)."""
        model_id, kind, name = parse_tinker_path(path, "tinker_path")
        folder = checkpoints.checkpoint_folder(self.settings.root, model_id, f"{kind}/{name}")
        model = self.models.get(model_id)
        return checkpoints.weights_info(folder, model.base_name if model else self.base_folder)

    def list_training_runs(self, limit: str = "20", offset: str = "0") -> dict:
        """Every training client with a folder here or alive now, the most recently active first, a page of them."""
        ids = sorted(set(checkpoints.run_ids(self.settings.root)) | set(self.models))
        runs = sorted((self.training_run(i) for i in ids), key=lambda r: r["last_request_time"], reverse=True)
        return checkpoints.paged(runs, "training_runs", limit, offset)

    # ------------------------------------------------------------------------------------------- sampling
    def create_sampling_session(self, session_id: str, seq_id: int, base_model: str | None,
                                model_path: str | None) -> dict:
        self._session(session_id)
        if (base_model is None) == (model_path is None):
            raise TinkerRequestError("exactly one of base_model and model_path", field="model_path")
        sampling_id = f"{session_id}:sample:{seq_id}"
        if model_path is None:
            self.sampling[sampling_id] = SamplingSession(sampling_id, self._base_name(base_model),
                                                         Snapshot(kind="base"), None)
        else:
            self.sampling[sampling_id] = self._sampler_checkpoint(sampling_id, model_path)
        return {"sampling_session_id": sampling_id, "type": "create_sampling_session"}

    def _sampler_checkpoint(self, sampling_id: str, path: str) -> SamplingSession:
        model_id, kind, name = parse_tinker_path(path, "model_path")
        if kind != "sampler_weights":
            raise TinkerRequestError(f"model_path {path!r}: sampling reads tinker://<model>/sampler_weights/<name>",
                                     field="model_path")
        folder = self._model_dir(model_id, "model_path") / "sampler_weights" / name
        if not folder.is_dir():
            raise TinkerRequestError(f"model_path {path!r}: no such sampler checkpoint on this server",
                                     field="model_path", status=404)
        adapter = (folder / "adapter_config.json").is_file()
        model = self.models.get(model_id)
        base_name = model.base_name if model else self.base_folder
        return SamplingSession(sampling_id, base_name, Snapshot(kind="adapter" if adapter else "full",
                                                                folder=str(folder)), path)

    def sampler_info(self, sampling_id: str) -> dict:
        session = self.sampling.get(sampling_id)
        if session is None:
            raise not_found("sampling session", sampling_id, "sampler_id")
        return {"sampler_id": sampling_id, "base_model": session.base_name, "model_path": session.model_path}

    def sample(self, sampling_id: str | None, seq_id: int | None, model_path: str | None, base_model: str | None,
               call: SampleCall) -> tuple[str, list[str]]:
        """-> (request id, one sequence id per sample)."""
        if sampling_id is not None:
            session = self.sampling.get(sampling_id)
            if session is None:
                raise not_found("sampling session", sampling_id, "sampling_session_id")
        elif model_path is not None:
            session = self._sampler_checkpoint(f"path:{model_path}", model_path)
        else:
            session = SamplingSession("base", self._base_name(base_model), Snapshot(kind="base"), None)
        check_sample_call(call, self.vocab_size, self.max_model_len)

        request_id = self.futures.open()
        self._samples.put((request_id, session.snapshot, call))
        prefix = f"{sampling_id or session.sampling_session_id}:{seq_id if seq_id is not None else request_id}"
        return request_id, [f"{prefix}:{i}" for i in range(call.num_samples)]


def _sampled(result: SampleResult) -> Outcome:
    return Outcome(proto=sample_response(result.sequences, result.prompt_logprobs, result.topk_prompt))


def _failure(exc: Exception) -> Outcome:
    if isinstance(exc, TinkerRequestError):
        return Outcome(error=str(exc), category=exc.category)
    import logging

    logging.getLogger(__name__).exception("a Tinker request failed")
    return Outcome(error=f"the server failed: {type(exc).__name__}: {exc}", category="server")
