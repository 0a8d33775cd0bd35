"""Moved to :mod:`ccpo.policies` (kept so that imports of ``ccpo.learning.artifact`` work)."""

# ruff: noqa: F401

from ccpo.policies.folder import (
    ARTIFACT_FORMAT,
    read_meta,
    read_side_files,
    write_folder,
)
