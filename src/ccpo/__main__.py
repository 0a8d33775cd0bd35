"""``python -m ccpo``: the ``ccpo`` command line (:mod:`ccpo.cli`)."""

from ccpo.cli import run

if __name__ == "__main__":
    run()
