"""pytest plugin: the test cluster's fixtures (``cluster``, ``namespace``) for the whole suite.

Register it in ``tests/conftest.py`` with ``pytest_plugins = ["cluster_fixtures"]``; see
``tests/cluster/fixtures.py``.
"""

from cluster.fixtures import cluster, namespace, pytest_collection_finish

__all__ = ["cluster", "namespace", "pytest_collection_finish"]
