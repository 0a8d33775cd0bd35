"""The on-disk policy folder (format ``ccpo.policy/v1``), written and read in one place.

Every technique saves to the same layout::

    policy.json        format, ccpo version, method, variant, answer ("set"/"single"), α,
                       thresholds, horizon T, config, provenance, info (auto's choice), plus
                       the technique's own fields (network shape, δ, scikit-learn version)
    features.json      the featurizer spec it was trained on (checked on load)
    prices.json        the price table used for training (price-file format), optional
    train_log.jsonl    one line of diagnostics per training step
    weights.npz        RL policies: the score network π (float64 arrays, np.savez's format);
                       folders written before it hold weights.pt (torch.save's), still read
    model.pkl          classifier policies (CStop, single-answer rules): a pickle made by ccpo

Main names: :func:`read_meta`, :func:`write_folder`, :func:`read_side_files`,
:func:`save_classifier`, :func:`load_classifier`. Which class loads a folder is decided by
:func:`ccpo.policies.registry.load_policy`. Reading a header is cheap.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

from ccpo import __version__
from ccpo.errors import CCPOError
from ccpo.traces.featurize import check_spec

ARTIFACT_FORMAT = "ccpo.policy/v1"
SideFiles = tuple[dict[str, Any], dict[str, Any] | None, list[dict[str, float]]]


def read_meta(folder: str | Path) -> dict[str, Any]:
    """``policy.json`` of a policy folder, parsed once, with its format checked."""
    d = Path(folder)
    meta_path = d / "policy.json"
    if not meta_path.is_file():
        raise CCPOError(
            f"{d}: not a trained policy folder (no policy.json); make one with "
            "`ccpo train ... --out DIR`"
        )
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError as e:
        raise CCPOError(f"{meta_path}: malformed JSON ({e.msg})") from None
    if meta.get("format") != ARTIFACT_FORMAT:
        raise CCPOError(
            f"{d}: policy format {meta.get('format')!r} (made by ccpo "
            f"{meta.get('ccpo_version', '?')}) is not {ARTIFACT_FORMAT!r}, which this ccpo "
            f"{__version__} reads; retrain it with this version"
        )
    return meta


def write_folder(
    folder: str | Path,
    meta: dict[str, Any],
    feature_spec: dict[str, Any],
    prices: dict[str, Any] | None,
    log: list[dict[str, float]],
) -> Path:
    """Create the folder and write ``policy.json`` (``meta`` after the format header) and the
    side files; the caller adds its model file."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    header = {"format": ARTIFACT_FORMAT, "ccpo_version": __version__, **meta}
    (out / "policy.json").write_text(json.dumps(header, indent=1) + "\n")
    (out / "features.json").write_text(json.dumps(feature_spec, indent=1) + "\n")
    if prices is not None:
        (out / "prices.json").write_text(json.dumps(prices, indent=1) + "\n")
    with open(out / "train_log.jsonl", "w") as fh:
        for e in log:
            fh.write(json.dumps(e) + "\n")
    return out


def read_side_files(folder: str | Path) -> SideFiles:
    """(feature spec — checked against this ccpo's featurizer —, prices or None, log)."""
    d = Path(folder)
    spec = json.loads((d / "features.json").read_text())
    check_spec(spec)
    prices_path, log_path = d / "prices.json", d / "train_log.jsonl"
    prices = json.loads(prices_path.read_text()) if prices_path.exists() else None
    log = (
        [json.loads(line) for line in log_path.read_text().splitlines()]
        if log_path.exists()
        else []
    )
    return spec, prices, log


def shared_fields(meta: dict[str, Any], side: SideFiles) -> dict[str, Any]:
    """The fields every policy class reads back alike: the side files (feature spec, prices,
    log), ``info`` and ``provenance`` (empty when the folder has none)."""
    spec, prices, log = side
    return {
        "feature_spec": spec,
        "prices": prices,
        "log": log,
        "info": meta.get("info") or {},
        "provenance": meta.get("provenance") or {},
    }


def save_classifier(
    folder: str | Path,
    meta: dict[str, Any],
    side: tuple[dict[str, Any], dict[str, Any] | None, list[dict[str, float]]],
    model: Any,
) -> Path:
    """A folder of a classifier-scored policy (CStop, the single-answer rules):
    ``policy.json`` (``meta`` plus the scikit-learn version), the side files ``side`` =
    (feature spec, prices, log) and ``model.pkl``."""
    import sklearn

    meta = {**meta, "sklearn_version": sklearn.__version__}
    out = write_folder(folder, meta, *side)
    with open(out / "model.pkl", "wb") as fh:
        pickle.dump(model, fh, protocol=pickle.HIGHEST_PROTOCOL)
    return out


def load_classifier(
    folder: str | Path, meta: dict[str, Any], retrain: str
) -> tuple[Any, SideFiles]:
    """(classifier, side files) of a folder written by :func:`save_classifier`. The
    classifier is a pickle made by this ccpo (only load folders you trust, as with any model
    file); a different scikit-learn version is refused (``retrain``: the command that makes
    a new one) rather than risk silently different scores."""
    import sklearn

    d = Path(folder)
    made = meta.get("sklearn_version")
    if made != sklearn.__version__:
        raise CCPOError(
            f"{d}: the classifier was saved with scikit-learn {made}, this is "
            f"{sklearn.__version__}; retrain it with `{retrain}`"
        )
    side = read_side_files(d)
    try:
        with open(d / "model.pkl", "rb") as fh:
            model = pickle.load(fh)
    except (OSError, pickle.UnpicklingError, EOFError) as e:
        raise CCPOError(f"{d}/model.pkl: cannot load the classifier ({e})") from None
    return model, side
