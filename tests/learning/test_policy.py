"""The policy artifact (learning/policy.py): what loading and using one imports."""

from __future__ import annotations

import subprocess
import sys


def _modules_after(code: str) -> set[str]:
    """The names in sys.modules after running ``code`` in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint('\\n'.join(sys.modules))"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return set(out.stdout.split())


def test_the_artifact_does_not_import_the_trainer():
    """learning/policy.py reads a folder with the config class and the numpy heads, not the
    training loop (arrows point inward: the trainer imports the artifact's pieces)."""
    mods = _modules_after("import ccpo.learning.policy")
    assert "ccpo.learning.policy" in mods
    assert "ccpo.learning.trainers" not in mods
