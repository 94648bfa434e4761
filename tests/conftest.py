"""Suite-wide: the real control plane's fixtures (``cluster``, ``namespace``) for every `cluster` test, and a
real S3 server (``s3_server``: MinIO) for the object-storage tests."""

pytest_plugins = ["cluster_fixtures", "s3server"]
