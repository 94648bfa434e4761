"""Checkpoints in object storage on the real control plane: the bucket on a real S3 server (MinIO,
tests/helpers/s3server.py) that the pods reach through the host, the
credentials in a Secret that the real nodes'
kubelets give the trainer containers. A pod deleted mid-run (SIGTERM: a preemption) leaves a checkpoint in
the bucket and the gang resumes from it; a second DDPJob pointed at the same prefix refuses the first
one's checkpoints and fails at once; the secret appears in no status or event."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from helpers.e2e import Operator, get, real_ddpjob, wait_phase
from helpers.e2e_pods import apply_doc, checkpointing_trainer, events_text, pod_name_at
from helpers.s3server import S3Server
from testcluster.fixtures import Cluster, wait_for
from testcluster.layout import BRIDGE_IP
from testcluster.nodeconfig import RealNode

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_a_deleted_pod_resumes_from_the_bucket_and_another_job_there_is_refused(
    cluster: Cluster, operator: Operator, namespace: str, s3_server: S3Server, real_nodes: list[RealNode]
) -> None:
    bucket = s3_server.bucket()
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s3-creds"},
        "stringData": {
            "AWS_ACCESS_KEY_ID": s3_server.access_key,
            "AWS_SECRET_ACCESS_KEY": s3_server.secret_key,
        },
    }
    apply_doc(cluster, namespace, secret)
    s3 = {
        "endpoint": s3_server.endpoint_at(BRIDGE_IP),
        "bucket": bucket,
        "prefix": "team",
        "credentialsSecret": {"name": "s3-creds"},
    }
    apply_doc(cluster, namespace, real_ddpjob("bucketed", **checkpointing_trainer(s3=s3)))
    client: Any = s3_server.client()
    wait_for(
        lambda: list(client.list_objects(bucket, prefix="team/")),
        what=f"a checkpoint in s3://{bucket}/team/",
        timeout=240,
    )
    cluster.kubectl(
        "delete", "pod", "-n", namespace, pod_name_at(cluster, namespace, "bucketed", 1), "--wait=false"
    )
    status = wait_phase(cluster, namespace, "bucketed", "Succeeded", "Failed", timeout=300)["status"]
    assert status["phase"] == "Succeeded", status
    assert (status["attempt"], status.get("preemptions")) == (2, 1), events_text(
        cluster, namespace, "bucketed"
    )
    assert status["checkpoint"]["resumedFromStep"] > 0, status
    durable = {c["type"]: c for c in status["conditions"]}["CheckpointsDurable"]
    assert (durable["status"], durable["reason"]) == ("True", "ObjectStorage"), durable

    started = time.monotonic()
    apply_doc(cluster, namespace, real_ddpjob("intruder", **checkpointing_trainer(s3=s3)))
    failed = wait_phase(cluster, namespace, "intruder", "Succeeded", "Failed", timeout=180)["status"]
    print(f"the second job failed {time.monotonic() - started:.1f}s after kubectl apply")
    assert failed["phase"] == "Failed" and failed["restarts"] == 0, failed
    said = json.dumps(failed)
    assert "ForeignCheckpoint" in said and f"{namespace}/bucketed" in said, said
    for job in ("bucketed", "intruder"):
        seen = json.dumps(get(cluster, namespace, job)) + events_text(cluster, namespace, job)
        assert s3_server.secret_key not in seen
