"""A Tinker-compatible training service: the field's training API (``forward_backward``, ``optim_step``,
``sample``, ``save_weights_for_sampler``, ``save_state`` / ``load_state``) on the project's engines, driven by the
unmodified ``tinker`` SDK and tinker-cookbook recipes.

``wire`` reads and writes the SDK's protobuf messages, ``futures`` holds the answers the SDK polls for, ``trainee``
is one training client's model and optimizer, ``snapshots`` samples from immutable sampler checkpoints on vLLM,
``service`` keeps sessions, models and checkpoints in order, ``server`` is the HTTP door. The protocol as read from
the SDK: ``docs/development/tinker-protocol.md``.
"""
