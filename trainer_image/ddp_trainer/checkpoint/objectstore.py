"""Checkpoints as objects in an S3-compatible bucket (AWS S3, MinIO, Ceph RGW, GCS's XML API, ...), for
:mod:`ddp_trainer.checkpoint.checkpoints` through the :class:`~ddp_trainer.checkpoint.stores.Store` interface.

The protocol is MinIO's Python SDK (``minio``, the trainer's ``s3`` extra, imported only here and only
when ``--checkpoint-dir`` is an ``s3://`` URL): a small, well-kept client for any S3-compatible store,
with signature v4, retries and multipart uploads, and none of botocore's pins (which the Kubernetes
client's clash with). A checkpoint is one object, ``<prefix>/step-XXXXXXXX.<job>.pt``, published by one
PUT (a multipart upload beyond the SDK's part size): S3 shows an object only once the upload is complete,
so a trainer killed mid-upload leaves no object, and the sha256 in the header (:mod:`provenance`) catches
anything else. Credentials come from the files of the mounted Secret (``DDPJOB_S3_CREDENTIALS``), else the
client's chain (environment, ``~/.aws``, a pod or instance role); never from the spec, never logged.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

from minio import Minio
from minio.credentials.providers import (
    AWSConfigProvider,
    ChainedProvider,
    IamAwsProvider,
    Provider,
    StaticProvider,
)
from minio.error import S3Error

from ddp_trainer import contract
from ddp_trainer.checkpoint.stores import StoreRefused

T = TypeVar("T")
# What S3 answers when the fault is the configuration, not the moment (no retry helps).
REFUSALS = {
    "InvalidAccessKeyId": "the access key id is not known to the store",
    "SignatureDoesNotMatch": "the secret access key does not match the access key id",
    "AccessDenied": "the credentials may not use this bucket or prefix",
    "NoSuchBucket": "the bucket does not exist",
    "InvalidBucketName": "the bucket name is not valid",
    "AuthorizationHeaderMalformed": "the region does not match the bucket's",
    "PermanentRedirect": "the bucket is in another region or at another endpoint",
}


MISSING = ("NoSuchKey", "NoSuchObject", "ResourceNotFound")
"""What S3 answers for an object that is not there: the folder store's ``FileNotFoundError``."""


def credentials(env: Mapping[str, str]) -> Provider:
    """The mounted Secret's two files when ``DDPJOB_S3_CREDENTIALS`` names a folder that has them; else
    ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` of ``env`` (local mode: exported by the user); else the
    AWS config files, then a pod or instance role (IRSA's web identity, EC2, ECS)."""
    folder = env.get(contract.S3_CREDENTIALS_ENV)
    if folder:
        key, secret = Path(folder, contract.S3_ACCESS_KEY_FILE), Path(folder, contract.S3_SECRET_KEY_FILE)
        if key.is_file() and secret.is_file():
            return StaticProvider(key.read_text().strip(), secret.read_text().strip())
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        return StaticProvider(
            env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"], env.get("AWS_SESSION_TOKEN")
        )
    return ChainedProvider([AWSConfigProvider(), IamAwsProvider()])


class S3Store:
    """One prefix of one bucket."""

    def __init__(self, client: Minio, bucket: str, prefix: str, endpoint: str) -> None:
        self.client, self.bucket, self.endpoint = client, bucket, endpoint
        self.prefix = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        self.where = f"{contract.S3_SCHEME}{bucket}/{self.prefix}"

    @classmethod
    def from_url(cls, url: str, env: Mapping[str, str]) -> S3Store:
        """``s3://bucket/prefix`` at ``DDPJOB_S3_ENDPOINT`` (default AWS S3) in ``DDPJOB_S3_REGION``."""
        bucket, _, prefix = url[len(contract.S3_SCHEME) :].partition("/")
        endpoint = env.get(contract.S3_ENDPOINT_ENV) or "https://s3.amazonaws.com"
        parsed = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        client = Minio(
            parsed.netloc,
            secure=parsed.scheme == "https",
            region=env.get(contract.S3_REGION_ENV) or None,
            credentials=credentials(env),
        )
        return cls(client, bucket, prefix, endpoint)

    def _refused(self, err: S3Error) -> StoreRefused:
        why = REFUSALS.get(err.code or "", "")
        return StoreRefused(
            f"{self.where} at {self.endpoint}: {err.code}: {err.message}" + (f" ({why})" if why else "")
        )

    def _call(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``call``, its configuration errors raised as :class:`StoreRefused`."""
        try:
            return call(*args, **kwargs)
        except S3Error as err:
            if err.code in REFUSALS:
                raise self._refused(err) from None
            if err.code in MISSING:  # gone between a listing and a read (another job pruned its own)
                raise FileNotFoundError(f"{self.where}{err.object_name or ''}: {err.code}") from None
            raise
        except ValueError as err:
            if "credentials" not in str(err):
                raise
            raise StoreRefused(f"{self.where} at {self.endpoint}: no credentials: {err}") from None

    def names(self) -> list[str]:
        found = self.client.list_objects(self.bucket, prefix=self.prefix)  # lazy: errors come while iterating
        return self._call(lambda: [o.object_name[len(self.prefix) :] for o in found if not o.is_dir])

    def read(self, name: str) -> bytes:
        return self.head(name, 0)

    def head(self, name: str, size: int) -> bytes:
        """``size`` 0: the whole object."""
        response = self._call(self.client.get_object, self.bucket, self.prefix + name, length=size)
        try:
            data: bytes = response.read()
            return data
        finally:
            response.close()
            response.release_conn()

    def exists(self, name: str) -> bool:
        try:
            self._call(self.client.stat_object, self.bucket, self.prefix + name)
        except FileNotFoundError:
            return False
        return True

    def publish(self, name: str, data: bytes) -> None:
        self._call(self.client.put_object, self.bucket, self.prefix + name, io.BytesIO(data), len(data))

    def remove(self, name: str) -> None:
        self._call(self.client.remove_object, self.bucket, self.prefix + name)

    def location(self, name: str) -> str:
        return f"{self.where}{name}"
