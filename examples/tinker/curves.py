"""The learning curves of `make run-tinker`'s two cookbook recipes, from the metrics.jsonl files the cookbook wrote:
    python examples/tinker/curves.py RUN_FOLDER"""
from __future__ import annotations

import json
import sys
from pathlib import Path

RL = (("env/all/correct", "correct"), ("env/all/format", "format"), ("env/all/reward/total", "reward"),
      ("time/total", "s/step"))
SL = (("train_mean_nll", "train NLL"),)


def table(path: Path, columns) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if any(key in r for key, _ in columns[:1])]
    print(f"\n{path.parent.name}: {len(rows)} steps")
    print("| step | " + " | ".join(name for _, name in columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for r in rows:
        cells = [f"{r[key]:.3f}" if isinstance(r.get(key), (int, float)) else "" for key, _ in columns]
        print(f"| {int(r.get('step', 0))} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    root = Path(sys.argv[1])
    for sub, columns in (("cookbook-rl", RL), ("cookbook-sl", SL)):
        if (root / sub / "metrics.jsonl").is_file():
            table(root / sub / "metrics.jsonl", columns)
