"""The run folder and what is written to it: storage on any fsspec URL (``storage/``), checkpoints
(``checkpoint.py``), the run's status and controls (``status.py``), metrics sinks, the report, the terminal's
progress and the logs."""
