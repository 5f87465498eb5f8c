"""A policy's life around the runs: the built-in models and imports (``model/``), offline evaluation
(``offline_eval.py``), the eval gate and its decision (``gate.py``, ``promotion.py``), the model registry
(``registry/``), lineage (``lineage.py``) and serving a policy (``serve.py``)."""
