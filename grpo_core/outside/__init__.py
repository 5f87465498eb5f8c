"""The doors outside code drives a run through: the OpenAI-compatible policy endpoint (``endpoint/``) that outside
agents and environments sample from and finish episodes on, the Atropos trainer side (``atropos/``), the supervision
of the processes that fill the inbox (``source.py``), and the Tinker-compatible training service (``tinker/``)."""
