"""The e2e tier's fixture: the operator under test, one per session (tests/helpers/e2e.py)."""

from helpers.e2e import operator

__all__ = ["operator"]
