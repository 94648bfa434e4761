"""The project's PEP 517 build backend: setuptools' own (``setuptools.build_meta``), less one note.

An editable install (``pip install -e .``) of a project whose packages live in folders of other names
(``ddp_operator`` in ``operator/``, ``ddp_trainer`` in ``trainer_image/``) makes setuptools print, as a
warning framed in ``!!`` and asterisks, a note that is not a problem with the project: that a folder in the
working directory named like a package could shadow it (none here is). Pip shows a backend's warnings even
with ``-q``, so a newcomer's first install looked broken. This wrapper, the in-tree backend setuptools
documents for such tweaks (its ``build_meta`` page), ignores that category (``InformationOnly``) alone;
every real warning and error still prints.
"""

from __future__ import annotations

import warnings

from setuptools.build_meta import (
    build_editable,
    build_sdist,
    build_wheel,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)
from setuptools.warnings import InformationOnly

__all__ = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_editable",
    "prepare_metadata_for_build_wheel",
]

warnings.filterwarnings("ignore", category=InformationOnly)
