"""pytest plugin: the test cluster's fixtures (``cluster``, ``namespace``, ``real_nodes``) for the suite.

Register it in ``tests/conftest.py`` with ``pytest_plugins = ["cluster_fixtures"]``; see
``tests/cluster/fixtures.py``.
"""

from cluster.fixtures import cluster, namespace, pytest_collection_finish
from cluster.realfixture import real_nodes

__all__ = ["cluster", "namespace", "pytest_collection_finish", "real_nodes"]
