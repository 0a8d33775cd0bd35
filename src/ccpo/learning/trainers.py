"""Deprecated: training moved to :mod:`ccpo.learning.training` (one loop per mode).

Every name this module had still resolves here for one release, with a DeprecationWarning.
"""

from ccpo._deprecated import moved

__getattr__ = moved(__name__)  # the names and their new homes: ccpo._deprecated.MOVED
