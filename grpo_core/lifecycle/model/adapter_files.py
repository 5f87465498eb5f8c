"""What a peft LoRA adapter folder holds: the learner writes these files, samplers and exports read them."""
from __future__ import annotations

import os

# A folder holding this file is a peft adapter, not a full model.
ADAPTER_CONFIG = "adapter_config.json"
# The adapter's tensors.
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# What a sampler needs to load an adapter folder (the store copies these when it is remote).
ADAPTER_FILES = (ADAPTER_CONFIG, ADAPTER_WEIGHTS)


def is_adapter_dir(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, ADAPTER_CONFIG))
