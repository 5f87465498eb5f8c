"""Which of this machine's addresses faces another host.

Why: on a machine with several interfaces (a cluster node, a network namespace, a laptop on a VPN) the hostname
often resolves to the wrong one, and a process that binds or advertises it is unreachable. The routing table knows
the right one: the source address the kernel would use to reach the peer.
"""
from __future__ import annotations

import socket


def local_address_towards(host: str) -> str:
    """The local address the kernel would use to reach ``host`` (no packet is sent: a UDP connect only routes)."""
    try:
        infos = socket.getaddrinfo(host, 1, type=socket.SOCK_DGRAM)
        family, _, _, _, addr = infos[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            return s.getsockname()[0]
    except OSError as exc:
        raise RuntimeError(f"cannot find a local address that reaches {host!r} (no route to it)") from exc


def listening_socket(address: str, port: int = 0) -> socket.socket:
    """A socket listening on ``address`` alone (``port`` 0: one the OS picks), for a server that must not listen on
    every interface, such as a torch ``TCPStore`` given it as ``master_listen_fd`` (alone it binds them all)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, port))
    sock.listen(128)
    return sock


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (another process may take it before it is bound: prefer binding port 0
    where the server allows it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
