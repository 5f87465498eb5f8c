"""The weight transports behind one interface: one class per kind, chosen by the factory, asked what it can do."""
from __future__ import annotations

import typing

import pytest

from grpo_core.config import ConfigError, WeightsConfig, build_config
from grpo_core.config.placements import placement_of
from grpo_core.weights.factory import make_transport, transport_classes
from grpo_core.weights.transport import Transport
from tests.conftest import tiny_config


def test_every_configurable_kind_has_one_class_and_the_factory_refuses_others():
    kinds = set(typing.get_args(WeightsConfig.model_fields["transport"].annotation)) - {"auto"}
    classes = transport_classes()
    assert set(classes) == kinds
    assert all(issubclass(cls, Transport) and cls.kind == kind for kind, cls in classes.items())
    assert {kind: type(make_transport(kind)).__name__ for kind in kinds} == {
        "inprocess": "InProcessTransport", "files": "FilesTransport", "broadcast": "BroadcastTransport",
        "cuda_ipc": "CudaIpcTransport"}
    with pytest.raises(ValueError, match=r"weights.transport='carrier_pigeon': expected one of"):
        make_transport("carrier_pigeon")


def test_what_each_kind_can_do_is_stated_on_its_class():
    can = {kind: (cls.placements, cls.carries_adapter, cls.forms_group, cls.needs_cuda)
           for kind, cls in transport_classes().items()}
    assert can == {"inprocess": (("colocate",), True, False, False),
                   "files": (("colocate", "split", "external"), True, False, False),
                   "broadcast": (("split", "external"), False, True, False),
                   "cuda_ipc": (("split",), False, True, True)}
    # the sampler engine is built with a vLLM backend only for the kinds that form a transfer group
    assert make_transport("files").sampler_backend() is None and make_transport("inprocess").sampler_backend() is None
    assert make_transport("broadcast").sampler_backend() in ("gloo", "nccl")


@pytest.mark.parametrize("placement,lora,kind", [("colocate", False, "inprocess"), ("colocate", True, "inprocess"),
                                                 ("split", False, "broadcast"), ("split", True, "files"),
                                                 ("external", False, "files"), ("external", True, "files")])
def test_auto_picks_a_kind_that_passes_its_own_checks(placement, lora, kind, tmp_path):
    assert placement_of(placement).auto_transport(lora) == kind
    extra = {"cluster__servers": ["http://127.0.0.1:1"], "cluster__samplers": 1} if placement == "external" else {}
    if lora:
        extra["model__lora"] = {}
    cfg = build_config(tiny_config("unused-model", str(tmp_path), cluster__placement=placement, **extra))
    assert cfg.transport == kind  # build_config ran the kind's check


@pytest.mark.parametrize("kind,placement,message", [
    ("inprocess", "split", r"weights.transport=inprocess needs sampler and learner in one actor"),
    ("broadcast", "colocate", r"weights.transport=broadcast moves weights between separate actors: it needs "
                              r"cluster.placement=split or external"),
    ("cuda_ipc", "colocate", r"weights.transport=cuda_ipc moves weights .* it needs cluster.placement=split \("),
    ("cuda_ipc", "external", r"weights.transport=cuda_ipc cannot reach a server process"),
])
def test_a_kind_refuses_a_placement_it_cannot_serve(kind, placement, message, tmp_path):
    extra = {"cluster__servers": ["http://127.0.0.1:1"], "cluster__samplers": 1} if placement == "external" else {}
    with pytest.raises(ConfigError, match=message):
        build_config(tiny_config("unused-model", str(tmp_path), cluster__placement=placement,
                                 weights__transport=kind, **extra))
