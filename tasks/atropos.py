"""The run as an Atropos trainer (``atropos`` in the config): the API server and environments start once the policy
endpoint serves; before each iteration takes its inbox, ``pull_atropos`` pulls the groups it still needs from
``/batch`` into the inbox (one item per group), refusing the unusable ones into ``inbox/rejected/`` with the reason.
The iteration then takes them like any inbox group (the staleness rule, the off-policy corrections, exactly once
across a resume: ``tasks/inbox.py``) and samples no prompt of its own.
"""
from __future__ import annotations

import io
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from prefect import task
from prefect.cache_policies import NONE

from grpo_core.atropos.client import AtroposClient, Registration
from grpo_core.atropos.groups import GroupLimits, GroupRefused
from grpo_core.atropos.source import AtroposSource, PullStats
from grpo_core.child_process import ChildProcess
from grpo_core.netaddr import free_port
from grpo_core.pipeline.inbox import INBOX, READY_SUFFIX, REJECTED, ready_items
from grpo_core.storage import RunStore
from tasks.context import RunContext
from tasks.inbox import INBOX_FILE
from tasks.results import PullResult

ATROPOS_FILE = "atropos.json"
ITEM_PREFIX = "atropos"


def _log_dir(store: RunStore) -> Path:
    """The processes' logs: in the run folder when it is local, else a temporary folder (named in atropos.json)."""
    local = store.local_path("atropos")
    return Path(local) if local is not None else Path(tempfile.mkdtemp(prefix="grpo-atropos-"))


def _filled(command: list[str], values: dict[str, str]) -> list[str]:
    """The command with the known ``{name}`` placeholders filled; other braces are left as they are."""
    out = []
    for arg in command:
        for name, value in values.items():
            arg = arg.replace("{" + name + "}", value)
        out.append(arg)
    return out


def open_atropos(ctx: RunContext, first_iteration: int) -> AtroposSource:
    from transformers import AutoConfig, AutoTokenizer

    cfg, a, store = ctx.cfg, ctx.cfg.atropos, ctx.store
    endpoint = ctx.endpoint
    logs = _log_dir(store)
    port = a.api_port or free_port()
    api_url = a.api_url or f"http://127.0.0.1:{port}"
    values = {"api_url": api_url, "api_port": str(port), "endpoint_url": endpoint.url + "/v1",
              "model_path": cfg.model.path, "group_size": str(cfg.rollout.samples_per_prompt),
              "run_dir": os.path.dirname(store.local_path(ATROPOS_FILE) or ""), "log_dir": str(logs)}
    secret = {"OPENAI_API_KEY": endpoint.endpoint.settings.token or "none"}
    api = None if a.api_url else ChildProcess("atropos-api", _filled(a.api_command, values), logs / "api.log")
    envs = [ChildProcess(f"env{i}", _filled(command, values), logs / f"env{i}.log", env=secret)
            for i, command in enumerate(a.envs)]
    groups = cfg.rollout.samples_per_prompt
    registration = Registration(
        wandb_group=cfg.run_name, wandb_project="grpo", batch_size=groups,
        max_token_len=cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens, checkpoint_dir=store.uri,
        save_checkpoint_interval=-1, starting_step=0,
        # Atropos's steps are groups here (a batch is one group); twice the groups left, so refusals do not make
        # an environment stop early
        num_steps=2 * (cfg.iterations - first_iteration) * cfg.rollout.prompts_per_iteration)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    source = AtroposSource(
        client=AtroposClient(api_url), registration=registration,
        limits=GroupLimits(groups, AutoConfig.from_pretrained(cfg.model.path).vocab_size),
        ledger=endpoint.endpoint.ledger, decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
        api=api, envs=envs, env_restarts=a.env_restarts, wait_s=a.wait_s, api_timeout_s=a.api_timeout_s)
    source.start()
    store.put_bytes(ATROPOS_FILE, json.dumps({"api_url": api_url, "started_api": api is not None,
                                              "envs": [e.argv for e in envs], "logs": str(logs)}, indent=1).encode())
    print(f"atropos: {'started' if api else 'joined'} the API server at {api_url}; {len(envs)} environment(s) "
          f"started (logs in {logs}); the run pulls groups of {groups}")
    return source


class _InboxSink:
    """Pulled groups into the run folder: an accepted group as one inbox item, a refused one with its reason."""

    def __init__(self, store: RunStore, iteration: int):
        self.store, self.iteration, self.count = store, iteration, 0
        self.reasons: dict[str, int] = {}  # refused groups by field

    def _name(self) -> str:
        self.count += 1
        return f"{ITEM_PREFIX}-{self.iteration:06d}-{time.time_ns()}-{self.count:04d}"

    def accepted(self, table: pa.Table) -> None:
        name, buf = self._name(), io.BytesIO()
        pq.write_table(table, buf)
        self.store.put_bytes(f"{INBOX}/{name}.parquet", buf.getvalue())
        self.store.put_bytes(f"{INBOX}/{name}{READY_SUFFIX}", b"")

    def refused(self, group: Any, error: GroupRefused) -> None:
        name = self._name()
        self.store.put_json_file(f"{REJECTED}/{name}.error.json", {**error.as_dict(), "source": "atropos /batch"})
        self.store.put_bytes(f"{REJECTED}/{name}.json", json.dumps(group).encode())
        key = error.field or "group"
        if key not in self.reasons:
            print(f"atropos: refused a group ({error}); kept in {self.store.url(f'{REJECTED}/{name}.json')}")
        self.reasons[key] = self.reasons.get(key, 0) + 1


def _waiting_groups(store: RunStore, oldest: int, newest: int) -> int:
    """Pulled groups already in the inbox (a resume's) that the iteration may still train on."""
    count = 0
    for name in ready_items(store):
        if not name.startswith(ITEM_PREFIX):
            continue
        table = pq.read_table(pa.BufferReader(store.get_bytes(f"{INBOX}/{name}.parquet")), columns=["policy_version"])
        versions = table.column("policy_version").to_pylist()
        count += bool(versions) and oldest <= min(versions) and max(versions) <= newest
    return count


@task(name="pull-atropos", task_run_name="pull-atropos-{iteration:06d}", cache_policy=NONE)
def pull_atropos(ctx: RunContext, iteration: int) -> PullResult:
    cfg, store = ctx.cfg, ctx.store
    if store.entry(iteration, INBOX_FILE) is not None:  # a resume after the iteration took its groups
        return PullResult(reused=True)
    oldest, newest = cfg.window.versions_for(iteration)
    wanted = cfg.rollout.prompts_per_iteration - _waiting_groups(store, oldest, newest)

    def stale(table: pa.Table) -> GroupRefused | None:
        versions = table.column("policy_version").to_pylist()
        if oldest <= min(versions) and max(versions) <= newest:
            return None
        return GroupRefused(None, "policy_version", f"sampled by versions {sorted(set(versions))}, outside the "
                                                    f"{oldest}..{newest} iteration {iteration} may train on "
                                                    "(rollout.inbox_max_staleness)")

    sink = _InboxSink(store, iteration)
    stats = ctx.atropos.pull(wanted, sink, stale) if wanted > 0 else PullStats()
    if sink.reasons:
        print(f"atropos: iteration {iteration} refused {stats.refused} group(s), by field: {sink.reasons} "
              f"(each in {store.url(REJECTED)} with its reason)")
    return PullResult(groups=stats.groups, refused=stats.refused, wait_s=stats.wait_s,
                      env_restarts=stats.env_restarts, api_restarts=stats.api_restarts)


def close_atropos(source: AtroposSource) -> None:
    t = source.totals
    source.close()
    print(f"atropos: closed; {t.groups} groups pulled, {t.refused} refused, {t.env_restarts} environment restart(s), "
          f"{t.api_restarts} API server restart(s)")
