"""What to train, parsed once: :class:`PolicySpec` and :func:`parse_spec`.

Every caller that makes a policy (``ccpo train``, the rows of ``compare`` / ``evaluate``, the
Python API, ``auto``'s candidates) turns a method name and its options into a spec here, and
hands it to :func:`ccpo.policies.pipeline.train_policy`. The grammar of method names lives
here alone:

- a method of :data:`METHODS` (``auto``, ``cstop``, …, ``cpo-online``, ``ccpo``);
- ``ccpo-lam<λ>``: CCPO with a set-size price λ > 0;
- ``<method>-single``: its single-answer form (``--answer single``);
- ``<method>…+route``: behind a router (``--route``);
- for the API, ``cpo`` is CPO then split-conformal κ̂ (the ``cpo-batch`` row).

The usage errors (an unknown method, ``--answer`` / ``--route`` combinations) are worded for
the caller: ``--answer`` on the command line, ``answer=`` in Python.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ccpo.errors import CCPOError
from ccpo.learning.config import TrainConfig
from ccpo.policies.base import AnswerKind
from ccpo.policies.routing.holder import SUFFIX as ROUTED
from ccpo.policies.single import DELTA, SINGLE_METHODS
from ccpo.policies.single import SUFFIX as SINGLE
from ccpo.traces.ladder import CHAT

Kind = Literal["score", "rl"]
Scoring = Literal["batch", "point", "online"]
Caller = Literal["cli", "api"]


@dataclass(frozen=True)
class MethodSpec:
    """One learning method: what fits it and how its π is scored."""

    name: str
    kind: Kind
    help: str  # one line for --help and error messages
    trainer: Literal["ccpo", "cpo"] | None = None  # rl: TrainConfig.method
    scoring: Scoring = "batch"  # rl: greedy "point", split-conformal "batch", "online" κ
    compare: bool = True  # a row of `compare` / `evaluate --policy all` with trained rows

    @property
    def calibrates(self) -> bool:
        """Its threshold is calibrated on held-out questions (split conformal)."""
        return self.scoring == "batch"

    @property
    def greedy(self) -> bool:
        """Its π is used greedily: no set, no threshold."""
        return self.scoring == "point"

    @property
    def fitted_on_replay(self) -> bool:
        """Fitted on replayed traces, rather than trained by RL."""
        return self.kind == "score"


_SPECS = (
    MethodSpec(
        "auto",
        "score",
        "cross-fits cstop, cstop-lr, depth-k, agree-k and ccpo (300 steps a fold), keeps the "
        "least validation calibrated cost",
    ),
    MethodSpec("cstop", "score", "CStop: gradient-boosted continuation score, conformal κ̂"),
    MethodSpec("cstop-lr", "score", "CStop with a logistic-regression score", compare=False),
    MethodSpec("depth-k", "score", "run the least k rounds that reach 1 − α", compare=False),
    MethodSpec("agree-k", "score", "stop when the guide agrees, at most k rounds", compare=False),
    MethodSpec("cpo", "rl", "CPO π, greedy point policy (no set)", "cpo", "point"),
    MethodSpec("cpo-batch", "rl", "CPO π, then split-conformal κ̂", "cpo", "batch"),
    MethodSpec("cpo-online", "rl", "CPO π with the online κ tracker", "cpo", "online"),
    MethodSpec("ccpo", "rl", "CCPO, the paper's Algorithm 1", "ccpo"),
)
METHODS: dict[str, MethodSpec] = {s.name: s for s in _SPECS}
#: what ``ConformalPolicy(method=…)`` takes: every set-valued method (``cpo`` is CPO-batch)
API_METHODS = [n for n, s in METHODS.items() if s.calibrates and n != "cpo-batch"]
API_METHODS.insert(API_METHODS.index("ccpo"), "cpo")
#: set methods that ``--route`` puts behind a router
ROUTED_SETS = ("auto", "cstop", "cstop-lr")

_LAM = re.compile(r"^ccpo-lam(?P<lam>[0-9.eE+-]+)$")


# ----------------------------------------------------------------------------- names
def variant_name(method: str, lam: float = 0.0) -> str:
    """The name a trained policy carries and its row is shown under: the method (``ccpo``,
    ``cpo``, ``cpo-batch``, …), or ``ccpo-lam<λ>`` for CCPO with a set-size price λ > 0."""
    return f"{method}-lam{lam:g}" if lam and method == "ccpo" else method


def method_names() -> str:
    """``auto, cstop, …, cpo-online`` (for messages)."""
    return ", ".join(METHODS)


def method_help() -> str:
    """One paragraph naming every method and what it does (for ``--method`` help)."""
    return "; ".join(f"{s.name}: {s.help}" for s in _SPECS) + "; ccpo-lam<λ>: CCPO with λ."


def resolve_method(name: str) -> tuple[MethodSpec, float] | None:
    """(spec, λ) of a method name, ``ccpo-lam<λ>`` included; ``None`` when it names no method
    (it may still name a baseline row or a policy folder)."""
    if name in METHODS:
        return METHODS[name], 0.0
    m = _LAM.match(name)
    if m is None:
        return None
    try:
        lam = float(m.group("lam"))
    except ValueError:
        raise CCPOError(f"cannot read λ in '{name}' (try ccpo-lam0.5)") from None
    if lam < 0:
        raise CCPOError(f"λ must be >= 0 in '{name}'")
    return METHODS["ccpo"], lam


def names_a_method(name: str) -> bool:
    """Whether ``name`` is a method's in the grammar of :func:`parse_spec` (else it may name a
    baseline row or a policy folder)."""
    return resolve_method(name.removesuffix(ROUTED).removesuffix(SINGLE)) is not None


def single_form_of(method: str) -> bool:
    """Whether ``method`` has a single-answer form (``--answer single``)."""
    return method in ("auto", *SINGLE_METHODS)


def compare_rows() -> list[str]:
    """The method rows of ``compare``: the RL variants, the fitted score methods, and ``auto``
    last (the product's own pick closes the list)."""
    rows = [s.name for kind in ("rl", "score") for s in _SPECS if s.kind == kind and s.compare]
    return [r for r in rows if r != "auto"] + ["auto"]


# ----------------------------------------------------------------------------- the spec
@dataclass(frozen=True)
class PolicySpec:
    """What to train: a method of :data:`METHODS` and everything that shapes the policy it
    fits. ``settings``: :class:`~ccpo.learning.config.StopConfig` fields (the replay learners'
    hyperparameters, ``auto_*``); ``train_config``: the RL trainer's (its method, α, seed and
    λ are the spec's); ``candidates``: what ``auto`` chooses among (empty: the default)."""

    method: str
    answer: AnswerKind = "set"
    lam: float = 0.0
    route: bool = False
    route_embeddings: bool = False
    delta: float = DELTA
    settings: Mapping[str, Any] = field(default_factory=dict)
    train_config: TrainConfig | None = None
    latency_budget: float | None = None
    candidates: tuple[str, ...] = ()
    #: the calibration questions the policy will meet (set by ``train_policy``); ``auto`` of
    #: one answer validates its candidates as that many would test them
    calibration_size: int | None = None

    @property
    def technique(self) -> MethodSpec:
        return METHODS[self.method]

    @property
    def single(self) -> bool:
        return self.answer == "single"

    @property
    def trains(self) -> bool:
        """Trained by RL (the numpy training loop), rather than fitted on replay."""
        return self.technique.kind == "rl"

    @property
    def calibrates(self) -> bool:
        """Its threshold is calibrated on held-out questions."""
        return self.single or self.technique.calibrates

    @property
    def greedy(self) -> bool:
        return not self.single and self.technique.greedy

    @property
    def variant(self) -> str:
        """``ccpo``, ``ccpo-lam0.5``, ``cstop``… (without answer kind or routing)."""
        return variant_name(self.method, self.lam)

    @property
    def name(self) -> str:
        """The row name: ``cstop``, ``ccpo-lam0.5``, ``cstop-single``, ``auto-single+route``."""
        return self.variant + (SINGLE if self.single else "") + (ROUTED if self.route else "")


def _flag(caller: Caller, name: str) -> str:
    return f"--{name.replace('_', '-')}" if caller == "cli" else name


def parse_spec(
    name: str,
    *,
    answer: str | None = None,
    route: bool = False,
    route_embeddings: bool = False,
    lam: float = 0.0,
    delta: float = DELTA,
    settings: Mapping[str, Any] | None = None,
    train_config: TrainConfig | None = None,
    latency_budget: float | None = None,
    candidates: tuple[str, ...] = (),
    family: str | None = None,
    caller: Caller = "cli",
) -> PolicySpec:
    """The spec of a method name (module docstring) and its options; usage errors raise
    :class:`CCPOError` worded for ``caller``. ``answer=None``: ``single`` on ``family`` chat
    traces or with ``route`` when the method has a single form, else ``set``. ``lam``: λ when
    the name carries none. The API (``caller="api"``) takes set-valued methods only."""
    route = route or name.endswith(ROUTED)
    base = name.removesuffix(ROUTED)
    if base.endswith(SINGLE) and single_form_of(base.removesuffix(SINGLE)):
        base, answer = base.removesuffix(SINGLE), "single"
    if caller == "api" and base == "cpo":
        base = "cpo-batch"  # the API calibrates κ̂ on its calibration data
    found = resolve_method(base)
    if found is None or (caller == "api" and not found[0].calibrates):
        if caller == "api":
            raise CCPOError(
                f"method must be one of {', '.join(API_METHODS)} or ccpo-lam<λ>; got '{name}'"
            )
        raise CCPOError(f"--method must be one of {method_names()} or ccpo-lam<λ>, got '{name}'")
    method = found[0].name
    _check_answer(caller, answer, method, delta, route)
    if route_embeddings and (not route or answer == "set"):
        raise CCPOError("--route-embeddings works with --route and single answers")
    return PolicySpec(
        method,
        answer or default_answer(family, method, route),  # type: ignore[arg-type]
        found[1] or lam,
        route,
        route_embeddings,
        delta,
        dict(settings or {}),
        train_config,
        latency_budget,
        tuple(candidates),
    )


def default_answer(family: str | None, method: str, route: bool) -> AnswerKind:
    """The answer kind without ``--answer``: ``single`` on a chat ladder (an app shows one
    reply, and a guarantee on a set of replies says nothing about the one it shows) or with
    ``--route``, when the method has a single form; ``set`` otherwise (the paper's)."""
    return "single" if (family == CHAT or route) and single_form_of(method) else "set"


def _check_answer(
    caller: Caller, answer: str | None, method: str, delta: float, route: bool
) -> None:
    """``answer``, ``delta`` and ``route``: a one-line usage error before any work."""
    flag = lambda o: _flag(caller, o)  # noqa: E731
    if route and not (single_form_of(method) if answer != "set" else method in ROUTED_SETS):
        raise CCPOError(
            f"{flag('route')} works with {flag('method')} auto, cstop or cstop-lr (answer "
            f"sets), or auto, {', '.join(SINGLE_METHODS)} ({flag('answer')} single)"
        )
    if answer is None:
        return
    if answer not in ("set", "single"):
        raise CCPOError(f"{flag('answer')} must be 'set' or 'single', got '{answer}'")
    if answer == "single" and not single_form_of(method):
        raise CCPOError(
            f"{flag('answer')} single works with {flag('method')} auto, "
            f"{', '.join(SINGLE_METHODS)}; '{method}' returns answer sets (drop "
            f"{flag('answer')} single)"
        )
    if not 0 < delta < 1:
        raise CCPOError(f"{flag('delta')} must be strictly between 0 and 1, got {delta}")
