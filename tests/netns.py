"""Several hosts on one machine, for tests: network namespaces on a bridge the test creates and removes.

Why: a cluster whose nodes all sit on 127.0.0.1 never shows what breaks between machines (a process bound to the
wrong interface, a node that vanishes, a link that drops or stalls). Here each host is a network namespace with its
own private address on a bridge of its own; its processes see only their loopback and that address. Nothing is
routed beyond the bridge: no namespace has a default route, and the bridge's own address (the root namespace's
foot on it, for the test to read results) is the only address outside the namespaces.

Faults a test can inject: ``Host.kill_all`` (SIGKILL every process in the namespace: the machine lost),
``Host.cut`` / ``Host.heal`` (its link down / up: a partition), ``Host.shape`` (a fixed delay on every packet it
sends, by ``tests.netshape``, and random loss, by iptables' statistic match; the kernel here has no netem).

Every name made here starts with ``grpo`` and four hex digits of the topology (``grpo1a2b-br``, ``grpo1a2b-head``);
``leftovers()`` lists what any topology left behind and ``python -m tests.netns check`` fails on it. Needs root, and
iptables for ``shape``.
"""
from __future__ import annotations

import ipaddress
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

NAME = re.compile(r"^grpo[0-9a-f]{4}-")


class TopologyError(RuntimeError):
    """A namespace, link or address could not be made or removed; the message has the command and its output."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise TopologyError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")
    return done


def available() -> str | None:
    """Why this machine cannot host a topology (not root, no `ip`, namespaces refused), or None when it can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    probe = f"grpo{secrets.token_hex(2)}-probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` refused: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def namespace_pids(netns: str) -> list[int]:
    done = _ip("netns", "pids", netns, check=False)
    return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []


@dataclass
class Host:
    """One machine of the topology: a network namespace with one link (``eth0`` inside) on the bridge."""
    name: str
    netns: str
    address: str
    link: str  # the root namespace's end of the host's veth pair, a port of the bridge
    shaper: subprocess.Popen | None = field(default=None, repr=False)

    def command(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *argv]

    def popen(self, argv: list[str], log: Path, env: dict[str, str] | None = None,
              cwd: str | Path | None = None) -> subprocess.Popen:
        """Start ``argv`` on this host (its output appended to ``log``)."""
        with open(log, "ab") as out:
            return subprocess.Popen(self.command(argv), stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                    stdin=subprocess.DEVNULL, start_new_session=True)

    def run(self, argv: list[str], env: dict[str, str] | None = None, timeout: float = 120,
            check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(self.command(argv), capture_output=True, text=True, env=env, timeout=timeout)
        if check and done.returncode != 0:
            raise TopologyError(f"on {self.name}: `{' '.join(argv)}` failed ({done.returncode}):\n"
                                f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done

    def pids(self) -> list[int]:
        return namespace_pids(self.netns)

    def kill_all(self, timeout: float = 30.0) -> int:
        """SIGKILL every process on this host (the machine is lost) and wait until none is left. Returns how many
        were killed."""
        killed: set[int] = set()
        deadline = time.monotonic() + timeout
        while pids := self.pids():
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                except ProcessLookupError:
                    pass
            if time.monotonic() > deadline:
                raise TopologyError(f"processes {pids} on {self.name} survived SIGKILL for {timeout:.0f}s")
            time.sleep(0.05)
        self.shaper = None
        return len(killed)

    def cut(self) -> None:
        """Partition the host: its link goes down (packets to and from it are lost; its processes live on)."""
        _ip("link", "set", self.link, "down")

    def heal(self) -> None:
        _ip("link", "set", self.link, "up")

    def shape(self, delay_ms: float, loss: float, workdir: Path) -> None:
        """Every packet this host receives is dropped with probability ``loss``, else held ``delay_ms`` before its
        socket sees it (so a round trip between two shaped hosts takes at least 2 x ``delay_ms``).

        Why on the way in: a packet held on the way out still counts against its TCP socket's small-queue budget
        (TSQ), which then throttles the sender to a few packets per hold (1 MB took 70 s at 200 ms); one held after
        the veth has left its sender's socket. Segmentation offload is off (``gso_max_segs 1``), so a lost packet
        is one MTU-sized segment, as on a wire, not a 64 KiB burst."""
        if shutil.which("iptables") is None:
            raise TopologyError("shaping a link needs iptables (Debian package iptables)")
        self.run(["ip", "link", "set", "eth0", "gso_max_segs", "1"])
        if loss > 0:
            self.run(["iptables", "-A", "INPUT", "-i", "eth0", "-m", "statistic", "--mode", "random",
                      "--probability", f"{loss:g}", "-j", "DROP"])
        if delay_ms > 0:
            log = workdir / f"netshape-{self.name}.log"
            self.shaper = self.popen([sys.executable, "-m", "tests.netshape", "--queue", "0",
                                      "--delay-ms", f"{delay_ms:g}"], log, cwd=Path(__file__).resolve().parents[1])
            deadline = time.monotonic() + 30
            while "holds every packet" not in log.read_text():
                if self.shaper.poll() is not None or time.monotonic() > deadline:
                    raise TopologyError(f"the delay on {self.name} did not start:\n{log.read_text()}")
                time.sleep(0.05)
            self.run(["iptables", "-A", "INPUT", "-i", "eth0", "-j", "NFQUEUE", "--queue-num", "0",
                      "--queue-bypass"])

    def unshape(self) -> None:
        """Links as before ``shape``: the rules flushed, the delaying process stopped."""
        if shutil.which("iptables") is not None:
            self.run(["iptables", "-F", "INPUT"], check=False)
        self.run(["ip", "link", "set", "eth0", "gso_max_segs", "65535"], check=False)
        if self.shaper is not None:
            self.shaper.terminate()
            self.shaper.wait(timeout=30)
            self.shaper = None

    def listeners(self) -> list[tuple[str, int, str]]:
        """Every listening TCP socket on this host: (address, port, the owning process's command line)."""
        done = self.run(["ss", "-Hltnp"])
        out = []
        for line in done.stdout.splitlines():
            address, port = line.split()[3].rsplit(":", 1)
            pid = re.search(r"pid=(\d+)", line)
            try:
                with open(f"/proc/{pid.group(1)}/cmdline", "rb") as fh:
                    command = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except (AttributeError, OSError):
                command = "?"
            out.append((address.strip("[]").removeprefix("::ffff:"), int(port), command))
        return out


class Topology:
    """Hosts ``names`` on a new bridge, each in its own namespace at ``10.213.N.k`` (k = 2, 3, ...); the bridge is
    ``.1``. Use as a context manager: leaving it kills every process on every host and removes the namespaces and
    the bridge, then checks that nothing of it is left."""

    def __init__(self, names: list[str]):
        self.tag = f"grpo{secrets.token_hex(2)}"
        self.bridge = f"{self.tag}-br"
        self.subnet = self._free_subnet()
        hosts = list(self.subnet.hosts())
        self.gateway = str(hosts[0])
        self.hosts: dict[str, Host] = {
            name: Host(name, f"{self.tag}-{name}", str(hosts[i + 1]), f"{self.tag}-{i}") for i, name in enumerate(names)}

    @staticmethod
    def _free_subnet() -> ipaddress.IPv4Network:
        routes = _ip("-4", "route", "show", "table", "all").stdout
        used = [ipaddress.ip_network(w, strict=False) for w in re.findall(r"\b(\d+\.\d+\.\d+\.\d+(?:/\d+)?)\b",
                                                                          routes)]
        for _ in range(200):
            net = ipaddress.ip_network(f"10.213.{secrets.randbelow(254) + 1}.0/24")
            if not any(net.overlaps(u) for u in used):
                return net
        raise TopologyError("no free 10.213.N.0/24 subnet for the test bridge")

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def up(self) -> "Topology":
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for host in self.hosts.values():
                _ip("netns", "add", host.netns)
                _ip("link", "add", host.link, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
                _ip("link", "set", host.link, "master", self.bridge)
                _ip("link", "set", host.link, "up")
                _ip("-n", host.netns, "addr", "add", f"{host.address}/{self.subnet.prefixlen}", "dev", "eth0")
                _ip("-n", host.netns, "link", "set", "eth0", "up")
                _ip("-n", host.netns, "link", "set", "lo", "up")
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Kill every process of every host, remove the namespaces and the bridge; raise if anything is left."""
        for host in self.hosts.values():
            if host.netns in _ip("netns", "list").stdout.split():
                host.kill_all()
                _ip("link", "del", host.link, check=False)  # both ends of the pair (the kernel frees them lazily
                _ip("netns", "del", host.netns, check=False)  # when only the namespace goes)
        _ip("link", "del", self.bridge, check=False)
        deadline = time.monotonic() + 15
        while left := [item for item in leftovers() if item.split()[1].startswith(self.tag)]:
            if time.monotonic() > deadline:
                raise TopologyError(f"topology {self.tag} left {left}")
            time.sleep(0.2)

    def __enter__(self) -> "Topology":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()


def leftovers() -> list[str]:
    """Namespaces and links that a topology made and did not remove, and processes still inside such namespaces."""
    out = []
    for line in _ip("netns", "list").stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if NAME.match(name):
            out.append(f"namespace {name}")
            out += [f"process {pid} (in {name})" for pid in namespace_pids(name)]
    for line in _ip("-o", "link", "show").stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if NAME.match(name):
            out.append(f"link {name}")
    return out


def main(argv: list[str]) -> int:
    """``python -m tests.netns check``: exit 1 (listing them) if a topology left anything behind."""
    if argv != ["check"]:
        print("usage: python -m tests.netns check", file=sys.stderr)
        return 2
    left = leftovers()
    for item in left:
        print(f"left behind: {item}")
    print("no test namespace, link or process left" if not left else f"{len(left)} thing(s) left behind")
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
