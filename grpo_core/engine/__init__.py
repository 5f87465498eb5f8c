"""The compute plane's engines, as they run inside one Ray actor (``worker.py``, ``EngineWorker``): the sampler role
over vLLM (``roles/sampler.py``, ``rollout/``) and the learner rank over DeepSpeed (``roles/learner.py``, ``train/``),
with the typed results that cross back to the driver (``results.py``) and the dtype rules of both (``precision.py``).
Placed and driven by ``grpo_core.cluster``; Ray itself is imported only there."""
