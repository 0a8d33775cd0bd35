"""What a routed policy adds to the policy it wraps: a router, τ̂, and the calls they save.

:class:`RouterHolder` is the half of :class:`~ccpo.policies.routing.single.RoutedPolicy` (single
answers) and :class:`~ccpo.policies.routing.sets.RoutedSetPolicy` (answer sets) that does not
depend on the kind of answer: the wrapped policy's attributes read through, the start round
decided before any call (:meth:`RouterHolder.start_rung`, with the text-only fallback when a
question's embedding is missing), the live decision (the wrapped rule on o_t with the skipped
rounds blank) and the router's files (``route.json``, ``policy.json``'s ``route``).
Derivation: docs/theory.md, "Routing before the first call".

Main names: :class:`RouterHolder`, :data:`ROUTE_FILE`, :data:`SUFFIX`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ccpo.errors import CCPOError
from ccpo.policies.base import Answered, RoundDecision
from ccpo.policies.routing.router import Router

NO_ROUTE = 2.0
"""τ above every prediction: start at round 1 (the unrouted policy)."""
TAUS = (NO_ROUTE, 0.25, 0.5, 0.75)
"""The router thresholds τ may take, fixed before any data: one is picked on the training
split (or :func:`ccpo.policies.routing.single.joint_ltt` certifies all four at δ/4 each)."""
ROUTE_FILE = "route.json"
SUFFIX = "+route"


class RouterHolder:
    """The answer-kind-free half of a routed policy; the class using it is a dataclass with
    the fields ``inner`` (the wrapped policy), ``router``, ``tau``, ``taus`` and
    ``fallback`` (the text-only router, or None)."""

    inner: Any
    router: Router
    tau: float | None
    taus: tuple[float, ...]
    fallback: Router | None

    def __post_init__(self) -> None:
        if self.router.horizon != self.inner.horizon:
            raise CCPOError("the router and the stopping rule were fitted on different T")

    @property
    def horizon(self) -> int:  # type: ignore[override]
        return self.inner.horizon

    @property
    def feature_spec(self) -> dict[str, Any]:  # type: ignore[override]
        return self.inner.feature_spec

    @feature_spec.setter
    def feature_spec(self, spec: dict[str, Any]) -> None:
        self.inner.feature_spec = spec

    @property
    def log(self) -> list[dict[str, float]]:  # type: ignore[override]
        return self.inner.log

    @property
    def config(self) -> Any:  # type: ignore[override]
        return self.inner.config

    @property
    def delta(self) -> float:  # type: ignore[override]
        return self.inner.delta

    @property
    def variant(self) -> str:  # type: ignore[override]
        return self.inner.variant + SUFFIX

    @property
    def prices(self) -> dict[str, Any] | None:  # type: ignore[override]
        return self.inner.prices

    @prices.setter
    def prices(self, value: dict[str, Any] | None) -> None:
        self.inner.prices = value

    @property
    def provenance(self) -> dict[str, Any]:  # type: ignore[override]
        return self.inner.provenance

    @provenance.setter
    def provenance(self, value: dict[str, Any]) -> None:
        self.inner.provenance = value

    @property
    def info(self) -> dict[str, Any]:  # type: ignore[override]
        return self.inner.info

    @info.setter
    def info(self, value: dict[str, Any]) -> None:
        self.inner.info = value

    @property
    def method(self) -> str:
        return self.inner.method

    @property
    def alpha(self) -> float:
        return self.inner.alpha

    @property
    def threshold(self) -> float | None:
        """The wrapped policy's threshold (λ̂ or κ̂; τ̂ is :attr:`tau`)."""
        return self.inner.threshold

    def set_threshold(self, value: float) -> None:
        self.inner.set_threshold(value)

    @property
    def is_calibrated(self) -> bool:
        return self.inner.is_calibrated and self.tau is not None

    @property
    def tracks_online(self) -> bool:
        return False

    @property
    def online_step(self) -> tuple[float, float]:
        return self.inner.online_step

    def trained_horizon(self) -> int | None:
        return self.inner.horizon

    def _tau(self) -> float:
        if self.tau is None:
            raise CCPOError(f"the {self.variant} policy is not calibrated yet (no τ̂)")
        return self.tau

    # ------------------------------------------------------------------ live
    @property
    def route_embedding_model(self) -> str | None:
        return self.router.embedding_model

    def start_rung(self, question: str, embedding: Sequence[float] | None = None) -> int:
        """The first round (0-based) whose r̂ clears τ̂, from the question alone: its text
        and, when the router reads one and it is given, its embedding (else the fallback)."""
        router = self.router
        if self.fallback is not None and embedding is None:
            router = self.fallback
        x = router.features([question], None if embedding is None else [embedding])
        return int(router.start(router.probs(x), self._tau())[0])

    def decide(
        self, obs: np.ndarray, t: int, threshold: float | None, answered: Answered
    ) -> RoundDecision:
        """The wrapped rule on o_t computed with the skipped rounds blank
        (:func:`ccpo.traces.routing.routed_rounds`), as the replay's view of that start."""
        return self.inner.decide(obs, t, threshold, answered)

    # ------------------------------------------------------------------ persistence
    def save(self, folder: str | Path) -> Path:
        """The wrapped policy's folder, its ``policy.json`` with ``route`` (τ̂, the τ
        calibration may choose) and ``route.json`` (the router, its fallback)."""
        out = self.inner.save(folder)
        path = Path(folder) / "policy.json"
        meta = json.loads(path.read_text())
        meta["route"] = {"tau": self.tau, "taus": list(self.taus), "file": ROUTE_FILE}
        path.write_text(json.dumps(meta, indent=1) + "\n")
        d = self.router.to_json()
        if self.fallback is not None:
            d["fallback"] = self.fallback.to_json()
        (Path(folder) / ROUTE_FILE).write_text(json.dumps(d) + "\n")
        return out

    @staticmethod
    def load_router(
        folder: str | Path, meta: dict[str, Any]
    ) -> tuple[Router, Router | None, float | None, tuple[float, ...]]:
        """(router, fallback, τ̂, taus) of a routed policy's folder."""
        try:
            d = json.loads((Path(folder) / ROUTE_FILE).read_text())
            router = Router.from_json(d)
            fallback = None if d.get("fallback") is None else Router.from_json(d["fallback"])
        except (OSError, ValueError, KeyError) as e:
            raise CCPOError(f"{folder}: cannot read its router {ROUTE_FILE} ({e})") from None
        tau, taus = meta["route"].get("tau"), meta["route"].get("taus", TAUS)
        return router, fallback, None if tau is None else float(tau), tuple(map(float, taus))
