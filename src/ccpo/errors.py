"""Errors that the CLI turns into one clear line (no traceback unless ``--debug``)."""

from __future__ import annotations

import errno
import importlib
import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

#: errno values of a write the system refused part-way for want of room (or a failing disk)
NO_ROOM = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EIO})


class CCPOError(Exception):
    """Base class for every error a user can cause and fix (bad input, missing price, ...).

    ``exit_code`` is the CLI's: 2 (a usage or input error) unless a subclass says otherwise."""

    exit_code = 2


class MissingExtraError(CCPOError):
    """An optional dependency is not installed: the message names the ``pip install`` that
    brings it (exit code 2, like any input the user can fix)."""


def require_extra(module: str, extra: str, purpose: str) -> None:
    """Check, without importing it, that ``module`` is installed, else raise
    :class:`MissingExtraError`: "<purpose> needs <module>, which is not installed: pip install
    'ccpo[<extra>]'" (the extras are pyproject.toml's optional dependencies)."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or blocked in sys.modules
        found = False
    if not found:
        raise MissingExtraError(
            f"{purpose} needs {module}, which is not installed: pip install 'ccpo[{extra}]'"
        )


def import_extra(module: str, extra: str, purpose: str) -> ModuleType:
    """``import module``, or the :class:`MissingExtraError` of :func:`require_extra`."""
    require_extra(module, extra, purpose)
    return importlib.import_module(module)


class PartialError(CCPOError):
    """The run stopped part-way for a reason that is not the user's input (the system refused):
    exit code 1, as for a partial run; what was done is kept (rerun to finish)."""

    exit_code = 1


class OutputWriteError(PartialError):
    """An output could not be written to the end: the disk is full, a file grew past its limit,
    the disk failed. Not the user's input: exit code 1 (partial or failed), as for a run
    stopped part-way. What was written stays whole (``collect``: whole lines, rerun to finish;
    the other commands: no half-made output)."""


def write_error(path: object, e: OSError) -> CCPOError:
    """``path: cannot write (reason)`` as the error its cause calls for: an
    :class:`OutputWriteError` (exit 1) when the system ran out of room, else a
    :class:`CCPOError` (exit 2: an output that cannot be written, e.g. a read-only folder)."""
    cls = OutputWriteError if e.errno in NO_ROOM else CCPOError
    return cls(f"{path}: cannot write ({e.strerror or e})")


class TraceFormatError(CCPOError):
    """A trace file is malformed. Carries the file, the 1-based line and the offending field."""

    def __init__(self, path: str, line: int | None, field: str | None, message: str) -> None:
        self.path, self.line, self.field, self.message = str(path), line, field, message
        where = self.path if line is None else f"{self.path}:{line}"
        what = f"field '{field}': " if field else ""
        super().__init__(f"{where}: {what}{message}")


class UnknownModelPriceError(CCPOError):
    """Models without an entry in the price table (all of them at once, so that one price
    file fixes them all). Never priced silently at zero."""

    def __init__(self, model: str, *more: str) -> None:
        self.model, self.models = model, [model, *more]
        names = ", ".join(f"'{m}'" for m in self.models)
        entries = ", ".join(
            f'"{m}": {{"input_usd_per_mtok": 0.0, "output_usd_per_mtok": 0.0}}' for m in self.models
        )
        super().__init__(
            f"no price for model{'s' if more else ''} {names}. Add "
            f"{'them' if more else 'it'} to a price file, e.g. "
            f'{{"as_of": "YYYY-MM-DD", "source": "...", "models": {{{entries}}}}} '
            "and pass it with --prices FILE (0 is allowed for local models, but must be written)."
        )


class PhaseError(CCPOError):
    """An API phase was called out of order (e.g. ``predict_set`` before ``calibrate``)."""


@contextmanager
def failing_as(what: str) -> Iterator[None]:
    """Any error but a :class:`CCPOError` raised inside becomes one: "<what> failed
    (<ErrorType>: <its first line>)", chained to the original, so a command that runs a
    policy (``dry-run``, ``check``) ends in one line, never a traceback (``--debug`` shows
    it)."""
    try:
        yield
    except CCPOError:
        raise
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0]
        raise CCPOError(
            f"{what} failed ({type(e).__name__}: {first}); ccpo --debug shows where"
        ) from e
