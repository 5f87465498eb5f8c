"""The Prefect console's metrics table is published at most every `logging.console_interval_s`, and never left
behind: an evaluation, the last iteration or an explicit publish sends what is pending (real Prefect API)."""
import json

from tasks.console import RunConsole
from tasks.results import EvalResult


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _tables(key: str) -> list[list[int]]:
    """The iterations of every published version of the metrics table, oldest first."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])), limit=50)
    tables = [json.loads(a.data) if isinstance(a.data, str) else a.data for a in sorted(found, key=lambda a: a.created)]
    return [[r["iteration"] for r in t] for t in tables]


def _row(i: int) -> dict:
    return {"iteration": i, "reward_mean": 0.1 * i, "time_total_s": 0.5}


def test_the_table_is_throttled_but_an_evaluation_and_the_last_iteration_publish_it(prefect_harness):
    clock = Clock()
    console = RunConsole("console-throttle", 6, [], min_interval_s=2.5, clock=clock)
    for i in range(5):  # one iteration a second
        clock.now = float(i)
        console.iteration_done(_row(i))
    assert _tables("console-throttle-metrics") == [[0], [0, 1, 2, 3]]
    console.evaluation(5, EvalResult(accuracy=0.5, set="default", greedy=True, rows=4, reward_mean=0.5,
                                     policy_version=5, seconds=0.1, metrics={}))
    assert _tables("console-throttle-metrics")[-1] == [0, 1, 2, 3, 4]
    clock.now = 5.0
    console.iteration_done(_row(5))  # the last: published whatever the interval
    console.publish()  # nothing pending: no new version
    assert _tables("console-throttle-metrics") == [[0], [0, 1, 2, 3], [0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5]]


def test_interval_zero_publishes_every_iteration(prefect_harness):
    console = RunConsole("console-every", 3, [], min_interval_s=0.0, clock=Clock())
    for i in range(3):
        console.iteration_done(_row(i))
    assert _tables("console-every-metrics") == [[0], [0, 1], [0, 1, 2]]


def test_the_eval_artifact_shows_episodes_turn_by_turn():
    from tasks.console import eval_markdown
    from tasks.evaluate import _turns

    turns = _turns('[{"role": "assistant", "text": "<calculator>12 * 12</calculator>", "tool_calls": '
                   '[{"name": "calculator", "error": null}]}, {"role": "tool", "text": "144"}, '
                   '{"role": "assistant", "text": "\\\\boxed{144}", "tool_calls": []}]')
    best = [{"prompt": "What is 12 * 12?", "response": "\\boxed{144}", "answer": "144", "reward": 1.0,
             "turns": turns}]
    md = eval_markdown("run", 5, EvalResult(accuracy=1.0, set="default", greedy=True, rows=1, reward_mean=1.0,
                                            policy_version=5, seconds=0.1, metrics={}, best=best), [0.0, 1.0])
    episodes = md.split("### Episodes", 1)[1]
    assert "- `assistant`: <calculator>12 * 12</calculator>" in episodes
    assert "- `tool`: 144" in episodes and "- `assistant`: \\boxed{144}" in episodes
