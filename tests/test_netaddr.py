"""Which address a process advertises or binds when it talks to another host (grpo_core.infra.netaddr), and the address
the flow's driver joins a Ray cluster as (grpo_core.cluster.ray_cluster.driver_address)."""
from __future__ import annotations

import pytest

from grpo_core.infra.netaddr import local_address_towards


def test_the_address_facing_a_loopback_peer_is_loopback():
    assert local_address_towards("127.0.0.1") == "127.0.0.1"
    assert local_address_towards("localhost") in ("127.0.0.1", "::1")


def test_an_unresolvable_peer_is_named_in_the_error():
    with pytest.raises(RuntimeError, match="no-such-host.invalid"):
        local_address_towards("no-such-host.invalid")


def test_the_driver_joins_a_cluster_as_its_address_facing_the_head():
    from grpo_core.cluster.ray_cluster import driver_address

    assert driver_address("127.0.0.1:6380") == "127.0.0.1"
    assert driver_address("localhost:6380") == "127.0.0.1"
    assert driver_address("127.0.0.5:6379") == "127.0.0.1"  # the route to it leaves through lo
    assert driver_address("auto") is None  # Ray finds the cluster started on this machine, and its address
    assert driver_address("ray://head.example:10001") is None  # Ray Client: no raylet on the driver's machine
