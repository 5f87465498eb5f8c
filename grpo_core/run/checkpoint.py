"""Checkpoints of a run: layout, the background writer, the commit, discovery and pruning.

Why: a run that dies must cost at most the iterations since its last checkpoint (DESIGN.md, "Resume"). A
checkpoint is the state after an iteration's sync, in one folder of the run store::

    checkpoints/iter-000009/
      model.safetensors, config.json, generation_config.json, tokenizer files   the policy, loadable as is
      learner/mp_rank_00_model_states.pt, learner/zero_pp_rank_0_..._optim_states.pt
                                                   DeepSpeed's own checkpoint (optimizer, lr scheduler, engine)
      learner/rng-rank-0.pt                        RNG states of each learner rank
      state.json                                   iteration, policy version, what the loop needs to go on
      MANIFEST.json                                written LAST: every file with its size and sha256
    latest.json                                    then this, pointing at the newest committed checkpoint

With LoRA (``model.lora``) the policy is the peft adapter (``adapter_model.safetensors`` + ``adapter_config.json``,
loadable with ``PeftModel.from_pretrained`` on ``model.path``) and DeepSpeed's module states hold only the adapter:
the frozen base is ``model.path`` itself.

Writing is split so that training stalls only for the copy of the state in memory: the learner clones its
state (``Snapshot``), a ``CheckpointWriter`` thread serialises and uploads it, and the flow commits it (manifest,
then ``latest.json``, then pruning) once the upload is done. A checkpoint without a manifest does not exist.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import fsspec

from grpo_core.run.storage import RunStore, StorageError, is_transient_io_error

CHECKPOINTS = "checkpoints"
LATEST = "latest.json"
MANIFEST = "MANIFEST.json"
STATE = "state.json"
_DIR = re.compile(r"^iter-(\d{6,})$")


def checkpoint_path(iteration: int) -> str:
    """Run-relative folder of the checkpoint taken after ``iteration``."""
    return f"{CHECKPOINTS}/iter-{iteration:06d}"


@dataclass(frozen=True)
class CheckpointRef:
    """A committed checkpoint: the state after ``iteration`` (its sync), at ``policy_version``."""

    iteration: int
    policy_version: int
    path: str

    @property
    def next_iteration(self) -> int:
        return self.iteration + 1

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


# ------------------------------------------------------------------------------------------- writing

@dataclass
class Snapshot:
    """A checkpoint's content held in memory: run-relative file names -> writers of that file.

    Each writer takes the local path to write; the payload it closes over was copied when the snapshot was taken,
    so training may go on while the writer runs."""

    files: dict[str, Callable[[str], None]] = field(default_factory=dict)

    def add_bytes(self, name: str, data: bytes) -> None:
        def write(path: str) -> None:
            with open(path, "wb") as fh:
                fh.write(data)
        self.files[name] = write

    def add_json(self, name: str, obj: Any) -> None:
        self.add_bytes(name, json.dumps(obj, indent=1, sort_keys=True).encode())

    def add_torch(self, name: str, obj: Any) -> None:
        import torch

        self.files[name] = lambda path: torch.save(obj, path)

    def add_safetensors(self, name: str, tensors: dict, metadata: dict[str, str] | None = None) -> None:
        from safetensors.torch import save_file

        self.files[name] = lambda path: save_file(tensors, path, metadata=metadata or {"format": "pt"})

    def update(self, other: "Snapshot", prefix: str = "") -> None:
        for name, write in other.files.items():
            self.files[prefix + name] = write


def sha256_file(path: str, storage_options: dict | None = None) -> str:
    """The hex sha256 of a file (a local path or an fsspec URL), read in 4 MiB blocks."""
    digest = hashlib.sha256()
    with fsspec.open(path, "rb", **(storage_options or {})) as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


class CheckpointWriter:
    """Writes a snapshot into ``folder`` of the run store on a background thread.

    On a local run folder the files are written in place (the folder is not a checkpoint until its manifest is
    committed); on object storage they are written to a local temp folder and uploaded. ``result()`` is None while
    the thread runs, the files' ``{name: {"bytes", "sha256"}}`` when done, and raises what the thread raised."""

    def __init__(self, store: RunStore, folder: str, snapshot: Snapshot, snapshot_seconds: float = 0.0,
                 retry_delays: list[float] | tuple[float, ...] = ()):
        self.store, self.folder, self.snapshot = store, folder, snapshot
        self.snapshot_seconds = snapshot_seconds
        self.retry_delays = list(retry_delays)  # waits before re-trying an upload the store did not answer
        self._files: dict[str, dict[str, Any]] | None = None
        self._error: BaseException | None = None
        self._write_seconds = 0.0
        self._thread = threading.Thread(target=self._run, name=f"checkpoint-writer-{folder}", daemon=True)

    def start(self) -> "CheckpointWriter":
        self._thread.start()
        return self

    def _run(self) -> None:
        started = time.perf_counter()
        try:
            local = self.store.local_path(self.folder)
            tmp = None if local else tempfile.mkdtemp(prefix="grpo-ckpt-")
            base = local or tmp
            try:
                files: dict[str, dict[str, Any]] = {}
                for name, write in sorted(self.snapshot.files.items()):
                    path = os.path.join(base, name)
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    write(path)
                    files[name] = {"bytes": os.path.getsize(path), "sha256": sha256_file(path)}
                    if tmp is not None:
                        self._upload(f"{self.folder}/{name}", path)
                self._files = files
            finally:
                if tmp is not None:
                    shutil.rmtree(tmp, ignore_errors=True)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller of result()
            self._error = exc
        finally:
            self.snapshot = Snapshot()  # release the in-memory copy
            self._write_seconds = time.perf_counter() - started

    def _upload(self, rel: str, path: str) -> None:
        for delay in [*self.retry_delays, None]:
            try:
                self.store.put_file(rel, path)
                return
            except Exception as exc:  # noqa: BLE001 - only transient storage errors are retried
                if delay is None or not is_transient_io_error(exc):
                    raise
                time.sleep(delay)

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, wait: bool = False) -> "WrittenFiles | None":
        if wait:
            self._thread.join()
        if self._thread.is_alive():
            return None
        if self._error is not None:
            raise RuntimeError(f"writing checkpoint {self.store.url(self.folder)} failed: {self._error!r}") \
                from self._error
        assert self._files is not None
        return WrittenFiles(self._files, sum(f["bytes"] for f in self._files.values()), self._write_seconds)


@dataclass(frozen=True)
class WrittenFiles:
    """What a writer wrote: ``{name: {"bytes", "sha256"}}``, their total bytes and the write's seconds."""
    files: dict[str, dict[str, Any]]
    bytes: int
    write_seconds: float

    @classmethod
    def merge(cls, parts: list["WrittenFiles"]) -> "WrittenFiles":
        """Every learner rank's files of one checkpoint (the slowest rank's seconds)."""
        return cls({name: rec for p in parts for name, rec in p.files.items()}, sum(p.bytes for p in parts),
                   max(p.write_seconds for p in parts))


@dataclass
class PendingCheckpoint:
    """A checkpoint between its snapshot and its commit: the one object that knows which ranks have written their
    files (``ranks``), what the flow wrote itself into the same folder (``flow_files``: the difficulty pool), and
    commits it once all are there. Dropped, never committed, when its writers died with their actors."""
    iteration: int
    policy_version: int
    snapshot_seconds: float
    ranks: list[WrittenFiles | None]
    flow_files: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def waiting_for(self) -> list[int]:
        """The learner ranks whose files are still being written."""
        return [r for r, done in enumerate(self.ranks) if done is None]

    @property
    def written(self) -> WrittenFiles | None:
        """Every rank's files merged, once all are written."""
        return None if self.waiting_for else WrittenFiles.merge(self.ranks)

    def commit(self, store: RunStore, keep_last: int) -> "CommittedCheckpoint":
        written = self.written
        if written is None:
            raise RuntimeError(f"checkpoint of iteration {self.iteration}: learner rank(s) {self.waiting_for} are "
                               "still writing; it cannot be committed yet")
        ref = commit(store, self.iteration, self.policy_version, {**written.files, **self.flow_files}, keep_last)
        return CommittedCheckpoint(ref, written.bytes, self.snapshot_seconds, written.write_seconds)


@dataclass(frozen=True)
class CommittedCheckpoint:
    ref: "CheckpointRef"
    bytes: int
    snapshot_seconds: float
    write_seconds: float


# ------------------------------------------------------------------------------------------- commit

def commit(store: RunStore, iteration: int, policy_version: int, files: dict[str, dict[str, Any]],
           keep_last: int) -> CheckpointRef:
    """Make a written checkpoint count: its manifest (after checking every file is there with its size), then
    ``latest.json``, then prune older checkpoints beyond ``keep_last``."""
    path = checkpoint_path(iteration)
    present = store.list_files(path)
    for name, rec in files.items():
        if present.get(name) != rec["bytes"]:
            raise StorageError(f"{store.url(path)}/{name}: expected {rec['bytes']} bytes, found "
                               f"{present.get(name)}; the checkpoint is not committed")
    manifest = {"iteration": iteration, "policy_version": policy_version, "files": files,
                "committed_at": time.time()}
    store.put_json_file(f"{path}/{MANIFEST}", manifest)
    ref = CheckpointRef(iteration=iteration, policy_version=policy_version, path=path)
    store.put_json_file(LATEST, {"checkpoint": path, "iteration": iteration, "policy_version": policy_version})
    prune(store, keep_last, ref)
    return ref


def _read_manifest(store: RunStore, path: str) -> dict | None:
    try:
        doc = store.get_json_file(f"{path}/{MANIFEST}")
    except StorageError:
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("files"), dict) else None


def _complete(store: RunStore, path: str) -> CheckpointRef | None:
    """The checkpoint at ``path`` if its manifest exists and every file it lists is there with its size."""
    doc = _read_manifest(store, path)
    if doc is None:
        return None
    present = store.list_files(path)
    if any(present.get(name) != rec.get("bytes") for name, rec in doc["files"].items()):
        return None
    return CheckpointRef(iteration=int(doc["iteration"]), policy_version=int(doc["policy_version"]), path=path)


def complete_checkpoints(store: RunStore) -> list[CheckpointRef]:
    """Every committed, intact checkpoint, oldest first."""
    refs = []
    for name in store.list_dirs(CHECKPOINTS):
        if _DIR.match(name) and (ref := _complete(store, f"{CHECKPOINTS}/{name}")) is not None:
            refs.append(ref)
    return sorted(refs, key=lambda r: r.iteration)


def latest(store: RunStore) -> CheckpointRef | None:
    """The checkpoint to resume from: the one ``latest.json`` names when it is intact, else the newest intact one
    (a checkpoint killed mid-write has no manifest and is never chosen)."""
    pointer = store.get_json_file(LATEST)
    if isinstance(pointer, dict) and isinstance(pointer.get("checkpoint"), str):
        ref = _complete(store, pointer["checkpoint"])
        if ref is not None:
            return ref
    refs = complete_checkpoints(store)
    return refs[-1] if refs else None


def prune(store: RunStore, keep_last: int, newest: CheckpointRef) -> list[str]:
    """Delete checkpoints older than the ``keep_last`` newest committed ones, and leftovers of interrupted writes
    older than ``newest``. Folders newer than ``newest`` (a write in progress) are left alone."""
    removed = []
    committed = [r for r in complete_checkpoints(store) if r.iteration <= newest.iteration]
    keep = {r.path for r in (committed[-keep_last:] if keep_last > 0 else committed)} | {newest.path}
    for name in store.list_dirs(CHECKPOINTS):
        m = _DIR.match(name)
        path = f"{CHECKPOINTS}/{name}"
        if m and int(m.group(1)) < newest.iteration and path not in keep:
            store.delete(path)
            removed.append(path)
    return removed


def files_of_rank(rank: int) -> Callable[[str], bool]:
    """Which checkpoint files learner rank ``rank`` needs to restore: its own ZeRO partition and RNG states, the
    shared module states and state.json (not the other ranks' partitions, nor the HF copy of the policy); PPO's
    critic's beside the policy's (``critic/``)."""
    def wanted(name: str) -> bool:
        base = name.rsplit("/", 1)[-1]
        return name == STATE or (name.startswith(("learner/", "critic/")) and (
            base == "mp_rank_00_model_states.pt" or f"_rank_{rank}_" in base or base == f"rng-rank-{rank}.pt"))
    return wanted


def download(store: RunStore, ref: CheckpointRef, local_dir: str,
             only: Callable[[str], bool] | None = None) -> str:
    """A local folder holding the checkpoint's files (those ``only`` accepts): the folder itself on a local run
    store, else a copy in ``local_dir``."""
    local = store.local_path(ref.path)
    if local is not None:
        return local
    for name in store.list_files(ref.path):
        if only is None or only(name):
            store.get_file(f"{ref.path}/{name}", os.path.join(local_dir, name))
    return local_dir


def read_state(folder: str) -> dict[str, Any]:
    with open(os.path.join(folder, STATE)) as fh:
        return json.load(fh)

