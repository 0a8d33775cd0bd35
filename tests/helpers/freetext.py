"""A scripted free-text world: three models that reply in sentences, a judge that says Yes/No
to the free-text verdict prompt, and an embeddings endpoint; served over real HTTP on
127.0.0.1 by :class:`ccpo.testing.scripted_server.ScriptedServer`. Replies are synthetic."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from ccpo.llm.config import build_config
from ccpo.testing.scripted_server import ScriptedServer, prompt_text
from ccpo.traces.prices import write_price_file

MODELS = ("small-m", "mid-m", "big-m")
EMBED_MODEL = "embed-m"
SIGNALS = ["similarity", "embedding", "length", "refusal", "logprob", "verdict"]


def _h(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


def reply(req: dict) -> str:
    """A model's free-text reply: a few sentences that depend on the model and the question;
    the small model refuses every third question."""
    text = prompt_text(req)
    m = re.findall(r"Question: (.*?)\n", text)
    q = m[-1] if m else text
    model = req.get("model", "")
    n = re.search(r"number (\d+)", q)
    if model == "small-m" and n and int(n.group(1)) % 3 == 0:
        return "I'm sorry, but I can't help with that request.\nAnswer: I can't help"
    if model == "mid-m" and _h(q) % 2 == 0:
        model = "big-m"  # the mid model writes the big one's reply on half the questions
    depth = MODELS.index(model) + 1 if model in MODELS else 1
    body = " ".join(f"Point {i} about {q[:20]} from {model}." for i in range(depth))
    return f"{body}\nAnswer: {q[:12]} is explained by {model} in {depth} parts"


def verdict(req: dict) -> str:
    return "Yes" if _h(prompt_text(req)) % 3 else "No"


def embed(text: str) -> list[float]:
    """A bag-of-letters vector (26 counts): a deterministic stand-in for an embedding."""
    low = text.lower()
    return [float(low.count(c)) + 0.5 for c in "abcdefghijklmnopqrstuvwxyz"]


def world(**kw) -> ScriptedServer:
    return ScriptedServer(rules=[(r"^You review a reply", verdict)], fallback=reply, **kw)


def write_questions(path: Path, n: int) -> Path:
    with open(path, "w") as fh:
        for i in range(n):
            q = {"id": f"q{i}", "question": f"Explain topic number {i} in plain words",
                 "gold": [f"topic {i}"]}  # fmt: skip
            fh.write(json.dumps(q) + "\n")
    return path


def config(srv: ScriptedServer, tmp: Path, n: int = 6, url: str | None = None, **kw):
    """A collect config of a two-round ``agree`` ladder small → mid → big with ``signals``."""
    prices = write_price_file(
        tmp / "prices.json", {"small-m": (0.1, 0.4), "mid-m": (1.0, 4.0), "big-m": (5.0, 20.0)},
        "test",
    )  # fmt: skip
    values = dict(
        task="freetext",
        family="exact",
        data=str(write_questions(tmp / "questions.jsonl", n)),
        ladder=[
            {"base": "small-m", "guide": "mid-m", "verdict": "agree"},
            {"base": "mid-m", "guide": "big-m", "verdict": "agree"},
        ],
        signals=SIGNALS,
        embedding_model=EMBED_MODEL,
        endpoints={"*": {"url": url or srv.url}},
        out=str(tmp / "free.jsonl"),
        no_cache=True,
        prices=[str(prices)],
        concurrency=2,
        timeout=5.0,
        backoff_base=0.005,
        max_retries=1,
    )
    values.update(kw)
    return build_config(None, values)
