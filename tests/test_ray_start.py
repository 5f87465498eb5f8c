"""A local Ray whose node did not come up in time (on a loaded machine the raylet gives its agents a fixed 15 s,
ray-project/ray#65983) is started again, and what the failed start left running is stopped; the node it starts has
no idle worker prestarted (none of the project's actors could use one)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

# In a process of its own (the suite's workers have a Ray already): the first ray.init leaves a process behind, as a
# failed node start leaves its GCS and raylet, and raises Ray's own message; the second is Ray's real start.
SCRIPT = r"""
import subprocess, time, psutil, ray
from grpo_core.cluster import ray_cluster

real_init, calls, left = ray.init, [], []

def failing_once(*args, **kwargs):
    calls.append(kwargs)
    if len(calls) == 1:
        left.append(subprocess.Popen(["sleep", "600"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        raise Exception("The current node timed out during startup. This could happen because some of the raylet "
                        "failed to startup or the GCS has become overloaded.")
    return real_init(*args, **kwargs)

ray.init = failing_once
ray_cluster.start_local_ray(num_cpus=1)
assert len(calls) == 2, calls
assert ray.is_initialized() and ray.cluster_resources()["CPU"] == 1
assert left[0].wait(timeout=30) is not None  # the failed start's process was stopped
time.sleep(2)  # Ray prestarts its idle workers as the driver connects: they would be there by now
workers = [" ".join(c.cmdline()).strip() for c in psutil.Process().children(recursive=True)
           if c.cmdline() and not c.cmdline()[0].endswith("raylet")]
assert not [w for w in workers if w.startswith("ray::IDLE") or "default_worker.py" in w], workers
ray.shutdown()

def refusing(*args, **kwargs):
    raise ValueError("not a start that timed out")

ray.init = refusing
try:
    ray_cluster.start_local_ray(num_cpus=1)
except ValueError as exc:
    print("other errors surface:", exc)
print("ok")
"""


def test_a_ray_start_that_timed_out_is_cleaned_up_and_tried_again():
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "other errors surface: not a start that timed out" in done.stdout
    assert done.stdout.rstrip().endswith("ok")
    assert "Ray's node did not come up (start 1 of 3" in done.stderr


def test_actors_of_a_local_ray_without_cuda_run_vllms_sampler_helpers_eagerly(monkeypatch):
    """torch.compile off in each actor of a local Ray on a machine without CUDA (Dynamo traced vLLM's rank helper at
    every actor's first request); with CUDA, or on a remote cluster whose actors may hold GPUs, it stays on. Both
    machines are asked here, whichever this one is."""
    import torch

    from grpo_core.cluster.ray_cluster import actor_env

    for cuda, local, expected in ((False, True, "1"), (False, False, None), (True, True, None)):
        with monkeypatch.context() as patch:
            patch.setattr(torch.cuda, "is_available", lambda cuda=cuda: cuda)
            assert actor_env(2, local=local).get("TORCH_COMPILE_DISABLE") == expected, (cuda, local)
