"""Deprecated: the ``ccpo`` CLI lives in :mod:`ccpo.cli`."""

import sys

from ccpo.cli import app, main, run  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
