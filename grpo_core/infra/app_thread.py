"""An ASGI app served by uvicorn on a thread of this process, on a socket bound before the thread starts (so the
port is known at once, and port 0 picks a free one): the policy endpoint's and the training service's servers."""
from __future__ import annotations

import threading
import time


class AppThread:
    def __init__(self, app, host: str, port: int, name: str):
        import uvicorn

        from grpo_core.infra.netaddr import listening_socket

        self.name = name
        self._socket = listening_socket(host, port)
        self.host, self.port = self._socket.getsockname()[:2]
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]}, name=name,
                                        daemon=True)

    def start(self, timeout: float = 30.0) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the {self.name} did not start on {self.host}:{self.port}")
            time.sleep(0.02)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._socket.close()
