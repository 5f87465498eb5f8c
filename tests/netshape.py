"""Latency on a test host's link without netem: an NFQUEUE listener that holds each packet for a fixed time.

Why: this machine's kernel has no ``sch_netem`` (``tc qdisc add ... netem`` answers "qdisc kind is unknown"), so the
usual way to delay a link is not there. Netfilter's queue is: an iptables rule in the host's namespace sends every
packet leaving its link to queue N (``-j NFQUEUE --queue-num N --queue-bypass``), and this process, started in the
same namespace, gives each packet its verdict ``delay_ms`` after it arrived. Loss is the kernel's own
(``-m statistic --mode random --probability p -j DROP`` before the queue rule), so only the delay lives here.

The nfnetlink_queue protocol is spoken directly over a netlink socket (struct layouts from
``linux/netfilter/nfnetlink_queue.h``), so nothing beyond the standard library is needed. Only packet metadata is
copied to user space (``NFQNL_COPY_META``); the payload never leaves the kernel. With ``--queue-bypass`` on the rule,
packets pass undelayed if this process is gone.

    ip netns exec NS python -m tests.netshape --queue 0 --delay-ms 200
"""
from __future__ import annotations

import argparse
import collections
import errno
import os
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN = 1, 2, 3
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NF_ACCEPT = 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR, NLMSG_DONE = 2, 3
SO_RCVBUFFORCE = 33

_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid (host order)
_NFGENMSG = struct.Struct("!BBH")  # family, version, res_id (queue number, big endian)
_NLATTR = struct.Struct("=HH")  # len, type


def _attr(kind: int, payload: bytes) -> bytes:
    raw = _NLATTR.pack(_NLATTR.size + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def _message(kind: int, queue: int, attrs: bytes, seq: int, flags: int = NLM_F_REQUEST) -> bytes:
    body = _NFGENMSG.pack(socket.AF_UNSPEC, 0, queue) + attrs
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), (NFNL_SUBSYS_QUEUE << 8) | kind, flags, seq, 0) + body


def _attrs(data: bytes) -> dict[int, bytes]:
    out, i = {}, 0
    while i + _NLATTR.size <= len(data):
        length, kind = _NLATTR.unpack_from(data, i)
        if length < _NLATTR.size:
            break
        out[kind & 0x7FFF] = data[i + _NLATTR.size:i + length]
        i += (length + 3) & ~3
    return out


class DelayQueue:
    """One nfnetlink queue bound in this process's network namespace; every packet is accepted ``delay_s`` after it
    was queued (the delay is the same for all, so release order is arrival order and a deque suffices)."""

    def __init__(self, queue: int, delay_s: float, max_len: int = 65536):
        self.queue, self.delay_s = queue, delay_s
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 64 << 20)
        self.sock.bind((0, 0))
        self._seq = 0
        self.held: collections.deque[tuple[float, int]] = collections.deque()
        self.passed = 0
        self._config(_attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, socket.AF_INET)))
        self._config(_attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META)) +
                     _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", max_len)))

    def _config(self, attrs: bytes) -> None:
        """Send a config message and wait for its acknowledgement (a netlink error raises)."""
        self._seq += 1
        self.sock.send(_message(NFQNL_MSG_CONFIG, self.queue, attrs, self._seq, NLM_F_REQUEST | NLM_F_ACK))
        while True:
            data = self.sock.recv(65536)
            for kind, seq, payload in self._split(data):
                if kind == NLMSG_ERROR and seq == self._seq:
                    code = -struct.unpack_from("=i", payload)[0]
                    if code:
                        raise OSError(code, f"nfnetlink_queue config of queue {self.queue}: {os.strerror(code)}")
                    return

    @staticmethod
    def _split(data: bytes):
        i = 0
        while i + _NLMSGHDR.size <= len(data):
            length, kind, _flags, seq, _pid = _NLMSGHDR.unpack_from(data, i)
            if length < _NLMSGHDR.size:
                break
            yield kind, seq, data[i + _NLMSGHDR.size:i + length]
            i += (length + 3) & ~3

    def _verdict(self, packet_id: int) -> None:
        self._seq += 1
        self.sock.send(_message(NFQNL_MSG_VERDICT, self.queue,
                                _attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, packet_id)), self._seq))
        self.passed += 1

    def _take(self, data: bytes, now: float) -> None:
        for kind, _seq, payload in self._split(data):
            if kind & 0xFF != NFQNL_MSG_PACKET or (kind >> 8) != NFNL_SUBSYS_QUEUE:
                continue
            hdr = _attrs(payload[_NFGENMSG.size:]).get(NFQA_PACKET_HDR)
            if hdr is not None:
                self.held.append((now + self.delay_s, struct.unpack_from("!I", hdr)[0]))

    def run(self, stop: list[bool]) -> None:
        while not stop[0]:
            now = time.monotonic()
            while self.held and self.held[0][0] <= now:
                self._verdict(self.held.popleft()[1])
            wait = (self.held[0][0] - now) if self.held else 0.5
            try:
                ready, _, _ = select.select([self.sock], [], [], max(wait, 0.0))
            except InterruptedError:
                continue
            if not ready:
                continue
            try:
                data = self.sock.recv(1 << 20)
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:  # the kernel dropped queue messages: those packets are lost (loss)
                    continue
                raise
            self._take(data, time.monotonic())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queue", type=int, default=0)
    parser.add_argument("--delay-ms", type=float, required=True)
    args = parser.parse_args(argv)
    queue = DelayQueue(args.queue, args.delay_ms / 1000.0)
    stop = [False]

    def _stop(_signum, _frame):
        stop[0] = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    print(f"netshape: queue {args.queue} holds every packet {args.delay_ms:g} ms", flush=True)
    queue.run(stop)
    for _, packet_id in queue.held:  # let what is held go on the way out
        queue._verdict(packet_id)
    print(f"netshape: passed {queue.passed} packets", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
