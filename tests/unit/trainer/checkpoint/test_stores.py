"""Checkpoints in object storage (:mod:`ddp_trainer.checkpoint.objectstore`) against a real S3 server (MinIO,
see
tests/helpers/s3server.py): every guarantee the folder gives — identity, integrity, the foreign-checkpoint
refusal, keep-N, other jobs' objects never touched, a half-written checkpoint never chosen — and wrong
credentials or a missing bucket refused at once, naming the cause and never the secret."""

from __future__ import annotations

import io
import time
from typing import Any

import pytest
import torch

from ddp_trainer import contract
from ddp_trainer.checkpoint import checkpoints, payload, provenance, stores
from ddp_trainer.checkpoint.objectstore import S3Store
from helpers.s3server import S3Server
from helpers.trained import ME, OTHER, trained_state


def _store(server: S3Server, bucket: str, prefix: str = "team/run") -> S3Store:
    return S3Store.from_url(f"s3://{bucket}/{prefix}", server.env())


def _save(store: S3Store, steps: list[int], writer: provenance.Writer = ME, keep: int = 100) -> None:
    state = trained_state()
    for step in steps:
        state.step = step
        assert checkpoints.save(store, state, writer, keep) is not None


def _objects(server: S3Server, bucket: str) -> list[str]:
    client: Any = server.client()
    return sorted(o.object_name for o in client.list_objects(bucket, recursive=True))


def test_checkpoints_in_a_bucket_keep_every_guarantee(s3_server: S3Server) -> None:
    bucket = s3_server.bucket()
    store = _store(s3_server, bucket)
    _save(store, [5, 25], writer=OTHER)
    _save(store, [10, 20, 30], keep=2)
    assert _objects(s3_server, bucket) == [
        "team/run/step-00000005.other.pt",
        "team/run/step-00000020.mine.pt",
        "team/run/step-00000025.other.pt",
        "team/run/step-00000030.mine.pt",
    ]  # keep=2 of mine; the other job's never removed
    choice = checkpoints.choose_on_rank0(store, ME, "")
    assert (choice.action, choice.step, choice.file) == ("resume", 30, "step-00000030.mine.pt")
    restored, saved = trained_state(seed=1), trained_state()
    assert choice.payload is not None
    payload.load_into(restored, choice.payload, torch.device("cpu"))
    assert restored.step == 30
    for mine, theirs in zip(restored.model.parameters(), saved.model.parameters(), strict=True):
        assert torch.equal(mine, theirs)
    # the newest object corrupted in the store (a torn write another tool left): skipped, named
    client: Any = s3_server.client()
    data = client.get_object(bucket, "team/run/step-00000030.mine.pt").read()
    client.put_object(bucket, "team/run/step-00000030.mine.pt", io.BytesIO(data[:-7]), len(data) - 7)
    choice = checkpoints.choose_on_rank0(store, ME, "")
    assert (choice.action, choice.step) == ("resume", 20), choice
    assert choice.skipped and choice.skipped[0].startswith("step-00000030.mine.pt: "), choice.skipped


def test_an_upload_never_completed_is_never_chosen(s3_server: S3Server) -> None:
    """A trainer killed mid-upload: the parts are on the server, the object is not (S3 publishes a
    multipart upload only when it completes), so the checkpoint before it is chosen."""
    bucket = s3_server.bucket()
    store = _store(s3_server, bucket)
    _save(store, [10])
    client: Any = s3_server.client()
    name = "team/run/step-00000020.mine.pt"
    upload = client._create_multipart_upload(bucket, name, {})
    client._upload_part(bucket, name, b"x" * (5 * 1024 * 1024), None, upload, 1)
    assert checkpoints.list_checkpoints(store) == [(10, "step-00000010.mine.pt")]
    assert checkpoints.choose_on_rank0(store, ME, "").step == 10


def test_another_jobs_checkpoint_under_the_prefix_is_refused(s3_server: S3Server) -> None:
    bucket = s3_server.bucket()
    store = _store(s3_server, bucket)
    _save(store, [10], writer=OTHER)
    choice = checkpoints.choose_on_rank0(store, ME, "")
    assert (choice.action, choice.reason) == ("refuse", contract.FOREIGN_CHECKPOINT), choice
    assert f"s3://{bucket}/team/run/" in choice.message and "team/other" in choice.message, choice.message
    assert checkpoints.choose_on_rank0(store, ME, "other").action == "warm"


@pytest.mark.parametrize(
    ("env", "code"),
    [
        ({"AWS_ACCESS_KEY_ID": "nobody"}, "InvalidAccessKeyId"),
        ({"AWS_SECRET_ACCESS_KEY": "not-the-secret-key"}, "SignatureDoesNotMatch"),
    ],
)
def test_wrong_credentials_are_refused_at_once_naming_the_cause_not_the_secret(
    s3_server: S3Server, env: dict[str, str], code: str
) -> None:
    bucket = s3_server.bucket()
    store = S3Store.from_url(f"s3://{bucket}/team/run", s3_server.env(**env))
    started = time.monotonic()
    choice = checkpoints.choose_on_rank0(store, ME, "")
    took = time.monotonic() - started
    assert (choice.action, choice.reason) == ("refuse", contract.CHECKPOINT_STORAGE_REFUSED), choice
    assert code in choice.message and f"s3://{bucket}/team/run/" in choice.message, choice.message
    assert "not-the-secret-key" not in choice.message and s3_server.secret_key not in choice.message
    assert took < 5, f"refused after {took:.1f}s: no retries for a configuration error"


def test_an_object_gone_between_listing_and_reading_is_a_missing_file(s3_server: S3Server) -> None:
    store = _store(s3_server, s3_server.bucket())
    assert not store.exists("step-00000010.mine.pt")
    with pytest.raises(FileNotFoundError):  # as in a folder: owner() and scan() pass it over
        store.read("step-00000010.mine.pt")
    assert checkpoints.owner(store, "step-00000010.mine.pt") is None


def test_a_missing_bucket_is_refused(s3_server: S3Server) -> None:
    store = S3Store.from_url("s3://no-such-bucket-here/x", s3_server.env())
    choice = checkpoints.choose_on_rank0(store, ME, "")
    assert (choice.reason, "NoSuchBucket" in choice.message) == (contract.CHECKPOINT_STORAGE_REFUSED, True)


def test_an_s3_url_opens_the_object_store_and_a_path_a_folder(tmp_path: Any) -> None:
    assert isinstance(checkpoints.open_store("s3://bucket/prefix"), S3Store)
    assert isinstance(checkpoints.open_store(str(tmp_path)), stores.DirectoryStore)


def test_the_mounted_secret_wins_over_the_environment(s3_server: S3Server, tmp_path: Any) -> None:
    (tmp_path / contract.S3_ACCESS_KEY_FILE).write_text(s3_server.access_key + "\n")
    (tmp_path / contract.S3_SECRET_KEY_FILE).write_text(s3_server.secret_key + "\n")
    bucket = s3_server.bucket()
    env = s3_server.env(AWS_ACCESS_KEY_ID="nobody", DDPJOB_S3_CREDENTIALS=str(tmp_path))
    store = S3Store.from_url(f"s3://{bucket}/", env)
    _save(store, [10])
    assert _objects(s3_server, bucket) == ["step-00000010.mine.pt"]  # no prefix: the bucket's root
