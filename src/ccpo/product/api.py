"""Deprecated: the Python API moved to :mod:`ccpo.api` (``from ccpo import ConformalPolicy``).

Every name of :mod:`ccpo.api` still resolves here, with a ``DeprecationWarning`` on use.
"""

from ccpo._deprecated import moved

__getattr__ = moved(__name__)
