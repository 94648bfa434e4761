"""A real S3 server for the tests: MinIO, built once per machine from the Go module proxy
(``hack/s3/build.sh``, like the control plane's binaries) and run as a plain process on a free port.

Why MinIO rather than a Python S3 server from PyPI (moto's server mode): MinIO is an S3 server people run
in production, so what the tests prove (signature v4, credentials refused with ``InvalidAccessKeyId`` /
``SignatureDoesNotMatch``, an object visible only once its upload completed, listing by prefix) is what a
store does, not what a mock of AWS chose to emulate; moto checks no credentials unless told to and needs
botocore, whose ``python-dateutil<3`` pin cannot be installed beside the Kubernetes client's
``>=3``. It starts in about a second; the build costs minutes once per machine (``make tools``).

Register the fixture with ``pytest_plugins = ["s3server"]`` (tests/conftest.py does).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "hack" / "s3" / "build.sh"
ACCESS_KEY = "ddpjob-test"
SECRET_KEY = f"ddpjob-{secrets.token_hex(12)}"  # per session: a test can look for it where it must not be


@dataclass
class S3Server:
    """A running MinIO: its URL, the root credentials, and a fresh bucket per test."""

    endpoint: str
    """For this machine's processes (local mode, the tests)."""
    port: int
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY

    def endpoint_at(self, host: str) -> str:
        """The URL from elsewhere: the test cluster's pods reach it at the bridge's address."""
        return f"http://{host}:{self.port}"

    def client(self, access_key: str | None = None, secret_key: str | None = None) -> object:
        from minio import Minio

        return Minio(
            self.endpoint.split("://", 1)[1],
            access_key=access_key or self.access_key,
            secret_key=secret_key or self.secret_key,
            secure=False,
        )

    def bucket(self) -> str:
        """A new empty bucket."""
        name = f"t-{uuid.uuid4().hex[:12]}"
        self.client().make_bucket(name)  # type: ignore[attr-defined]
        return name

    def env(self, **extra: str) -> dict[str, str]:
        """The trainer's environment for this server with the root credentials (local mode's way)."""
        return {
            "DDPJOB_S3_ENDPOINT": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            **extra,
        }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def binary() -> Path:
    """MinIO's binary, built first if this machine has none (saying so: it takes minutes)."""
    if subprocess.run(["bash", str(BUILD), "--check"], capture_output=True).returncode != 0:
        print(f"\nbuilding MinIO once for this machine ({BUILD}); a few minutes", flush=True)
    done = subprocess.run(["bash", str(BUILD)], stdout=subprocess.PIPE, text=True, check=True)
    return Path(done.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def running_minio(data: Path, log_path: Path) -> Iterator[S3Server]:
    """MinIO serving ``data`` on a free port of every address until the block ends (the benchmark uses
    it too); waits at most 30 s for it to answer, then says what it waited for."""
    port, console = _free_port(), ["--console-address", f"127.0.0.1:{_free_port()}"]
    # every address, so that the test cluster's pods (network namespaces behind its bridge) reach it too
    env = {**os.environ, "MINIO_ROOT_USER": ACCESS_KEY, "MINIO_ROOT_PASSWORD": SECRET_KEY}
    env["MINIO_BROWSER"] = "off"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [str(binary()), "server", str(data), "--quiet", "--address", f":{port}", *console],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        server = S3Server(f"http://127.0.0.1:{port}", port)
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{server.endpoint}/minio/health/live", timeout=1):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    process.kill()
                    raise RuntimeError(
                        f"MinIO did not answer on {server.endpoint} within 30 s; its log: {log_path}"
                    ) from None
                time.sleep(0.1)
        try:
            yield server
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    data = tmp_path_factory.mktemp("minio")
    with running_minio(data, data.parent / "minio.log") as server:
        yield server
