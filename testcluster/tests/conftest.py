"""Fixtures for the test cluster's own tests (see fixtures.py)."""

from testcluster.fixtures import cluster, namespace, pytest_collection_finish

__all__ = ["cluster", "namespace", "pytest_collection_finish"]
