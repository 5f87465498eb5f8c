"""The trainer's side of atroposlib's API server (``run-api``), as its example trainer speaks it.

``POST /register`` once (a second registration on a running server keeps its queue: what a resumed run relies on),
then ``GET /batch``, which answers ``{"batch": null}`` until ``batch_size`` sequences are queued, then a list of
scored groups. Environments may only register after the trainer's first ``/batch``.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import httpx


class AtroposUnavailable(RuntimeError):
    """The API server did not answer (down, restarting, or a reply that is not its protocol)."""


class BadBatch(AtroposUnavailable):
    """An answer that is JSON but cannot be read (nested deeper than the decoder's recursion). From ``/batch``: its
    groups are refused whole, kept as ``text``, and the pulls go on (the server has already handed them out);
    elsewhere it is a reply that is not the protocol, as its base class says."""

    def __init__(self, text: str, reason: str):
        super().__init__(reason)
        self.text, self.reason = text, reason


@dataclass(frozen=True)
class Registration:
    """The body of ``POST /register``; ``batch_size`` counts sequences (groups x group size)."""
    wandb_group: str
    wandb_project: str
    batch_size: int
    max_token_len: int
    checkpoint_dir: str
    save_checkpoint_interval: int
    starting_step: int
    num_steps: int


class AtroposClient:
    def __init__(self, url: str, timeout_s: float = 10.0):
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s, trust_env=False)

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
            response.raise_for_status()
            try:
                return response.json()
            except RecursionError:
                raise BadBatch(response.text, f"{method} {self.url}{path} answered JSON nested deeper than Python's "
                                              "decoder reads") from None
        except (httpx.HTTPError, ValueError) as exc:
            raise AtroposUnavailable(f"{method} {self.url}{path}: {type(exc).__name__}: {exc}") from exc

    def wait_up(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._json("GET", "/status")
                return
            except AtroposUnavailable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def register(self, registration: Registration) -> int:
        return int(self._json("POST", "/register", json=asdict(registration))["uuid"])

    def batch(self) -> list[Any] | None:
        """A batch of scored groups, or None while fewer than batch_size sequences are queued."""
        reply = self._json("GET", "/batch")
        if not isinstance(reply, dict) or "batch" not in reply:
            raise AtroposUnavailable(f"GET {self.url}/batch answered {str(reply)[:200]!r}")
        if reply.get("status") == "error":  # the server restarted and lost the registration
            raise AtroposUnavailable(f"GET {self.url}/batch: {reply.get('message')}")
        return reply["batch"]

    def status(self) -> dict[str, Any]:
        return self._json("GET", "/status")

    def close(self) -> None:
        self._http.close()
