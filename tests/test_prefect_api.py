"""Prefect's own API start waits for a slow first answer (flows/prefect_api.py): Prefect 3.7's start, run against a
stand-in server whose /health answers after 6 s, gives up with httpx's ReadTimeout as it ships and waits once
patched; with an API URL set nothing is patched or imported."""
from __future__ import annotations

import socket
import subprocess
import sys

import httpx
import pytest

from flows import prefect_api

# A server that accepts at once and answers every GET after `delay` seconds, as the API answers its first requests
# while it migrates its database on busy cores.
SLOW_SERVER = """
import http.server, sys, time
class Slow(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        time.sleep(float(sys.argv[2]))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Slow).serve_forever()
"""
DELAY_S = 6  # longer than httpx's default 5 s timeout


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def slow_api(monkeypatch):
    """Prefect's server module as it ships (an earlier flow import or harness of this process patched it), its
    subprocess API replaced by SLOW_SERVER; both restored afterwards."""
    from prefect.server.api import server

    monkeypatch.setattr(server, "httpx", httpx)
    monkeypatch.setattr(server.SubprocessASGIServer, "_run_uvicorn_command", lambda self: subprocess.Popen(
        [sys.executable, "-c", SLOW_SERVER, str(self.port), str(DELAY_S)]))
    return server


def test_a_slow_first_answer_ends_prefects_start_as_shipped_and_is_waited_for_once_patched(slow_api):
    from prefect.settings import (PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
                                  temporary_settings)

    api = slow_api.SubprocessASGIServer(_free_port())
    try:
        with pytest.raises(httpx.ReadTimeout):
            api.start(timeout=60)
    finally:
        api.stop()
    with temporary_settings(updates={PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: 60},
                            restore_defaults={PREFECT_API_URL}):
        assert prefect_api.wait_patiently_for_the_api()
    assert slow_api.httpx.ConnectError is httpx.ConnectError  # the rest of httpx as it was
    api = slow_api.SubprocessASGIServer(_free_port())
    try:
        api.start(timeout=60)
        assert api.running and api.server_process.poll() is None
    finally:
        api.stop()


def test_with_an_api_url_set_nothing_is_patched(slow_api):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    before = slow_api.httpx
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:4200/api"}):
        assert not prefect_api.wait_patiently_for_the_api()
    assert slow_api.httpx is before
