"""Shared fixtures: a real local S3 server (SeaweedFS) for the whole test session."""

from __future__ import annotations

import pytest

from grpo_core.s3server import S3ServerError, find_weed, start_s3_server

S3_TEST_BUCKET = "grpo-test"


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """Start ``weed mini`` on free loopback ports; yield endpoint, credentials and storage_options."""
    try:
        weed = find_weed()
    except S3ServerError as exc:
        pytest.skip(str(exc))
    server = start_s3_server(tmp_path_factory.mktemp("s3"), buckets=[S3_TEST_BUCKET], weed=weed)
    try:
        yield {
            "endpoint_url": server.endpoint_url,
            "key": server.key,
            "secret": server.secret,
            "bucket": S3_TEST_BUCKET,
            "storage_options": server.storage_options,
            "start_seconds": server.start_seconds,
            "log_path": str(server.log_path),
        }
    finally:
        server.stop()
