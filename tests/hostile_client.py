"""An authorised but hostile client of a live run's policy endpoint (issue 53's findings, each one request): every
request that once crashed the run, lost data or answered with a 500 is sent while the run trains, and what came back
is recorded for the test to check after the run (which must have gone on training and finished).

Each ``Attempt`` says what it sent, what status, error code and param the door must answer with, and what came back.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Attempt:
    name: str
    want_status: int
    want_code: str | None = None
    want_param: str | None = None
    status: int | None = None
    body: Any = None
    notes: dict[str, Any] = field(default_factory=dict)

    def held(self) -> bool:
        error = self.body.get("error") if isinstance(self.body, dict) else None
        return (self.status == self.want_status
                and (self.want_code is None or (error or {}).get("code") == self.want_code)
                and (self.want_param is None or (error or {}).get("param") == self.want_param))


def _answer(response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def attack(doc: dict[str, Any], attempts: list[Attempt], context_tokens: int) -> None:
    """Send every hostile request once to the endpoint ``doc`` (endpoint.json) names; append what came back."""
    import httpx

    url, token, model = doc["url"], doc["token"], doc["model"]
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    chat = {"model": model, "messages": [{"role": "user", "content": "What is 12 + 3?"}]}
    client = httpx.Client(timeout=120)

    def send(attempt: Attempt, path: str, *, body: Any = None, raw: bytes | None = None,
             headers: dict | None = None, method: str = "POST") -> httpx.Response:
        content = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        response = client.request(method, f"{url}{path}", content=content, headers=headers or auth)
        attempt.status, attempt.body = response.status_code, _answer(response)
        attempts.append(attempt)
        return response

    # 1. a seed above 64 bits (once a RayTaskError, the samplers left unusable, the run dead)
    send(Attempt("seed above 64 bits", 400, want_param="seed"), "/chat/completions",
         body={**chat, "seed": 1180591620717411303424})
    # 2. NaN and infinite sampling settings (once a retryable 503)
    send(Attempt("temperature NaN", 400, want_param="temperature"), "/chat/completions",
         raw=json.dumps(chat).encode()[:-1] + b', "temperature": NaN}')
    send(Attempt("top_p Infinity", 400, want_param="top_p"), "/chat/completions",
         raw=json.dumps(chat).encode()[:-1] + b', "top_p": Infinity}')
    # 3. a prompt that fills the context (once vLLM's VLLMValidationError ended the run)
    send(Attempt("prompt over the context", 400, want_code="context_length_exceeded"), "/chat/completions",
         body={**chat, "messages": [{"role": "user", "content": " + ".join(["7"] * context_tokens)}]})
    # 4. what the JSON reader cannot take (once 500s)
    send(Attempt("100k-deep JSON", 400, want_code="invalid_json"), "/chat/completions", raw=b"[" * 100_000)
    send(Attempt("lone surrogate", 400), "/chat/completions",
         raw=b'{"messages": [{"role": "user", "content": "\\ud800"}]}')
    send(Attempt("non-ASCII token", 401, want_code="invalid_api_key"), "/models", method="GET",
         headers={"Authorization": "Bearer caf\u00e9".encode("utf-8")})
    send(Attempt("episode id with a slash", 400, want_param="episode_id"), "/chat/completions",
         body=chat, headers={**auth, "X-Episode-Id": "a/b"})
    # 5. rewards that overflow a group's statistics (once NaN advantages and a dead run): refused, the episodes open
    open_ids = []
    for i in range(doc["group_size"]):
        episode = f"hostile-huge-{i}"
        answer = client.post(f"{url}/chat/completions", json=chat, headers={**auth, "X-Episode-Id": episode})
        if answer.status_code == 200:
            open_ids.append(episode)
    for episode in open_ids:
        send(Attempt("reward 1e308", 400, want_param="reward"), f"/episodes/{episode}/finish",
             body={"reward": 1e308, "group": "hostile-huge"})
    if open_ids:
        send(Attempt("reward of 401 digits", 400, want_param="reward"), f"/episodes/{open_ids[0]}/finish",
             raw=b'{"reward": 1' + b"0" * 400 + b"}")
    for episode in open_ids:  # given up, as a failed rollout's client does: nothing left open
        send(Attempt("discard after a refused reward", 200), f"/episodes/{episode}", method="DELETE")
    # 6. a group whose episodes start from different prompts (once a plain-text 500 and all of them lost)
    mixed = []
    for i in range(doc["group_size"]):
        episode = f"hostile-mixed-{i}"
        body = {**chat, "messages": [{"role": "user", "content": f"What is {20 + i} + 1?"}]}
        if client.post(f"{url}/chat/completions", json=body,
                       headers={**auth, "X-Episode-Id": episode}).status_code == 200:
            mixed.append(episode)
    for k, episode in enumerate(mixed):
        send(Attempt(f"a group of mixed prompts, finish {k + 1} of {len(mixed)}", 200),
             f"/episodes/{episode}/finish", body={"reward": float(k % 2), "group": "hostile-mixed"})
    # 7. a good call with the largest seed the engine takes: the samplers still serve
    send(Attempt("seed 2**63 - 1 served", 200), "/chat/completions", body={**chat, "seed": 2**63 - 1})
    client.close()


def wait_for_endpoint(store, stop, timeout_s: float = 600.0) -> dict[str, Any] | None:
    deadline = time.monotonic() + timeout_s
    while not stop.is_set() and time.monotonic() < deadline:
        doc = store.get_json_file("endpoint.json")
        if doc is not None:
            return doc
        time.sleep(0.05)
    return None
