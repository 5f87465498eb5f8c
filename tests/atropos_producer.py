"""A scripted stand-in for an Atropos environment process (tests/test_atropos_e2e.py): registers with the API server
as an environment does, then sends each ``*.json`` group file of a folder to ``/scored_data`` once (renamed ``.sent``
after), and waits for more. A file named ``crash`` makes it exit 1 at once; a failed post makes it exit 1 (as an
environment whose server went away), so the run's supervision starts it again. Only the standard library: it runs
in the test's interpreter, not in .venv-envs."""
from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def main(api_url: str, folder: str) -> int:
    inbox = Path(folder)
    if (inbox / "crash").exists():
        print("crash file present: exiting 1", flush=True)
        return 1
    while True:  # environments may register only after the trainer's first /batch
        reply = _post(f"{api_url}/register-env", {"max_token_length": 64, "desired_name": "producer", "weight": 1.0,
                                                  "group_size": 2, "min_batch_allocation": None})
        if reply.get("status") == "success":
            env_id = reply["env_id"]
            break
        time.sleep(0.2)
    print(f"registered as env {env_id}", flush=True)
    while True:
        for path in sorted(inbox.glob("*.json")):
            group = json.loads(path.read_text())
            try:
                _post(f"{api_url}/scored_data", {**group, "env_id": env_id})
            except (urllib.error.URLError, ConnectionError) as exc:
                print(f"post failed ({exc}): exiting 1", flush=True)
                return 1
            path.rename(path.with_suffix(".sent"))
            print(f"sent {path.name}", flush=True)
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
