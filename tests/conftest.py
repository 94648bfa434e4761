"""Suite-wide: the real control plane's fixtures (``cluster``, ``namespace``) for every `cluster` test."""

pytest_plugins = ["cluster_fixtures"]
