"""Deprecated: policies moved to :mod:`ccpo.policies` (``from ccpo import load_policy``).

Every name this module had still resolves here for one release, with a DeprecationWarning.
"""

from ccpo._deprecated import moved

__getattr__ = moved(__name__)  # the names and their new homes: ccpo._deprecated.MOVED
