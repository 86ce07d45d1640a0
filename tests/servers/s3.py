"""A real S3 API for the object-storage tests (tests/integration/test_object_storage.py): moto's
server (``pip install 'moto[server]'``, in the ``test`` extra) started on 127.0.0.1 on a
free port, and stopped by its PID afterwards.

:func:`running_s3` yields an :class:`S3Server`: its endpoint, a boto3 client on it, and
the environment a ``loadgen`` process needs to reach it (test credentials, the endpoint
through ``LOADGEN_STORAGE_OPTION``, nothing of the caller's AWS configuration).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from typing import Any, Dict, Iterator, List

from tests.servers.procs import ServerProcess, free_port, require_servers

__all__ = ["INSTALL_HINT", "S3Server", "available", "running_s3", "s3_environment"]

INSTALL_HINT = "pip install 'moto[server]' s3fs (both in the test extra: pip install '.[test]')"
START_TIMEOUT_S = 60.0


def available() -> bool:
    """Whether moto's server, boto3 and s3fs can be imported here."""
    return all(importlib.util.find_spec(m) is not None for m in ("moto", "flask", "boto3", "s3fs"))


def s3_environment(endpoint: str) -> Dict[str, str]:
    """The variables a process needs for the test server: test credentials, the region,
    the endpoint; the caller's AWS profile and files are not read."""
    return {
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true", "LOADGEN_STORAGE_OPTION": f"endpoint_url={endpoint}",
    }


class S3Server:
    """A running moto server.

    Attributes:
        endpoint: its URL (http://127.0.0.1:PORT).
        process: the server process (stop it, or kill it, by its PID).
        env: :func:`s3_environment` for it.
    """

    def __init__(self, process: ServerProcess, endpoint: str) -> None:
        self.process = process
        self.endpoint = endpoint
        self.env = s3_environment(endpoint)
        self._client: Any = None

    @property
    def client(self) -> Any:
        """A boto3 S3 client on the server."""
        if self._client is None:
            import boto3

            self._client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                                        aws_access_key_id="testing", aws_secret_access_key="testing")
        return self._client

    def create_bucket(self, name: str) -> None:
        self.client.create_bucket(Bucket=name)

    def keys(self, bucket: str, prefix: str = "") -> List[str]:
        """The keys under ``prefix``, sorted."""
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def get(self, bucket: str, key: str) -> bytes:
        return self.client.get_object(Bucket=bucket, Key=key)["Body"].read()

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=bucket, Key=key, Body=data)


@contextlib.contextmanager
def running_s3(log_dir: str) -> Iterator[S3Server]:
    """moto's server on 127.0.0.1, stopped by its PID at the end; skips (fails where
    servers are required) when moto is not installed."""
    if not available():
        import pytest

        if require_servers():
            pytest.fail(f"moto's server is not installed: {INSTALL_HINT}")
        pytest.skip(f"moto's server is not installed: {INSTALL_HINT}")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    process = ServerProcess([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            os.path.join(log_dir, f"moto-{port}.log"))
    try:
        process.wait_http_ok(f"{endpoint}/moto-api/data.json", START_TIMEOUT_S)
        yield S3Server(process, endpoint)
    finally:
        process.stop()
