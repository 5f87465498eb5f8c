"""Processes and servers the rest stands on: the code sandbox (``sandbox/``), child processes under supervision,
loopback addresses, a uvicorn app on a thread, and the local S3 server."""
