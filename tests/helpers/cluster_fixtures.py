"""pytest plugin: the test cluster's fixtures (``cluster``, ``namespace``, ``real_nodes``) for the suite.

Registered in ``tests/conftest.py`` (``pytest_plugins``); the fixtures are the test cluster's own,
``testcluster/fixtures.py``.
"""

from testcluster.fixtures import cluster, namespace, pytest_collection_finish
from testcluster.realfixture import real_nodes

__all__ = ["cluster", "namespace", "pytest_collection_finish", "real_nodes"]
