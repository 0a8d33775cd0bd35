"""The search tool of the HotpotQA ReAct agent: ``search[entity]``, ``lookup[keyword]``,
``finish[answer]`` (the action set of Yao et al.'s ReAct Wikipedia environment).

Backends (``SearchBackend``):

- :class:`BM25Search` — offline, ``bm25s`` over a list of :class:`Passage` (a question's
  distractor paragraphs, or any local corpus loaded with :func:`load_corpus`). A passage whose
  title equals the query (case-insensitive) wins outright, as a Wikipedia page look-up would;
  otherwise the best BM25 hit is returned.
- :class:`WikipediaSearch` — live MediaWiki API (optional; needs internet; never used in
  tests).

:class:`ReActEnv` keeps the page last returned by ``search`` so that ``lookup`` can scan it.
Observation texts are this project's own wording.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ccpo.errors import CCPOError
from ccpo.llm.tasks.loaders import Passage

N_SENTENCES = 5  # sentences of a page shown by search[...]
_ACTION = re.compile(r"^\s*(search|lookup|finish)\s*\[(.*)\]\s*$", re.I | re.S)


class SearchBackend(Protocol):
    async def search(self, query: str, k: int = 5) -> list[Passage]:
        """Best passages first (possibly empty)."""
        ...


class BM25Search:
    """Offline BM25 (``bm25s``) over titled passages."""

    def __init__(self, passages: list[Passage]) -> None:
        import bm25s

        self._bm25s = bm25s
        self.passages = [p for p in passages if p.title or p.text]
        self._by_title = {p.title.strip().lower(): p for p in self.passages}
        self._retriever = None
        if self.passages:
            docs = [f"{p.title}. {p.text}" for p in self.passages]
            toks = bm25s.tokenize(docs, stopwords="en", show_progress=False)
            self._retriever = bm25s.BM25()
            self._retriever.index(toks, show_progress=False)

    def search_sync(self, query: str, k: int = 5) -> list[Passage]:
        q = query.strip()
        out: list[Passage] = []
        exact = self._by_title.get(q.lower())
        if exact is not None:
            out.append(exact)
        if self._retriever is not None and q:
            qt = self._bm25s.tokenize([q], stopwords="en", show_progress=False)
            if len(qt.vocab) > 0:
                kk = min(k, len(self.passages))
                idx, scores = self._retriever.retrieve(qt, k=kk, show_progress=False)
                for i, s in zip(idx[0], scores[0], strict=True):
                    p = self.passages[int(i)]
                    if s > 0 and p is not exact:
                        out.append(p)
        return out[:k]

    async def search(self, query: str, k: int = 5) -> list[Passage]:
        return self.search_sync(query, k)


def load_corpus(path: str | Path) -> list[Passage]:
    """A local corpus: JSONL of ``{"title", "text"}`` (or ``"sentences"``) per line."""
    p = Path(path)
    if not p.is_file():
        raise CCPOError(f"{p}: corpus file not found")
    out = []
    with open(p, encoding="utf-8") as fh:
        for ln, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                sents = rec.get("sentences") or _split_sentences(str(rec.get("text", "")))
                out.append(Passage(str(rec.get("title", "")), [str(s) for s in sents]))
            except (json.JSONDecodeError, AttributeError):
                raise CCPOError(
                    f"{p}:{ln}: expected a JSON object with 'title' and 'text'"
                ) from None
    return out


def _split_sentences(text: str) -> list[str]:
    parts = re.split(r"(?<=[.!?])\s+", text.strip())
    return [s + " " for s in parts if s]


class WikipediaSearch:
    """Live Wikipedia via the MediaWiki API (needs internet; optional)."""

    def __init__(self, lang: str = "en", timeout: float = 20.0) -> None:
        self.api = f"https://{lang}.wikipedia.org/w/api.php"
        self.timeout = timeout

    async def search(self, query: str, k: int = 5) -> list[Passage]:  # pragma: no cover
        import httpx

        headers = {"User-Agent": "ccpo/0.1 (research tool; offline-first)"}
        async with httpx.AsyncClient(timeout=self.timeout, headers=headers) as c:
            r = await c.get(
                self.api,
                params={
                    "action": "query",
                    "list": "search",
                    "srsearch": query,
                    "srlimit": k,
                    "format": "json",
                },
            )
            r.raise_for_status()
            titles = [h["title"] for h in r.json().get("query", {}).get("search", [])]
            if not titles:
                return []
            r = await c.get(
                self.api,
                params={
                    "action": "query",
                    "prop": "extracts",
                    "explaintext": 1,
                    "exintro": 1,
                    "titles": "|".join(titles),
                    "format": "json",
                    "redirects": 1,
                },
            )
            r.raise_for_status()
            pages = r.json().get("query", {}).get("pages", {})
            by_title = {p.get("title"): p.get("extract", "") for p in pages.values()}
        return [
            Passage(t, _split_sentences(by_title.get(t, ""))) for t in titles if by_title.get(t)
        ]


def parse_action(text: str) -> tuple[str, str] | None:
    """``'Search[Paris]'`` → ``('search', 'Paris')``; None when it is not a valid action."""
    m = _ACTION.match(text.strip().splitlines()[0] if text.strip() else "")
    if not m:
        return None
    return m.group(1).lower(), m.group(2).strip()


@dataclass
class ReActEnv:
    """One question's tool state: the current page and the look-up cursor."""

    backend: SearchBackend
    page: Passage | None = None
    _lookup_kw: str | None = None
    _lookup_hits: list[str] = field(default_factory=list)
    _lookup_i: int = 0

    async def step(self, action: str, arg: str) -> str:
        """Run a ``search`` or ``lookup`` action and return the observation text."""
        if action == "search":
            hits = await self.backend.search(arg)
            if not hits:
                self.page = None
                return f"Could not find [{arg}]. Try another search."
            self.page = hits[0]
            self._lookup_kw = None
            shown = "".join(self.page.sentences[:N_SENTENCES]).strip()
            obs = f"[{self.page.title}] {shown}"
            if self.page.title.strip().lower() != arg.strip().lower() and len(hits) > 1:
                obs += " (Other pages: " + ", ".join(h.title for h in hits[1:5]) + ".)"
            return obs
        if action == "lookup":
            if self.page is None:
                return "No page to look up in yet: search first."
            kw = arg.lower()
            if kw != self._lookup_kw:
                self._lookup_kw = kw
                self._lookup_hits = [s.strip() for s in self.page.sentences if kw in s.lower()]
                self._lookup_i = 0
            if self._lookup_i >= len(self._lookup_hits):
                return "No more results."
            self._lookup_i += 1
            n = len(self._lookup_hits)
            return f"(Result {self._lookup_i} / {n}) {self._lookup_hits[self._lookup_i - 1]}"
        return f"Invalid action: {action}[{arg}]."
