"""Inbox task: before an async iteration's rollout, take experience that outside producers left in the run
folder's inbox/ (see grpo_core.pipeline.inbox) into ``iter-N/inbox.parquet``; the iteration then samples that many
fewer prompts itself. A resumed run reuses the iteration's inbox.parquet, so it trains on the same rows."""
from __future__ import annotations

from prefect import task
from prefect.cache_policies import NONE

from grpo_core.pipeline import inbox
from tasks.context import RunContext
from tasks.results import InboxResult

INBOX_FILE = "inbox.parquet"


@task(name="take-inbox", task_run_name="take-inbox-{iteration:06d}", cache_policy=NONE)
def take_inbox(ctx: RunContext, iteration: int, own_groups: int = 1) -> InboxResult:
    """``own_groups``: groups of the batch the run samples itself at least (0: every group may come from the
    inbox)."""
    cfg, store = ctx.cfg, ctx.store
    done = store.entry(iteration, INBOX_FILE)
    if done is not None:
        inbox.consume(store, done.meta["items"])  # a crash may have come between the commit and the deletes
        return InboxResult.from_meta(True, done.meta)
    taken_before = set()  # ... and a resume may start after that iteration: never take an item twice
    for earlier in cfg.window.inbox_lookback(iteration):
        entry = store.entry(earlier, INBOX_FILE)
        taken_before.update(entry.meta["items"] if entry is not None else [])
    inbox.consume(store, [name for name in inbox.ready_items(store) if name in taken_before])
    oldest, newest = cfg.window.versions_for(iteration)
    taken = inbox.take(store, iteration=iteration, group_size=cfg.rollout.samples_per_prompt,
                       batch_groups=cfg.rollout.prompts_per_iteration, oldest_version=oldest, newest_version=newest,
                       own_groups=own_groups)
    for error in taken.rejected:
        print(f"inbox: refused {error['file']} (row {error['row']}, field {error['field']}): {error['error']}; "
              f"kept in {store.url(inbox.REJECTED)}")
    if taken.table is None:
        return InboxResult(rejected=len(taken.rejected))
    versions = taken.table.column("policy_version").to_pylist()
    result = InboxResult(groups=taken.groups, rows=taken.table.num_rows, items=tuple(taken.items),
                         rejected=len(taken.rejected), version_min=min(versions), version_sum=sum(versions))
    store.put_table(iteration, INBOX_FILE, taken.table, meta=result.meta())
    inbox.consume(store, taken.items)  # after the iteration's copy is committed
    names = ", ".join(taken.items) if len(taken.items) <= 3 else \
        f"{taken.items[0]} .. {taken.items[-1]} ({len(taken.items)} items)"
    print(f"inbox: iteration {iteration} takes {taken.groups} group(s) from {names}")
    return result


def inbox_groups(ctx: RunContext, iteration: int) -> int:
    """Groups of ``iteration``'s batch that came from the inbox (0 without an inbox.parquet)."""
    done = ctx.store.entry(iteration, INBOX_FILE)
    return int(done.meta["groups"]) if done is not None else 0
