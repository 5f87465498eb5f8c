"""The ``files`` transport: learner rank 0 writes each version to the run store, the samplers load it from there.

``weights/v-000042/`` holds the policy in HF format (safetensors + config; with LoRA the peft adapter alone),
``READY`` written last. It reaches every sampler that can read the run store, on any host: a `grpo serve` server
reads the folder itself. Versions no sampler serves any more are deleted when the next one is published.

It is also how a new sampler catches up, whatever the run's transport: a sampler that replaces a dead one, or one
added by `grpo scale`, loads the current version from here before it serves (``grpo_core.cluster.engines``).
"""
from __future__ import annotations

import os
import tempfile
import time

from grpo_core.lifecycle.model.adapter_files import ADAPTER_FILES, is_adapter_dir
from grpo_core.weights.transport import Ends, Published, Transport

# weights/v-000042/: the published versions; READY is written last.
PUBLISHED = "weights"
READY = "READY"


def published_path(version: int) -> str:
    return f"{PUBLISHED}/v-{version:06d}"


def serve_folder(sampler, folder: str, version: int) -> float:
    """A local policy folder into a sampler: a peft adapter (``adapter_config.json``: LoRA) or full weights.
    Returns the seconds it took."""
    if is_adapter_dir(folder):
        return sampler.load_adapter(folder, version)
    return sampler.load_weights_from_dir(folder, version)


class FilesTransport(Transport):
    kind = "files"

    def publish(self, ends: Ends, keep_versions: list[int]) -> Published | None:
        """Rank 0 writes the current weights to ``weights/v-N/`` unless already there, and deletes the published
        versions no sampler still needs (the other ranks only join ZeRO-3's gather)."""
        from grpo_core.run.checkpoint import CheckpointWriter

        if ends.joins_gather_only():
            return None
        started = time.perf_counter()
        store, version = ends.store, ends.learner.version
        rel = published_path(version)
        wrote = False
        if not store.exists(f"{rel}/{READY}"):
            CheckpointWriter(store, rel, ends.learner.hf_snapshot(),
                             retry_delays=ends.cfg.storage.retry_delays).start().result(wait=True)
            store.put_bytes(f"{rel}/{READY}", str(version).encode())
            wrote = True
        keep = {published_path(v).rsplit("/", 1)[-1] for v in keep_versions if v is not None}
        keep.add(rel.rsplit("/", 1)[-1])
        for name in store.list_dirs(PUBLISHED):
            if name not in keep:
                store.delete(f"{PUBLISHED}/{name}")
        return Published(version=version, seconds=time.perf_counter() - started, wrote=wrote)

    def receive(self, ends: Ends, version: int) -> None:
        """Load ``weights/v-N/``: from the local folder, a temporary copy of a remote store, or (a server) by the
        server itself."""
        store, rel = ends.store, published_path(version)
        local = store.local_path(rel)
        if ends.cfg.placement.samplers_are_servers:
            self._server_load(ends, rel, local, version)
        elif local is not None:
            serve_folder(ends.sampler, local, version)
        else:
            with tempfile.TemporaryDirectory(prefix="grpo-weights-") as tmp:
                for name in store.list_files(rel):
                    if name.endswith(".safetensors") or name in ADAPTER_FILES:
                        store.get_file(f"{rel}/{name}", os.path.join(tmp, name))
                serve_folder(ends.sampler, tmp, version)  # a LoRA adapter is read while loading: the copy may go

    @staticmethod
    def _server_load(ends: Ends, rel: str, local: str | None, version: int) -> None:
        """External placement: the server reads the published version from the run store itself (it may run on
        another host; the store is the one thing both sides reach)."""
        if ends.cfg.model.lora is not None:
            if local is None:
                raise ValueError(f"model.lora with cluster.placement=external: vLLM servers load adapters from a "
                                 f"path, but the run store is {ends.store.url(rel)}; use a storage.root on a "
                                 "filesystem the servers can read")
            ends.sampler.load_adapter(local, version)
        else:
            ends.sampler.load_from_store(local or ends.store.url(rel), ends.cfg.storage.options, version)
