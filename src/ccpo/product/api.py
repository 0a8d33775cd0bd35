"""Deprecated: the Python API lives in :mod:`ccpo.api`."""

from ccpo.api import *  # noqa: F403
from ccpo.api import API_METHODS, ConformalPolicy, PredictedSet  # noqa: F401
