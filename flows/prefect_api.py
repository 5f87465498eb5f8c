"""Prefect's own API started patiently on a busy machine.

Where no API URL is set, `grpo train` and the tests' harness start a Prefect API in a subprocess
(`prefect.server.api.server.SubprocessASGIServer.start`, Prefect 3.7). Its wait for the server polls ``/health``
with an ``httpx.Client()`` of httpx's default 5 s timeout and retries only a refused connection: a server that has
accepted the connection but answers later than 5 s (its first answers, while it migrates its database, on two busy
cores) ends the start with ``httpx.ReadTimeout`` at once, whatever startup allowance was set. Seen on a fresh clone
(2026-11-29): one `make test` worker's harness failed so and its 25 flow tests errored at set-up.

`wait_patiently_for_the_api` (called when flows/grpo_train.py is imported, and by the tests' harness) gives that
polling client a read timeout as long as the start's allowance (``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS``,
which `grpo` and the tests set to STARTUP_ALLOWANCE_S), so a slow first answer is waited for; everything else the
module does with httpx is unchanged.
"""
from __future__ import annotations

import threading
from typing import Any

import httpx

STARTUP_ALLOWANCE_S = 180  # how long a first start may take on 2 busy cores (the ephemeral API migrates its database)


class _PatientHttpx:
    """httpx as Prefect's server module sees it, but a `Client` made without a timeout reads for `timeout_s`."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s

    def __getattr__(self, name: str) -> Any:
        return getattr(httpx, name)

    def Client(self, *args: Any, **kwargs: Any) -> httpx.Client:  # noqa: N802 (httpx's name)
        kwargs.setdefault("timeout", httpx.Timeout(5.0, read=self.timeout_s))
        return httpx.Client(*args, **kwargs)


def wait_patiently_for_the_api() -> bool:
    """Make Prefect's subprocess-API start wait as long as its startup allowance for the server's first answer;
    False (nothing done, nothing imported) where an API URL is set: no API is started then."""
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS

    if PREFECT_API_URL.value():
        return False
    from prefect.server.api import server

    server.httpx = _PatientHttpx(float(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value()))
    return True


class EarlyApi:
    """Prefect's ephemeral API started in a thread while `grpo train` imports its flows.

    A flow started without an API URL makes Prefect start one in a subprocess and wait for it (8.5 s on 2 quiet
    cores, more while it migrates a new database) only once the flow is called, that is after the flows' imports
    (13.5 s: torch, Ray, Prefect). The server is another process: started first, it comes up on the second core while
    this one imports. Prefect's client then finds its one ephemeral server (``SubprocessASGIServer()``, one per port)
    already running. ``wait`` must be called before the flow starts: Prefect marks the server running before it
    answers, and a client that came meanwhile would not wait for it."""

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> "EarlyApi":
        from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_ALLOW_EPHEMERAL_MODE

        if not PREFECT_API_URL.value() and PREFECT_SERVER_ALLOW_EPHEMERAL_MODE.value():
            self._thread = threading.Thread(target=self._start_server, name="prefect-api-start", daemon=True)
            self._thread.start()
        return self

    def _start_server(self) -> None:
        try:
            wait_patiently_for_the_api()
            from prefect.server.api.server import SubprocessASGIServer

            SubprocessASGIServer().start()
        except Exception as exc:  # noqa: BLE001 (raised again by wait(), in the caller's thread)
            self.error = exc

    def wait(self) -> None:
        """Until the API answers (nothing when none was started); its start's error, if it failed."""
        if self._thread is not None:
            self._thread.join()
        if self.error is not None:
            raise RuntimeError(f"Prefect's API did not start: {self.error}") from self.error
