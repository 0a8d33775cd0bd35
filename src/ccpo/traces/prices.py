"""Price tables: cost is never stored, it is ``usage × price`` at read time.

Price-file format (a contract: docs/design.md, "Price file")::

    {"as_of": "2026-11-01", "source": "...",
     "models": {"gpt-4o": {"input_usd_per_mtok": 2.5, "output_usd_per_mtok": 10.0}}}

Entries may carry their own ``as_of`` and ``source``. Every command takes ``--prices FILE``,
merged over the bundled table (:func:`load_prices`, the one place tables are merged). An
unknown model is an error (:class:`~ccpo.errors.UnknownModelPriceError`), never a silent zero.

Prices are JSON numbers (``"2.5"``, a string, is refused) and the text fields strings; an error
names the file, the line of the offending field where it can be found, and the field. A price
file is read whole, so it may hold at most the line cap's bytes
(:func:`ccpo.traces.io.max_line_bytes`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ccpo.errors import CCPOError, UnknownModelPriceError
from ccpo.traces.io import loads_strict, max_line_bytes


class ModelPrice(BaseModel):
    """List price of one model in USD per million tokens."""

    model_config = ConfigDict(extra="forbid")
    input_usd_per_mtok: float = Field(ge=0, strict=True)
    output_usd_per_mtok: float = Field(ge=0, strict=True)
    as_of: str | None = None
    source: str | None = None


class PriceFile(BaseModel):
    """A price file as written on disk."""

    model_config = ConfigDict(extra="allow")
    as_of: str
    source: str
    models: dict[str, ModelPrice]


@dataclass
class PriceTable:
    """Model name → price. Look-ups are exact, then case-insensitive."""

    models: dict[str, ModelPrice] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)

    def price(self, model: str) -> ModelPrice:
        if model in self.models:
            return self.models[model]
        low = model.lower()
        for name, p in self.models.items():
            if name.lower() == low:
                return p
        raise UnknownModelPriceError(model)

    def cost(self, model: str, input_tokens: int, output_tokens: int) -> float:
        """Dollars for one call: tokens × USD per million tokens."""
        p = self.price(model)
        return (input_tokens * p.input_usd_per_mtok + output_tokens * p.output_usd_per_mtok) / 1e6

    def usage_cost(self, model: str, usage: Any) -> float:
        """Dollars for one step's ``usage`` (``input_tokens``, ``output_tokens``) by ``model``."""
        return self.cost(model, usage.input_tokens, usage.output_tokens)

    def round_costs(self, r: Any) -> tuple[float, float]:
        """Dollars of one round (a trace's, or a live one) as (base, guide): the one definition
        of a round's cost (policy-LLM decisions are priced apart, by the policies that use
        them). A free-text verdict call (the round's ``signals.verdict``, made by the guide's
        model) is part of the guide's cost."""
        guide = self.usage_cost(r.guide.model, r.guide.usage)
        verdict = getattr(getattr(r, "signals", None), "verdict", None)
        if verdict is not None:
            guide += self.usage_cost(verdict.model, verdict.usage)
        return self.usage_cost(r.base.model, r.base.usage), guide

    def round_cost(self, r: Any) -> float:
        """Dollars of one round: base + guide (:meth:`round_costs`)."""
        return sum(self.round_costs(r))

    def check(self, models: Iterable[str]) -> None:
        """Raise for every model without a price, all named in one error (so errors come
        before any work, and one price file fixes them)."""
        missing = [m for m in sorted(set(models)) if not self.has(m)]
        if missing:
            raise UnknownModelPriceError(*missing)

    def has(self, model: str) -> bool:
        """Whether ``model`` has a price (:meth:`price`'s look-up)."""
        try:
            self.price(model)
        except UnknownModelPriceError:
            return False
        return True

    def merged(self, other: PriceTable) -> PriceTable:
        """``other`` wins where both name a model."""
        return PriceTable({**self.models, **other.models}, [*self.sources, *other.sources])

    def to_price_file(self) -> dict[str, Any]:
        """The table in the price-file format (saved beside trained artifacts)."""
        return {
            "as_of": max((p.as_of or "" for p in self.models.values()), default=""),
            "source": "; ".join(self.sources) or "ccpo",
            "models": {k: v.model_dump(exclude_none=True) for k, v in sorted(self.models.items())},
        }


def _line_of(text: str, loc: tuple[Any, ...]) -> int | None:
    """The line of ``text`` (a JSON document) holding the key path ``loc``, found by looking
    for each key in turn after the previous one (best effort: None when a key is not found)."""
    pos = 0
    for key in loc:
        found = text.find(json.dumps(str(key), ensure_ascii=False), pos)
        if found < 0:
            found = text.find(json.dumps(str(key)), pos)  # written with \u escapes
        if found < 0:
            return None
        pos = found
    return text.count("\n", 0, pos) + 1 if loc else None


def _parse(obj: Any, origin: str, text: str | None = None) -> PriceTable:
    try:
        pf = PriceFile.model_validate(obj)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        line = _line_of(text, first["loc"]) if text is not None else None
        where = origin if line is None else f"{origin}:{line}"
        raise CCPOError(
            f"{where}: field '{loc}': {first['msg']} "
            "(see the price-file format: docs/design.md, 'Price file')"
        ) from None
    models = {
        k: v.model_copy(update={"as_of": v.as_of or pf.as_of, "source": v.source or pf.source})
        for k, v in pf.models.items()
    }
    return PriceTable(models, [origin])


def bundled_prices() -> PriceTable:
    """The price table shipped with the package (``ccpo/data/prices.json``)."""
    text = resources.files("ccpo.data").joinpath("prices.json").read_text(encoding="utf-8")
    return _parse(json.loads(text), "bundled prices")


def read_price_file(path: str | Path) -> PriceTable:
    """Read one price file, with a clear error for a missing or malformed file."""
    p = Path(path)
    if not p.is_file():
        raise CCPOError(f"{p}: price file not found")
    cap = max_line_bytes()
    try:
        with open(p, "rb") as fh:
            data = fh.read(cap + 1)
        if len(data) > cap:
            raise CCPOError(
                f"{p}: price file larger than the cap of {cap} bytes (ccpo --max-line-bytes N "
                "raises it)"
            )
        text = data.decode("utf-8")
        obj = loads_strict(text)
    except json.JSONDecodeError as e:
        raise CCPOError(f"{p}:{e.lineno}: malformed JSON in price file ({e.msg})") from None
    except UnicodeDecodeError as e:
        raise CCPOError(f"{p}: price file is not UTF-8 text ({e.reason})") from None
    except ValueError as e:  # NaN/Infinity, runaway nesting
        raise CCPOError(f"{p}: malformed JSON in price file ({e})") from None
    return _parse(obj, str(p), text)


def prices_from_mapping(obj: Mapping[str, Any], origin: str = "inline prices") -> PriceTable:
    """A price table from an in-memory price-file dict (e.g. a trace set's metadata)."""
    return _parse(dict(obj), origin)


def load_prices(*layers: str | Path | PriceTable | None) -> PriceTable:
    """The price table in force: the bundled table with each layer merged over it, in order
    (a later layer wins where two name a model). A layer is a price file's path, a table
    already read (say a policy's or a trace set's own prices), or None (skipped).

    The one place price tables are merged: every command's ``--prices FILE`` files come
    last, over a trace set's sidecar file or a policy folder's ``prices.json``."""
    table = bundled_prices()
    for layer in layers:
        if layer is not None:
            table = table.merged(layer if isinstance(layer, PriceTable) else read_price_file(layer))
    return table


def write_price_file(
    path: str | Path,
    models: Mapping[str, tuple[float, float]],
    source: str,
    as_of: str = "2026-11-22",
) -> Path:
    """Write a price file: ``models`` maps a name to (input, output) USD per million tokens."""
    obj = {
        "as_of": as_of,
        "source": source,
        "models": {
            m: {"input_usd_per_mtok": float(i), "output_usd_per_mtok": float(o)}
            for m, (i, o) in models.items()
        },
    }
    _parse(obj, str(path))  # never write a file that would not load
    out = Path(path)
    out.write_text(json.dumps(obj, indent=1) + "\n", encoding="utf-8")
    return out
