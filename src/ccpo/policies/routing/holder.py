"""What a routed policy adds to the policy it wraps: a router, τ̂, and the calls they save.

:class:`RouterHolder` is the half of :class:`~ccpo.policies.routing.single.RoutedPolicy` (single
answers) and :class:`~ccpo.policies.routing.sets.RoutedSetPolicy` (answer sets) that does not
depend on the kind of answer: the wrapped policy's attributes read through, the start round
decided before any call (:meth:`RouterHolder.start_rung`, with the text-only fallback when a
question's embedding is missing), the live decision (the wrapped rule on o_t with the skipped
rounds blank) and the router's files (``route.json``, ``policy.json``'s ``route``).
Derivation: docs/theory.md, "Routing before the first call".

Main names: :class:`RouterHolder`, :class:`Inner` (an attribute read through),
:data:`ROUTE_FILE`, :data:`SUFFIX`.
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
"""The router thresholds a τ-first calibration may take, fixed before any data: one is picked
on the training split (or :func:`ccpo.policies.routing.single.joint_ltt` certifies all four
at δ/4 each). Pareto testing walks a finer grid
(:data:`ccpo.policies.routing.pareto.PARETO_TAUS`)."""
ROUTE_FILE = "route.json"
SUFFIX = "+route"


class Inner:
    """An attribute of the wrapped policy (``self.inner``) read through, and written through
    when ``settable`` (else it is read-only, as a property without a setter)."""

    def __init__(self, *, settable: bool = False, doc: str | None = None) -> None:
        self.settable = settable
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else getattr(obj.inner, self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        if not self.settable:
            raise AttributeError(f"{type(obj).__name__}.{self.name} is read-only")
        setattr(obj.inner, self.name, value)


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

    horizon = Inner()
    feature_spec = Inner(settable=True)
    log = Inner()
    config = Inner()
    delta = Inner()
    marginal = Inner(doc="One answer: λ̂ (and τ̂) hold on average over calibration draws.")
    level = Inner(doc="One answer: what the calibration tests at (δ, or None: marginal).")
    prices = Inner(settable=True)
    provenance = Inner(settable=True)
    info = Inner(settable=True)
    method = Inner()
    alpha = Inner()
    online_step = Inner()
    threshold = Inner(doc="The wrapped policy's threshold (λ̂ or κ̂; τ̂ is :attr:`tau`).")

    @property
    def variant(self) -> str:  # type: ignore[override]
        return self.inner.variant + SUFFIX

    def set_threshold(self, value: float) -> None:
        self.inner.set_threshold(value)

    @property
    def is_calibrated(self) -> bool:
        return self.inner.is_calibrated and self.tau is not None

    @property
    def tracks_online(self) -> bool:
        return False

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

    def escalation_chance(self, question: str, start: int) -> float | None:
        """1 − r̂ of round ``start`` (1-based) by the text router (the fallback of one that
        reads embeddings: hedging decides before any embedding call)."""
        router = self.router if self.router.embedding_model is None else self.fallback
        if router is None:
            return None
        return float(1.0 - router.probs(router.features([question]))[0, start - 1])

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
