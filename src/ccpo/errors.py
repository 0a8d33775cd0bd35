"""Errors that the CLI turns into one clear line (no traceback unless ``--debug``)."""

from __future__ import annotations


class CCPOError(Exception):
    """Base class for every error a user can cause and fix (bad input, missing price, ...)."""


class TraceFormatError(CCPOError):
    """A trace file is malformed. Carries the file, the 1-based line and the offending field."""

    def __init__(self, path: str, line: int | None, field: str | None, message: str) -> None:
        self.path, self.line, self.field, self.message = str(path), line, field, message
        where = self.path if line is None else f"{self.path}:{line}"
        what = f"field '{field}': " if field else ""
        super().__init__(f"{where}: {what}{message}")


class UnknownModelPriceError(CCPOError):
    """A model has no entry in the price table. Never priced silently at zero."""

    def __init__(self, model: str) -> None:
        self.model = model
        super().__init__(
            f"no price for model '{model}'. Add it to a price file, e.g. "
            f'{{"as_of": "YYYY-MM-DD", "source": "...", "models": {{"{model}": '
            f'{{"input_usd_per_mtok": 0.0, "output_usd_per_mtok": 0.0}}}}}} '
            "and pass it with --prices FILE (0 is allowed for local models, but must be written)."
        )


class PhaseError(CCPOError):
    """An API phase was called out of order (e.g. ``predict_set`` before ``calibrate``)."""
