"""SYNTHETIC traces: a documented generator of schema-valid ``ccpo.trace/v1`` traces.

For tests and quick demos only; these are **not LLM results** and every trace says so
(``task`` = ``sim-qa``, models ``sim-base`` / ``sim-guide``, ``meta.synthetic = true``).
:func:`generate` draws them from a seeded generative story (its docstring): a latent
difficulty per question drives whether the base is right and whether the guide knows, so that
verdicts, uncertainty and log-probs carry signal, and very hard questions are often
unsolvable. :class:`SimConfig` holds the knobs. Command: ``ccpo sim`` (docs/cli.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ccpo.fields import knob
from ccpo.traces.schema import (
    BaseStep,
    GuideStep,
    PolicyLLMDecision,
    Round,
    Trace,
    Usage,
)

_ENTITIES = [
    "Paris",
    "Berlin",
    "Lisbon",
    "Oslo",
    "Vienna",
    "Prague",
    "Dublin",
    "Madrid",
    "Rome",
    "Athens",
    "Warsaw",
    "Budapest",
    "Helsinki",
    "Ottawa",
    "Lima",
    "Quito",
    "Cairo",
    "Nairobi",
    "Tokyo",
    "Seoul",
    "Hanoi",
    "Manila",
    "Jakarta",
    "Delhi",
    "Dhaka",
    "Kabul",
    "Tehran",
    "Baghdad",
    "Riyadh",
    "Doha",
    "Muscat",
    "Amman",
    "Beirut",
    "Sofia",
    "Riga",
    "Vilnius",
    "Tallinn",
    "Minsk",
    "Kyiv",
    "Bern",
    "Brussels",
    "Amsterdam",
    "Copenhagen",
    "Stockholm",
    "Reykjavik",
    "Canberra",
    "Wellington",
    "Santiago",
    "Bogota",
    "Caracas",
]


@dataclass
class SimConfig:
    """Knobs of the synthetic generator (defaults give ~60% round-1 base accuracy)."""

    n: int = knob(1400, "number of questions")
    rounds: int = knob(4, "rounds per question (T), 1..32")
    seed: int = knob(0, "random seed")
    base_model: str = knob("sim-base", "the base model's name in the traces")
    guide_model: str = knob("sim-guide", "the guide model's name in the traces")
    b0: float = knob(0.4, "base logit at round 1")
    b1: float = knob(0.45, "base logit gain per extra round")
    g0: float = knob(1.4, "guide logit at round 1")
    g1: float = knob(0.25, "guide logit gain per extra round")
    k: float = knob(1.8, "difficulty slope")
    verdict_noise: float = knob(0.07, "probability that a knowing guide's verdict is flipped")
    policy_llm: bool = knob(True, "add an LLM-as-policy decision for `guide_model`")

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}")
        if not 1 <= self.rounds <= 32:
            raise ValueError(f"rounds must be in 1..32, got {self.rounds}")
        if not 0.0 <= self.verdict_noise <= 1.0:
            raise ValueError(f"verdict_noise must be in [0, 1], got {self.verdict_noise}")


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + np.exp(-x))


def generate(cfg: SimConfig | None = None) -> list[Trace]:
    """Generate ``cfg.n`` synthetic traces with ``cfg.rounds`` rounds each.

    Generative story, per question i (seeded, deterministic):

    - latent difficulty d_i ~ N(0, 1);
    - base correct in round t with p = σ(b0 + b1·(t−1) − k·d_i) (improves across rounds);
    - the guide *knows* the answer with p = σ(g0 + g1·(t−1) − k·d_i). If it knows, its verdict
      is ``yes`` iff the base is right (flipped with probability ``verdict_noise``) and its
      answer is the gold one; if not, it says ``yes`` with probability 0.6 (echoing the base
      answer) or ``no`` with a wrong answer;
    - uncertainty ~ Beta(2, 8) when the guide knows, Beta(5, 4) when it does not (correlated
      with correctness, as a verdict-token entropy would be);
    - base log-prob mean ~ N(−0.35, 0.15) when right, N(−0.75, 0.25) when wrong;
    - wrong answers come from a small per-question pool of distractors, so agreement across
      rounds carries signal; tokens: the base context grows each round, the guide reads the
      question and base reasoning and writes a few tokens;
    - optionally an LLM-as-policy decision per round for model ``sim-guide`` (a noisy rule on
      the verdict and uncertainty), with its own usage.

    Very hard questions (large d) are often unsolvable: no round yields a correct answer.
    """
    cfg = cfg or SimConfig()
    rng = np.random.default_rng(cfg.seed)
    out = []
    for i in range(cfg.n):
        d = float(rng.normal())
        names = rng.choice(len(_ENTITIES), size=4, replace=False)
        gold, distractors = _ENTITIES[names[0]], [_ENTITIES[j] for j in names[1:]]
        question = f"[synthetic] Which capital is linked to item #{i} of the synthetic set?"
        rounds: list[Round] = []
        prev_wrong = None
        ctx = 0
        for t in range(1, cfg.rounds + 1):
            p_base = _sigmoid(cfg.b0 + cfg.b1 * (t - 1) - cfg.k * d)
            p_guide = _sigmoid(cfg.g0 + cfg.g1 * (t - 1) - cfg.k * d)
            base_ok = bool(rng.random() < p_base)
            if base_ok:
                base_ans = gold
            elif prev_wrong is not None and rng.random() < 0.5:
                base_ans = prev_wrong
            else:
                base_ans = str(rng.choice(distractors))
            if not base_ok:
                prev_wrong = base_ans
            knows = bool(rng.random() < p_guide)
            if knows:
                verdict = "yes" if base_ok else "no"
                if rng.random() < cfg.verdict_noise:
                    verdict = "no" if verdict == "yes" else "yes"
                guide_ans = base_ans if verdict == "yes" else gold
                unc = float(rng.beta(2, 8))
            else:
                verdict = "yes" if rng.random() < 0.6 else "no"
                wrong = [x for x in distractors if x != base_ans]
                guide_ans = base_ans if verdict == "yes" else str(rng.choice(wrong))
                unc = float(rng.beta(5, 4))
            guide_ok = guide_ans == gold
            lp_mean = float(
                min(-0.01, rng.normal(-0.35, 0.15) if base_ok else rng.normal(-0.75, 0.25))
            )
            lp_min = float(lp_mean * rng.uniform(3.0, 6.0))
            out_tok = int(rng.integers(60, 160))
            in_tok = 350 + ctx + int(rng.integers(0, 120))
            ctx += out_tok + 40
            g_in = 120 + out_tok + int(rng.integers(0, 40))
            g_out = 2 if verdict == "yes" else int(rng.integers(4, 10))
            policy = None
            if cfg.policy_llm:
                if t == cfg.rounds:
                    action = "base" if verdict == "yes" else "guide"
                elif verdict == "yes" and unc < 0.35:
                    action = "base"
                elif unc < 0.5:
                    action = "guide"
                else:
                    action = "next"
                if rng.random() < 0.1:  # a noisy decision-maker
                    choices = ["base", "guide"] + (["next"] if t < cfg.rounds else [])
                    action = str(rng.choice(choices))
                policy = {
                    cfg.guide_model: PolicyLLMDecision(
                        action=action,
                        usage=Usage(input_tokens=150 + 20 * t, output_tokens=1),
                    )
                }
            rounds.append(
                Round(
                    round=t,
                    base=BaseStep(
                        model=cfg.base_model,
                        answer=base_ans,
                        reasoning=f"[synthetic reasoning, round {t}] ... so the answer is "
                        f"{base_ans}.",
                        correct=base_ok,
                        usage=Usage(input_tokens=in_tok, output_tokens=out_tok),
                        logprob_mean=lp_mean,
                        logprob_min=lp_min,
                    ),
                    guide=GuideStep(
                        model=cfg.guide_model,
                        verdict=verdict,
                        answer=guide_ans,
                        correct=guide_ok,
                        uncertainty=unc,
                        usage=Usage(input_tokens=g_in, output_tokens=g_out),
                    ),
                    policy_llm=policy,
                )
            )
        out.append(
            Trace(
                schema="ccpo.trace/v1",
                id=f"sim-{cfg.seed}-{i:05d}",
                task="sim-qa",
                question=question,
                gold=[gold],
                rounds=rounds,
                meta={
                    "source": "ccpo.sim (SYNTHETIC, not LLM output)",
                    "synthetic": True,
                    "seed": cfg.seed,
                },
            )
        )
    return out
