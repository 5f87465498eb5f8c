"""The run as an Atropos trainer (``atropos`` in the config): atroposlib's API server and environments, outside
processes, sample through the run's policy endpoint and hand back scored groups, which the run pulls and trains on.
"""
