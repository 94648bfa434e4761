"""Helpers of the test tiers: fixtures, object builders, harness clients and the scripts that tests run
under torchrun or in pods. Nothing here is a test (docs/testing.md)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
