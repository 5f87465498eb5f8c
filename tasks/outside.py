"""A run whose groups all come from outside (``atropos`` or ``endpoint.clients`` in the config): its source starts
once the policy endpoint serves; before each iteration takes its inbox, ``fill_inbox`` has the source fill the inbox
with the groups the iteration still needs: pulled from an Atropos API server's ``/batch`` (one item per group, the
unusable ones refused into ``inbox/rejected/`` with the reason), or finished by the endpoint's clients. The
iteration then takes them like any inbox group (the staleness rule, the off-policy corrections, exactly once across a
resume: ``tasks/inbox.py``) and samples no prompt of its own. Which of the two a run has is chosen with its batch
source (``tasks/batch_sources.py``).
"""
from __future__ import annotations

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

from grpo_core.outside.atropos.client import AtroposClient, Registration
from grpo_core.outside.atropos.groups import GroupLimits
from grpo_core.outside.atropos.source import AtroposSource
from grpo_core.infra.child_process import ChildProcess
from grpo_core.outside.endpoint.clients import ClientsSource
from grpo_core.infra.netaddr import free_port
from grpo_core.outside.source import GroupRefused, OutsideSource, Supervisor
from grpo_core.pipeline.inbox import INBOX, REJECTED, put_item, ready_items
from grpo_core.run.storage import RunStore
from tasks.context import RunContext
from tasks.inbox import INBOX_FILE
from tasks.results import FillResult

ATROPOS_FILE = "atropos.json"
ITEM_PREFIX = "atropos"


def _log_dir(store: RunStore, name: str) -> Path:
    """The processes' logs: in the run folder when it is local, else a temporary folder (printed at the start)."""
    local = store.local_path(name)
    return Path(local) if local is not None else Path(tempfile.mkdtemp(prefix=f"grpo-{name}-"))


def _placeholders(ctx: RunContext, logs: Path) -> dict[str, str]:
    cfg, store = ctx.cfg, ctx.store
    return {"endpoint_url": ctx.endpoint.url, "model_name": cfg.run_name, "model_path": cfg.model.path,
            "group_size": str(cfg.rollout.samples_per_prompt),
            "run_dir": os.path.dirname(store.local_path(ATROPOS_FILE) or ""), "log_dir": str(logs)}


def _secret(ctx: RunContext) -> dict[str, str]:
    """The endpoint's token, for the processes: in their environment, never on a command line."""
    return {"OPENAI_API_KEY": ctx.endpoint.endpoint.settings.token or "none"}


def open_clients(ctx: RunContext, first_iteration: int) -> ClientsSource:
    """The endpoint's clients (``endpoint.clients``) started: every group comes from their episodes."""
    e = ctx.cfg.endpoint
    logs = _log_dir(ctx.store, "clients")
    values = _placeholders(ctx, logs)
    clients = [ChildProcess(f"client{i}", _filled(command, values), logs / f"client{i}.log", env=_secret(ctx))
               for i, command in enumerate(e.clients)]
    source = ClientsSource(Supervisor(clients, e.client_restarts), e.groups_wait_s).start()
    print(f"endpoint: {len(clients)} client(s) started (logs in {logs}); every group comes from their episodes")
    return source


def _filled(command: list[str], values: dict[str, str]) -> list[str]:
    """The command with the known ``{name}`` placeholders filled; other braces are left as they are."""
    out = []
    for arg in command:
        for name, value in values.items():
            arg = arg.replace("{" + name + "}", value)
        out.append(arg)
    return out


def open_atropos(ctx: RunContext, first_iteration: int) -> AtroposSource:
    """The Atropos API server (started, or joined at ``atropos.api_url``) and its environments: every group is
    pulled from its ``/batch``."""
    from transformers import AutoConfig, AutoTokenizer

    cfg, a, store = ctx.cfg, ctx.cfg.atropos, ctx.store
    logs = _log_dir(store, "atropos")
    port = a.api_port or free_port()
    api_url = a.api_url or f"http://127.0.0.1:{port}"
    values = {**_placeholders(ctx, logs), "api_url": api_url, "api_port": str(port)}
    api = None if a.api_url else ChildProcess("atropos-api", _filled(a.api_command, values), logs / "api.log")
    envs = [ChildProcess(f"env{i}", _filled(command, values), logs / f"env{i}.log", env=_secret(ctx))
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
        limits=GroupLimits(groups, AutoConfig.from_pretrained(cfg.model.path).vocab_size,
                           max_abs_score=cfg.endpoint.max_abs_reward),
        ledger=ctx.endpoint.endpoint.ledger, decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
        api=api, envs=Supervisor(envs, a.env_restarts), wait_s=a.wait_s, api_timeout_s=a.api_timeout_s)
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
        put_item(self.store, self._name(), table)

    def refused(self, group: Any, error: GroupRefused) -> None:
        name = self._name()
        self.store.put_json_file(f"{REJECTED}/{name}.error.json", {**error.as_dict(), "source": "atropos /batch"})
        self.store.put_bytes(f"{REJECTED}/{name}.json", json.dumps(group).encode())
        key = error.field or "group"
        if key not in self.reasons:
            print(f"atropos: refused a group ({error}); kept in {self.store.url(f'{REJECTED}/{name}.json')}")
        self.reasons[key] = self.reasons.get(key, 0) + 1


class _WaitingGroups:
    """Groups in the inbox (taken by no iteration yet) that an iteration may train on: sampled by versions in
    [oldest, newest]. Each item is read once (its versions do not change); a poll lists the folder."""

    def __init__(self, store: RunStore, oldest: int, newest: int):
        self.store, self.oldest, self.newest = store, oldest, newest
        self._seen: dict[str, tuple[int, int, int]] = {}  # item -> (oldest version, newest version, groups)

    def _read(self, name: str) -> tuple[int, int, int]:
        table = pq.read_table(pa.BufferReader(self.store.get_bytes(f"{INBOX}/{name}.parquet")),
                              columns=["policy_version", "sample_idx"])
        versions = table.column("policy_version").to_pylist() or [-1]
        return min(versions), max(versions), table.column("sample_idx").to_pylist().count(0)

    def __call__(self) -> int:
        count = 0
        for name in ready_items(self.store):
            if name not in self._seen:
                self._seen[name] = self._read(name)
            low, high, groups = self._seen[name]
            count += groups if self.oldest <= low and high <= self.newest else 0
        return count


@task(name="fill-inbox", task_run_name="fill-inbox-{iteration:06d}", cache_policy=NONE)
def fill_inbox(ctx: RunContext, iteration: int, source: OutsideSource) -> FillResult:
    """``source`` fills the inbox with the groups ``iteration`` still needs (nothing when it took them already)."""
    cfg, store = ctx.cfg, ctx.store
    if store.entry(iteration, INBOX_FILE) is not None:  # a resume after the iteration took its groups
        return FillResult(reused=True)
    oldest, newest = cfg.window.versions_for(iteration)

    def stale(table: pa.Table) -> GroupRefused | None:
        versions = table.column("policy_version").to_pylist()
        if oldest <= min(versions) and max(versions) <= newest:
            return None
        return GroupRefused(None, "policy_version", f"sampled by versions {sorted(set(versions))}, outside the "
                                                    f"{oldest}..{newest} iteration {iteration} may train on "
                                                    "(rollout.inbox_max_staleness)")

    sink = _InboxSink(store, iteration)
    stats = source.fill(cfg.rollout.prompts_per_iteration, sink, stale, _WaitingGroups(store, oldest, newest))
    if sink.reasons:
        print(f"{ITEM_PREFIX}: iteration {iteration} refused {stats.refused} group(s), by field: {sink.reasons} "
              f"(each in {store.url(REJECTED)} with its reason)")
    return FillResult(groups=stats.groups, refused=stats.refused, wait_s=stats.wait_s,
                      process_restarts=stats.process_restarts, server_restarts=stats.server_restarts,
                      short=stats.short)


def close_outside(source: OutsideSource) -> None:
    t = source.totals
    source.close()
    print(f"outside source closed: {t.groups} groups in, {t.refused} refused, {t.process_restarts} process "
          f"restart(s), {t.server_restarts} server restart(s)")
