"""`make ui-check`: the operator's console checked end to end, through Prefect's REST API and a real browser.

What a person does, done by a script: `grpo stack up`; a deployment run of `grpo-train/tiny` (a few iterations);
its artifacts read back through the REST API (progress 100 %, one metrics row per iteration, the evaluation with
examples, the summary naming the final policy) and its Logs tab holding the flow's lines; headless Chromium
screenshots of the flow-run page, its Artifacts and Logs tabs and the artifacts themselves, each page's rendered DOM
checked for what the screenshot should show; two runs of the scheduled deployment `grpo-train/tiny-nightly`, each
starting from the model registry's champion in a run folder of its own and gated against it, its decision artifact
read back and rendered; a deployment run of
`grpo-sft-rl/smollm2-sft-rl` whose two stages (SFT, then RL from its policy) are its subflow runs, each page naming
its parent; `grpo stack down`, after which nothing
the stack started is still running. Screenshots and a report land in runs/ui-check/.

Needs Debian's chromium (`make ui-check` installs it when missing). Nothing outside 127.0.0.1 is contacted.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


class CheckFailed(AssertionError):
    pass


def check(condition: bool, what: str) -> None:
    if not condition:
        raise CheckFailed(what)
    print(f"  ok  {what}")


class Api:
    def __init__(self, url: str):
        self.url = url.rstrip("/")

    def __call__(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def run_deployment(self, name: str, extra_overrides: list[str] | dict[str, list[str]], timeout_s: float) -> dict:
        """Start a flow run of deployment ``flow/deployment`` with its own parameters plus ``extra_overrides``
        (later overrides win; a dict gives them per overrides parameter, e.g. ``sft_overrides``), wait for it to
        end."""
        flow, deployment = name.split("/")
        dep = self("GET", f"/deployments/name/{flow}/{deployment}")
        params = dict(dep["parameters"])
        extra = extra_overrides if isinstance(extra_overrides, dict) else {"overrides": extra_overrides}
        for key, values in extra.items():
            params[key] = list(params.get(key) or []) + values
        run = self("POST", f"/deployments/{dep['id']}/create_flow_run", {"parameters": params})
        print(f"  started {name}: flow run {run['id']}")
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            run = self("GET", f"/flow_runs/{run['id']}")
            if run["state_type"] in TERMINAL:
                return run
            time.sleep(3)
        raise CheckFailed(f"{name} did not finish within {timeout_s:.0f}s (state {run['state_type']})")

    def artifacts(self, flow_run_id: str) -> list[dict]:
        return self("POST", "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [flow_run_id]}},
                                                  "limit": 200})

    def logs_with(self, flow_run_id: str, wanted: tuple[str, ...], wait_s: float = 30.0) -> list[str]:
        """The flow run's log lines once each of ``wanted`` is among them, or after ``wait_s``: the flow process
        sends its last lines in the background, and the run's state can read COMPLETED before they arrive."""
        deadline = time.time() + wait_s
        while True:
            logs = self.logs(flow_run_id)
            if all(any(w in m for m in logs) for w in wanted) or time.time() > deadline:
                return logs
            time.sleep(1)

    def logs(self, flow_run_id: str) -> list[str]:
        return [log["message"] for log in self("POST", "/logs/filter", {
            "logs": {"flow_run_id": {"any_": [flow_run_id]}}, "limit": 200, "sort": "TIMESTAMP_ASC"})]


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        raise CheckFailed("chromium is not installed (`make ui-check` installs Debian's chromium)")
    return found


def browse(url: str, png: Path, budget_ms: int = 20000) -> str:
    """Screenshot ``url`` into ``png`` and return the rendered DOM (a second load: Chromium does one or the other)."""
    base = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--hide-scrollbars", "--window-size=1500,1100", f"--virtual-time-budget={budget_ms}"]
    with tempfile.TemporaryDirectory(prefix="grpo-chromium-") as profile:
        subprocess.run([*base, f"--user-data-dir={profile}", f"--screenshot={png}", url], check=True,
                       capture_output=True, timeout=120)
    with tempfile.TemporaryDirectory(prefix="grpo-chromium-") as profile:
        dom = subprocess.run([*base, f"--user-data-dir={profile}", "--dump-dom", url], check=True,
                             capture_output=True, text=True, timeout=120).stdout
    check(png.is_file() and png.stat().st_size > 20_000, f"screenshot {png.name} ({png.stat().st_size} bytes)")
    return dom


def stack(*args: str) -> str:
    out = subprocess.run([str(ROOT / ".venv/bin/grpo"), "stack", *args], cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        raise CheckFailed(f"grpo stack {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}")
    return out.stdout


def check_tiny_run(api: Api, ui: str, out: Path, iterations: int, timeout_s: float) -> dict:
    print("deployment run of grpo-train/tiny")
    run = api.run_deployment("grpo-train/tiny", [f"iterations={iterations}", "eval.interval=2",
                                                  "run_name=ui-check-{date}-{time}"], timeout_s)
    check(run["state_type"] == "COMPLETED", f"flow run {run['name']} completed ({run['state_type']})")
    name = run["name"]
    check(name.startswith("ui-check-"), f"the flow run is named after the training run: {name}")
    check({"preset:grpo", "placement:colocate"} <= set(run["tags"]), f"tags {sorted(run['tags'])}")
    tasks = {t["name"] for t in api("POST", "/task_runs/filter",
                                    {"flow_runs": {"id": {"any_": [run["id"]]}}, "limit": 200})}
    check(f"train-{iterations - 1:06d}" in tasks and "rollout-000000-r0" in tasks,
          "task runs carry the iteration (rollout-000000-r0, train-...)")
    arts = {a["key"]: a for a in sorted(api.artifacts(run["id"]), key=lambda a: a["created"])}
    key = name.lower()
    check(float(arts[f"{key}-progress"]["data"]) == 100.0, "progress artifact at 100 %")
    table = arts[f"{key}-metrics"]["data"]
    table = json.loads(table) if isinstance(table, str) else table
    check([r["iteration"] for r in table] == list(range(iterations)), f"metrics table has {iterations} rows")
    evaluation = arts[f"{key}-eval"]["data"]
    check("**accuracy" in evaluation and "### Best" in evaluation and "### Worst" in evaluation,
          "evaluation artifact holds the accuracy and best/worst completions")
    check("final" in arts[f"{key}-summary"]["data"], "summary artifact names the final policy")
    wanted_lines = ("engines ready", "iter    0  reward", "total wall time")
    logs = api.logs_with(run["id"], wanted_lines)
    for wanted in wanted_lines:
        check(any(wanted in m for m in logs), f"Logs tab has '{wanted}'")

    shots = out / name
    shots.mkdir(parents=True, exist_ok=True)
    page = f"{ui}/runs/flow-run/{run['id']}"
    # The flow-run page opens on its Logs tab (this UI resets a ?tab= link while the run loads, so the Artifacts
    # tab is shown through the Artifacts page and each artifact's own page).
    dom = browse(page, shots / "flow-run.png")
    check(name in dom and "engines ready" in dom, "flow-run page shows the run's name, its task graph and Logs tab")
    dom = browse(f"{ui}/artifacts", shots / "artifacts.png")
    check(all(f"{key}-{kind}" in dom for kind in ("progress", "metrics", "eval", "summary")),
          "the Artifacts page lists the run's progress, metrics, eval and summary artifacts")
    for kind, wanted in (("metrics", "reward_mean"), ("eval", "accuracy"), ("summary", "final")):
        dom = browse(f"{ui}/artifacts/artifact/{arts[f'{key}-{kind}']['id']}", shots / f"artifact-{kind}.png")
        check(f"{key}-{kind}" in dom and wanted in dom, f"the {kind} artifact's page renders it ('{wanted}')")
    return run


NIGHTLY_REGISTRY = "tiny-nightly"  # registry.name of the nightly deployment


def champion() -> dict | None:
    """The nightly registry's champion, as `grpo registry show` prints it."""
    out = subprocess.run([str(ROOT / ".venv/bin/grpo"), "registry", "show", "--root", "runs", "--name",
                          NIGHTLY_REGISTRY], cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        raise CheckFailed(f"grpo registry show failed:\n{out.stderr}")
    return json.loads(out.stdout)["champion"]


def check_nightly(api: Api, ui: str, out: Path, timeout_s: float) -> list[str]:
    """Two runs of the scheduled deployment: each starts from the registry's champion (model.init_from=champion),
    is gated against it, and publishes its decision as an artifact whose page renders it."""
    print("two runs of the scheduled deployment grpo-train/tiny-nightly")
    names = []
    for _ in range(2):
        before = champion()
        run = api.run_deployment("grpo-train/tiny-nightly", ["iterations=3", "eval.interval=0"], timeout_s)
        check(run["state_type"] == "COMPLETED", f"nightly flow run {run['name']} completed")
        name, folder = run["name"], ROOT / "runs" / run["name"]
        names.append(name)
        source = json.loads((folder / "init_from.json").read_text())
        check(source.get("registry_version") == (before or {}).get("version"),
              f"{name} started from the champion then ({(before or {}).get('version', 'none: model.path')}): "
              f"{source}")
        gate = json.loads((folder / "gate.json").read_text())
        after = champion()
        check(gate["outcome"] in ("promoted", "refused") and
              (after["version"] == gate["version"] if gate["outcome"] == "promoted" else after == before),
              f"the gate's decision ({gate['reason']}) is the registry's (champion now {after['version']})")
        arts = {a["key"]: a for a in api.artifacts(run["id"])}
        key = f"{name.lower()}-gate"
        check(key in arts and gate["reason"] in arts[key]["data"], f"the decision artifact {key} holds the reason")
        shots = out / name
        shots.mkdir(parents=True, exist_ok=True)
        dom = browse(f"{ui}/artifacts/artifact/{arts[key]['id']}", shots / "artifact-gate.png")
        check(key in dom and "Gate:" in dom and gate["outcome"].upper()[:7] in dom.upper(),
              "the decision artifact's page renders it")
        time.sleep(1.1)  # the run name template has one-second resolution
    first, second = (ROOT / "runs" / n for n in names)
    check(first != second and first.is_dir() and second.is_dir(), f"each night has its own run folder: {names}")
    files = json.loads((second / "data_files.json").read_text())["files"]["train"]
    check(any(f.endswith("data/arith/train.jsonl") for f in files), f"the data glob resolved to {files}")
    return names


def check_sft_rl(api: Api, ui: str, out: Path, timeout_s: float) -> dict:
    """The grpo-sft-rl deployment (SFT then RL on SmolLM2, one iteration each here): one flow run whose two stages
    are its subflow runs, in the API and on the parent's page in the UI."""
    print("deployment run of grpo-sft-rl/smollm2-sft-rl (one iteration per stage)")
    short = ["iterations=1", "eval.interval=0"]
    run = api.run_deployment("grpo-sft-rl/smollm2-sft-rl", {
        "sft_overrides": [*short, "run_name=ui-sft-{date}-{time}"],
        "rl_overrides": [*short, "run_name=ui-sft-rl-{date}-{time}"]}, timeout_s)
    check(run["state_type"] == "COMPLETED", f"flow run {run['name']} completed ({run['state_type']})")
    children = api("POST", "/flow_runs/filter", {"flow_runs": {"parent_flow_run_id": {"any_": [run["id"]]}},
                                                 "limit": 10})
    flows = {c["flow_id"]: api("GET", f"/flows/{c['flow_id']}")["name"] for c in children}
    stages = sorted((flows[c["flow_id"]], c["name"], c["state_type"]) for c in children)
    check([(flow, state) for flow, _, state in stages] == [("grpo-sft", "COMPLETED"), ("grpo-train", "COMPLETED")],
          f"its subflow runs are the two stages: {stages}")
    sft_name, rl_name = (name for _, name, _ in stages)
    check(run["name"] == f"{sft_name}-then-{rl_name}", f"the flow run is named after its stages: {run['name']}")
    source = json.loads((ROOT / "runs" / rl_name / "init_from.json").read_text())
    check(source["run"] == sft_name, f"the RL run started from the SFT run's policy ({source})")
    shots = out / run["name"]
    shots.mkdir(parents=True, exist_ok=True)
    logs = api.logs_with(run["id"], ("stage 1: SFT run",))
    check(any(f"stage 1: SFT run {sft_name}" in m for m in logs), "its Logs tab names the two stages")
    # The run graph is drawn on a canvas (its two subflow bars, named "grpo-sft / <run>" and "grpo-train / <run>",
    # are in the screenshot, not in the DOM); the page's DOM has the run's name and its Subflow Runs tab.
    dom = browse(f"{ui}/runs/flow-run/{run['id']}", shots / "flow-run.png")
    check(run["name"] in dom and "Subflow Runs" in dom, "the parent flow run's page: its name, a Subflow Runs tab")
    for child in children:
        dom = browse(f"{ui}/runs/flow-run/{child['id']}", shots / f"subflow-{child['name']}.png")
        check(child["name"] in dom, f"the subflow run {child['name']} has its own page")
    return run


def check_down() -> None:
    import psutil

    print("grpo stack down")
    pids = {p.stem: int(p.read_text()) for p in (ROOT / ".cache/stack").glob("*.pid")}
    print(stack("down").strip())
    time.sleep(2)
    alive = [f"{name} ({pid})" for name, pid in pids.items() if psutil.pid_exists(pid)
             and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    check(not alive, f"nothing the stack started is still running ({alive or 'all stopped'})")
    ours = [p.info["name"] for p in psutil.process_iter(["name", "cmdline"])
            if any(part in " ".join(p.info["cmdline"] or []) for part in ("prefect worker", "ray start --head",
                                                                          "prefect server start", "s3server"))]
    check(not ours, f"no stack process left ({ours or 'none'})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per deployment run")
    parser.add_argument("--out", default=str(ROOT / "runs" / "ui-check"))
    parser.add_argument("--keep-stack", action="store_true", help="leave the stack running at the end")
    args = parser.parse_args()
    port = int(os.environ.get("PREFECT_PORT", "4200"))
    ui, out = f"http://127.0.0.1:{port}", Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    print("grpo stack up")
    print(stack("up").strip())
    api = Api(f"{ui}/api")
    report: dict[str, Any] = {}
    try:
        tiny = check_tiny_run(api, ui, out, args.iterations, args.timeout)
        report["tiny"] = {"flow_run": tiny["id"], "name": tiny["name"]}
        report["nightly"] = check_nightly(api, ui, out, args.timeout)
        sft_rl = check_sft_rl(api, ui, out, args.timeout)
        report["sft_rl"] = {"flow_run": sft_rl["id"], "name": sft_rl["name"]}
    finally:
        if not args.keep_stack:
            check_down()
    report["seconds"] = round(time.time() - started, 1)
    (out / "report.json").write_text(json.dumps(report, indent=1))
    print(f"ui-check passed in {report['seconds']}s; screenshots in {out}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except CheckFailed as failed:
        print(f"ui-check FAILED: {failed}", file=sys.stderr)
        sys.exit(1)
