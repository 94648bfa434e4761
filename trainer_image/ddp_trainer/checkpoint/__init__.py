"""Checkpoints: atomic saves verified on restore (checkpoints), where they live (stores, objectstore), and
who wrote them (provenance)."""
