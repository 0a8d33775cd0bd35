"""The evaluation harness: splits, scoring every policy on the same splits, result rows.

Protocol (paper §5, "box plots over 100 random evaluation splits"): a seeded hash of the
question ids fixes the training split (:func:`id_splits`: the line order of a file changes
nothing); the remaining questions form the held-out pool, which is re-split R
times at random into a calibration and a test split. Policies are trained once on the training
split and calibrated per evaluation split; every row is scored on exactly the same test splits.
Headline numbers are means over the R splits; ``cost_cents`` is the total over one test split.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ccpo.errors import CCPOError
from ccpo.evaluation.money import money_flow
from ccpo.learning import conformal
from ccpo.learning.baselines import Row, Splits
from ccpo.traces.episodes import Episodes, Metrics, build_episodes, conformal_sets
from ccpo.traces.io import iter_traces, read_traces
from ccpo.traces.labels import one_label, trace_labels
from ccpo.traces.ladder import Ladder, ladder_of_trace
from ccpo.traces.latency import question_latency
from ccpo.traces.prices import PriceTable, load_prices
from ccpo.traces.verify import SIMULATED_KEY, simulated_of

PAPER_SIZES = (1000, 200, 200)


def split_sizes(
    n: int, n_train: int | None = None, n_cal: int | None = None, n_test: int | None = None
) -> tuple[int, int, int]:
    """Train/calibration/test sizes: the paper's 1000/200/200 where data allows, else 5:1:1.

    Explicit sizes win; they must fit in ``n``.
    """
    if n_train is None and n_cal is None and n_test is None:
        if n >= sum(PAPER_SIZES):
            return PAPER_SIZES
        n_cal = n_test = max(1, n // 7)
        return n - 2 * n_cal, n_cal, n_test
    a, b, c = PAPER_SIZES
    scale = min(1.0, n / (a + b + c))
    sizes = (
        n_train if n_train is not None else int(a * scale),
        n_cal if n_cal is not None else int(b * scale),
        n_test if n_test is not None else int(c * scale),
    )
    if min(sizes) < 1 or sum(sizes) > n:
        raise CCPOError(
            f"split sizes train/cal/test = {sizes} do not fit {n} questions; pass smaller "
            "--n-train/--n-cal/--n-test"
        )
    return sizes


#: a single answer's stopping rule is fitted on this share of ``train``'s questions (at least
#: :data:`SINGLE_FIT_MIN`, at most half): Learn-then-Test pays for few calibration questions
#: in misses it must not make (:func:`ccpo.policies.single.allowed_misses`), while the
#: classifier it certifies needs few questions to fit (docs/decisions.md)
SINGLE_FIT_SHARE = 0.3
SINGLE_FIT_MIN = 40


def train_size(n: int, single: bool = False) -> int:
    """How many of ``n`` questions ``ccpo train`` fits on: a single answer's stopping rule
    ⌈0.3 n⌉ (at least 40, at most half), so that the rest calibrates it; any other policy as
    ``compare`` trains (:func:`split_sizes`)."""
    if not single:
        return split_sizes(n)[0]
    return max(1, min(n // 2, max(SINGLE_FIT_MIN, math.ceil(SINGLE_FIT_SHARE * n))))


def train_calibration_size(n: int, single: bool = False) -> int:
    """How many of ``n`` questions ``ccpo train`` calibrates on (its split rule: every
    question outside the training split of :func:`train_size`)."""
    return n - train_size(n, single)


def calibration_shortfall(alpha: float, n_cal: int) -> str | None:
    """Why ``n_cal`` calibration questions are too few for a guarantee at ``alpha`` (None when
    they are enough): with fewer than :func:`~ccpo.learning.conformal.min_calibration_size`
    split conformal can only return κ̂ = 0 (every answer of every round: covered, at the cost
    of running everything). Says how many calibration questions, and how many questions in
    all under ``train``'s split rule (:func:`train_calibration_size`), a guarantee needs."""
    need = conformal.min_calibration_size(alpha)
    if n_cal >= need:
        return None
    total = next(n for n in itertools.count(need) if train_calibration_size(n) >= need)
    return (
        f"the data is too small for a guarantee at α = {alpha:g}: {n_cal} calibration "
        f"question{'' if n_cal == 1 else 's'}, and split conformal needs at least {need} "
        f"(⌊α(n+1)⌋ ≥ 1), i.e. at least {total} questions in the trace file with train's "
        "split; with fewer, κ̂ = 0 and every set holds every answer of every round (the cost "
        "of running everything). Collect more questions or use a larger α"
    )


def id_order(ids: Sequence[str], seed: int) -> np.ndarray:
    """Positions of ``ids`` sorted by a seeded hash of each id (SHA-256 of ``seed`` and the id;
    ties, which need a hash collision, by the id itself). The order depends on the ids and the
    seed only, never on where a question stands in its file."""
    keys = [hashlib.sha256(f"{seed}\x00{q}".encode()).digest()[:8] for q in ids]
    return np.array(sorted(range(len(ids)), key=lambda i: (keys[i], ids[i])), dtype=np.int64)


def id_splits(
    ep: Episodes, sizes: tuple[int, int, int], n_splits: int, seed: int
) -> tuple[Episodes, Splits]:
    """Order-free splits: the episodes reordered by :func:`id_order`, the training split the
    first ``sizes[0]`` of them, and ``n_splits`` seeded calibration/test draws of the rest.
    The same questions in any line order give the same episodes and splits, so the same policy
    bit for bit (``train``, ``compare`` and ``evaluate`` split this way)."""
    ordered = ep.subset(id_order(ep.ids, seed))
    return ordered, make_splits(ep.n, sizes, n_splits, seed, shuffle=False)


def make_splits(
    n: int, sizes: tuple[int, int, int], n_splits: int, seed: int, shuffle: bool = True
) -> Splits:
    """A fixed training split and ``n_splits`` random calibration/test splits of the rest.

    The training split is a seeded permutation's first ``sizes[0]`` positions, or (``shuffle``
    False, for episodes already in :func:`id_order`) the first ``sizes[0]`` positions."""
    n_train, n_cal, n_test = sizes
    if n_splits < 1:
        raise CCPOError("--splits must be at least 1")
    rng = np.random.default_rng([seed, 0x5EED])
    perm = rng.permutation(n) if shuffle else np.arange(n)
    train, pool = perm[:n_train], perm[n_train:]
    draws = np.stack([rng.permutation(pool)[: n_cal + n_test] for _ in range(n_splits)])
    return Splits(train=np.sort(train), cal=draws[:, :n_cal], test=draws[:, n_cal:])


@dataclass
class ResultRow:
    """One row of ``results.json`` (docs/design.md, "Results file"), plus per-split detail."""

    policy: str
    cost_cents: float
    coverage: float
    avg_len: float
    set_size: float
    cost_cents_per_split: list[float] = field(default_factory=list)
    coverage_per_split: list[float] = field(default_factory=list)
    avg_len_per_split: list[float] = field(default_factory=list)
    set_size_per_split: list[float] = field(default_factory=list)
    #: estimated end-to-end seconds per question (traces.latency); None in older results
    latency_s: float | None = None
    latency_s_per_split: list[float] = field(default_factory=list)
    kind: str = "point"
    extra: dict[str, Any] = field(default_factory=dict)
    #: where the money goes (evaluation.money: MoneyFlow.to_json, over every test split);
    #: None when the row does not say (the oracle bound) and in older results
    money: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("extra", "money"):
            if not d[key]:
                d.pop(key)
        return d


def with_latency(ep: Episodes, m: Metrics, idx: np.ndarray) -> Metrics:
    """``m`` with its estimated latency per question (:mod:`ccpo.traces.latency`): kept when
    the row set it (one call alone), else the first ``length`` rounds of each question."""
    if m.latency is not None or ep.round_latency is None:
        return m
    return replace(m, latency=question_latency(ep.round_latency, idx, m.length))


def row_from_metrics(name: str, m: Metrics, kind: str = "point", **extra: Any) -> ResultRow:
    """Aggregate [R, n_test] per-question metrics into a result row."""
    cost = m.cost.sum(-1) * 100.0
    cov = m.covered.mean(-1)
    length = m.length.mean(-1)
    size = m.set_size.mean(-1)
    lat = None if m.latency is None else m.latency.mean(-1)
    return ResultRow(
        policy=name,
        cost_cents=float(cost.mean()),
        coverage=float(cov.mean()),
        avg_len=float(length.mean()),
        set_size=float(size.mean()),
        cost_cents_per_split=[round(float(x), 6) for x in cost],
        coverage_per_split=[round(float(x), 6) for x in cov],
        avg_len_per_split=[round(float(x), 6) for x in length],
        set_size_per_split=[round(float(x), 6) for x in size],
        latency_s=None if lat is None else float(lat.mean()),
        latency_s_per_split=[] if lat is None else [round(float(x), 6) for x in lat],
        kind=kind,
        extra=extra,
    )


def sidecar_path(traces_path: str | Path) -> Path:
    """Where a trace set's own price file is: ``<stem>.prices.json`` beside it (the stem
    without ``.gz`` and ``.jsonl``)."""
    p = Path(traces_path)
    stem = p.name
    for suffix in (".gz", ".jsonl"):
        stem = stem.removesuffix(suffix)
    return p.with_name(f"{stem}.prices.json")


def sidecar_prices(traces_path: str | Path) -> Path | None:
    """A trace set's own price file ``<stem>.prices.json`` beside it, if any."""
    side = sidecar_path(traces_path)
    return side if side.is_file() else None


def prices_for(traces_path: str | Path, price_files: Sequence[str | Path] = ()) -> PriceTable:
    """Bundled prices, then the trace set's sidecar price file, then each ``--prices`` file."""
    return load_prices(sidecar_prices(traces_path), *price_files)


def load_episodes(
    traces_path: str | Path, price_files: Sequence[str | Path] = ()
) -> tuple[Episodes, PriceTable]:
    """Read, validate, price and featurize a trace file."""
    prices = prices_for(traces_path, price_files)
    return build_episodes(read_traces(traces_path), prices), prices


def used_prices(ep: Episodes, table: PriceTable) -> dict[str, dict[str, Any]]:
    """The price of every model the traces record (with its source, which names a stand-in
    price): what results.json states as ``prices`` and the report prints."""
    return {m: table.price(m).model_dump(exclude_none=True) for m in ep.models}


def load_splits(
    traces_path: str | Path,
    alpha: float,
    n_splits: int,
    seed: int,
    price_files: Sequence[str | Path] = (),
    sizes: tuple[int | None, int | None, int | None] = (None, None, None),
) -> tuple[Episodes, dict[str, dict[str, Any]], tuple[int, int, int], Splits]:
    """What policies are scored on: α checked, the trace file read and priced
    (:func:`load_episodes`), in :func:`id_order` with ``n_splits`` evaluation splits
    (:func:`id_splits`) of the :func:`split_sizes` for ``sizes`` (train/cal/test, None: the
    default). Returns the episodes, the prices of their models (:func:`used_prices`), the
    split sizes and the splits."""
    check_alpha(alpha)
    ep, table = load_episodes(traces_path, price_files)
    n = split_sizes(ep.n, *sizes)
    ep, sp = id_splits(ep, n, n_splits, seed)
    return ep, used_prices(ep, table), n, sp


def check_alpha(alpha: float) -> None:
    """:func:`ccpo.learning.conformal.check_alpha` as a usage error (exit code 2)."""
    try:
        conformal.check_alpha(alpha)
    except ValueError:
        raise CCPOError(f"alpha must be strictly between 0 and 1, got {alpha}") from None


def evaluate_policies(
    ep: Episodes,
    policies: Sequence[Row],
    splits: Splits,
    alpha: float,
    seed: int = 0,
    progress: Any = None,
) -> list[ResultRow]:
    """Fit each policy on the training split, then score it on every evaluation split."""
    check_alpha(alpha)
    rows = []
    for pol in policies:
        pol.calibration_size = int(splits.cal.shape[-1])  # what a single answer calibrates on
        pol.fit(ep, splits.train, alpha, seed)
        m = with_latency(ep, pol.evaluate(ep, splits, alpha, seed), splits.test)
        extra = getattr(pol, "result_extra", lambda: {})()
        row = row_from_metrics(pol.name, m, kind=pol.kind, **extra)
        flow = money_flow(ep, m, splits.test)
        rows.append(row if flow is None else replace(row, money=flow.to_json()))
        if progress is not None:
            progress(pol.name)
    return rows


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file's bytes (streamed)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def trace_provenance(path: str | Path) -> dict[str, Any]:
    """What a policy trained or evaluated on ``path`` records and checks (see
    :func:`ccpo.policies.provenance.check_provenance`): task, file name and sha256, base and guide
    models, horizon T, whether the traces are synthetic, number of questions, the
    **ladder** the traces follow (:mod:`ccpo.traces.ladder`; null when the file mixes ladders),
    which deployment runs, and what ``correct`` is measured **against** (``"gold"`` or
    ``"reference:<model>"``, :mod:`ccpo.traces.labels`; a file mixing them is refused); and
    ``simulated_verifier`` when its verify steps' verdicts are simulated (:mod:`ccpo.traces.
    verify`)."""
    tasks: set[str] = set()
    labels: set[str] = set()
    base: set[str] = set()
    guide: set[str] = set()
    horizon, n, synthetic = 0, 0, False
    simulated: dict[str, Any] | None = None
    ladders: set[Ladder] = set()
    for tr in iter_traces(path):
        if len(ladders) < 2:
            ladders.add(ladder_of_trace(tr))
        tasks.add(tr.task)
        base.update(r.base.model for r in tr.rounds)
        guide.update(r.guide.model for r in tr.rounds)
        horizon = tr.n_rounds
        synthetic |= bool(tr.meta.get("synthetic"))
        simulated = simulated or simulated_of([tr])
        labels.add(trace_labels(tr))
        n += 1
    against = one_label(labels, str(path))
    extra = {} if simulated is None else {SIMULATED_KEY: simulated}  # (absent: as before)
    return {
        "task": ",".join(sorted(tasks)),
        "traces": Path(path).name,
        "traces_sha256": file_sha256(path),
        "base_models": sorted(base),
        "guide_models": sorted(guide),
        "horizon": horizon,
        "synthetic": synthetic,
        "questions": n,
        "ladder": next(iter(ladders)).to_dict() if len(ladders) == 1 else None,
        "against": against,
        **extra,
    }


def full_set_rate(ep: Episodes, probs: np.ndarray, kappa: float) -> float:
    """Share of questions on which C(o) = {a : π(a|o) ≥ κ} holds every action at every round
    (all T rounds run, every answer returned): 1.0 means the policy is degenerate (it decides
    nothing and costs as much as running everything)."""
    reach, included = conformal_sets(ep, probs, kappa)
    return float((reach.all(1) & included.all((1, 2))).mean())
