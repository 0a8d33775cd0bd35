"""Question loaders: MMLU CSVs, HotpotQA JSON, generic JSONL ``{id, question, gold}``.

Every loader returns :class:`Question` objects in file order; problems in the input become a
:class:`~ccpo.errors.CCPOError` naming the file and (where it applies) the line.

- **MMLU**: headerless CSV rows ``question, A, B, C, D, answer-letter``; a file or a folder of
  ``<subject>_<split>.csv`` files (sorted). The question text shown to models lists the four
  options; gold is the letter. Ids: ``mmlu-<subject>-<row>``.
- **HotpotQA**: a JSON list (``.json`` or ``.json.gz``) of ``{question, answer[, _id|id,
  context]}``. ``context`` (distractor setting) may be ``{"title": [...], "sentences":
  [[...], ...]}`` or the original ``[[title, [sentences]], ...]``; it feeds the offline search
  tool. Ids: ``hotpotqa-<_id>``, or ``hotpotqa-dev-<index>`` without one.
- **JSONL**: one ``{"id", "question", "gold"}`` object a line (``gold`` a string or a list;
  it may be left out when the traces are labelled by a reference model, ``collect
  --reference``); an optional ``context`` as in HotpotQA or as ``[{"title", "text"}]``. A
  conversation (what a chat app exports from its logs) is ``{"id", "messages"}``: the OpenAI
  messages of text, its last user turn the ``question``.

Without ``--data``, the small subsets bundled in ``ccpo/data/`` are used (see their README).
"""

from __future__ import annotations

import csv
import gzip
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ccpo.errors import CCPOError
from ccpo.traces.answers import family_of
from ccpo.traces.conversation import Conversation, ConversationError, conversation_of

TASKS = ("mmlu", "hotpotqa", "jsonl")


@dataclass
class Passage:
    """A titled paragraph, split in sentences (a search-tool document)."""

    title: str
    sentences: list[str]

    @property
    def text(self) -> str:
        return "".join(self.sentences).strip()


@dataclass
class Question:
    id: str
    task: str
    question: str
    gold: list[str]
    context: list[Passage] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    #: a chat question's conversation (``question`` is its last user turn); None: none
    conversation: Conversation | None = None

    @property
    def prompt(self) -> str | Conversation:
        """What the ladder's steps are asked: the conversation, else the question."""
        return self.conversation if self.conversation is not None else self.question


def _bundled(*parts: str) -> Path:
    return Path(str(resources.files("ccpo.data").joinpath(*parts)))


def default_data_path(task: str) -> Path:
    """The bundled subset for a task (MMLU folder, HotpotQA distractor sample)."""
    if task == "mmlu":
        return _bundled("mmlu")
    if task == "hotpotqa":
        return _bundled("hotpotqa", "hotpot_dev_distractor_sample100.json.gz")
    raise CCPOError(f"task '{task}' has no bundled data; pass --data PATH")


def load_questions(
    task: str, path: str | Path | None = None, need_gold: bool = True, family: str | None = None
) -> list[Question]:
    """Load a task's questions from ``path`` (or the bundled subset). A task name that is not
    built in (``medqa``, ...) reads ``path`` as JSONL questions of that task; with
    ``need_gold=False`` (labels from a reference model) their ``gold`` may be absent.
    Conversations (``messages``) are for the ``chat`` family only: another family would not
    pass them on, so a file holding one is refused."""
    if task not in TASKS and path is None:
        raise CCPOError(
            f"task '{task}' is not built in ({', '.join(TASKS)}): pass --data FILE, a JSONL of "
            "its questions"
        )
    p = Path(path) if path is not None else default_data_path(task)
    if not p.exists():
        raise CCPOError(f"{p}: no such file or folder")
    if task == "mmlu":
        return load_mmlu(p)
    if task == "hotpotqa":
        return load_hotpotqa(p)
    qs = load_jsonl(p, need_gold)
    for q in qs:
        q.task = task
    talk = next((q for q in qs if q.conversation is not None), None)
    fam = family_of(task, family)
    if talk is not None and fam != "chat":
        raise CCPOError(
            f"{p}: question '{talk.id}' is a conversation (messages), which the {fam} family "
            "would not pass on (its prompt takes one question): use --task chat or --family chat"
        )
    return qs


# ---------------------------------------------------------------------------- MMLU
def _subject(path: Path) -> str:
    stem = path.stem
    for suf in ("_test", "_val", "_dev"):
        if stem.endswith(suf):
            return stem[: -len(suf)]
    return stem


def load_mmlu(path: str | Path) -> list[Question]:
    p = Path(path)
    files = sorted(p.glob("*.csv")) if p.is_dir() else [p]
    if not files:
        raise CCPOError(f"{p}: no .csv files found (expected MMLU <subject>_test.csv files)")
    out: list[Question] = []
    for f in files:
        subject = _subject(f)
        with open(f, newline="", encoding="utf-8") as fh:
            for i, row in enumerate(csv.reader(fh)):
                if not row:
                    continue
                if len(row) != 6:
                    raise CCPOError(
                        f"{f}:{i + 1}: expected 6 columns (question, A, B, C, D, answer), "
                        f"found {len(row)}"
                    )
                q, a, b, c, d, ans = (x.strip() for x in row)
                ans = ans.upper()
                if ans not in ("A", "B", "C", "D"):
                    raise CCPOError(f"{f}:{i + 1}: answer must be A, B, C or D, found {ans!r}")
                text = f"{q}\nA. {a}\nB. {b}\nC. {c}\nD. {d}"
                out.append(
                    Question(
                        id=f"mmlu-{subject}-{i}",
                        task="mmlu",
                        question=text,
                        gold=[ans],
                        meta={"subject": subject, "options": [a, b, c, d]},
                    )
                )
    return out


# ---------------------------------------------------------------------------- HotpotQA
def _read_json(p: Path) -> Any:
    try:
        if p.suffix == ".gz":
            with gzip.open(p, "rt", encoding="utf-8") as fh:
                return json.load(fh)
        return json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise CCPOError(f"{p}:{e.lineno}: malformed JSON ({e.msg})") from None
    except (OSError, EOFError) as e:
        raise CCPOError(f"{p}: cannot be read ({e})") from None


def parse_context(ctx: Any, where: str) -> list[Passage] | None:
    """Distractor paragraphs in any of the supported layouts (None when absent)."""
    if ctx is None:
        return None
    try:
        if isinstance(ctx, dict) and "title" in ctx:
            return [
                Passage(str(t), [str(s) for s in sents])
                for t, sents in zip(ctx["title"], ctx["sentences"], strict=True)
            ]
        out = []
        for item in ctx:
            if isinstance(item, dict):
                sents = item.get("sentences") or [item.get("text", "")]
                out.append(Passage(str(item["title"]), [str(s) for s in sents]))
            else:
                title, sents = item
                out.append(Passage(str(title), [str(s) for s in sents]))
        return out
    except (KeyError, TypeError, ValueError):
        raise CCPOError(
            f"{where}: 'context' must be {{title: [...], sentences: [[...]]}}, "
            "[[title, [sentences]]] or [{title, text}]"
        ) from None


def load_hotpotqa(path: str | Path) -> list[Question]:
    p = Path(path)
    data = _read_json(p)
    if isinstance(data, dict):
        data = data.get("data", data.get("questions"))
    if not isinstance(data, list):
        raise CCPOError(f"{p}: expected a JSON list of HotpotQA records")
    out = []
    for i, rec in enumerate(data):
        where = f"{p}: record {i}"
        if not isinstance(rec, dict) or "question" not in rec or "answer" not in rec:
            raise CCPOError(f"{where}: needs 'question' and 'answer'")
        rid = rec.get("_id") or rec.get("id")
        qid = f"hotpotqa-{rid}" if rid else f"hotpotqa-dev-{i}"
        out.append(
            Question(
                id=qid,
                task="hotpotqa",
                question=str(rec["question"]).strip(),
                gold=[str(rec["answer"])],
                context=parse_context(rec.get("context"), where),
                meta={k: rec[k] for k in ("type", "level") if k in rec},
            )
        )
    return out


# ---------------------------------------------------------------------------- JSONL
def load_jsonl(path: str | Path, need_gold: bool = True) -> list[Question]:
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    out: list[Question] = []
    seen: set[str] = set()
    with opener(p, "rt", encoding="utf-8") as fh:
        for ln, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{p}:{ln}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise CCPOError(f"{where}: malformed JSON ({e.msg})") from None
            if not isinstance(rec, dict):
                raise CCPOError(f"{where}: expected a JSON object")
            conversation = _conversation(rec, where)
            if conversation is not None:
                rec.setdefault("question", conversation.text)
            for k in ("id", "question", "gold") if need_gold else ("id", "question"):
                if k not in rec:
                    if k == "question":
                        raise CCPOError(f"{where}: field 'question' (or 'messages') is required")
                    hint = " (or label by agreement: --reference MODEL)" if k == "gold" else ""
                    raise CCPOError(f"{where}: field '{k}' is required but missing{hint}")
            gold = rec.get("gold")
            gold = [] if gold is None else gold
            gold = [str(g) for g in gold] if isinstance(gold, list) else [str(gold)]
            if (need_gold or gold) and (not gold or not all(g.strip() for g in gold)):
                raise CCPOError(f"{where}: field 'gold' must hold at least one non-empty answer")
            qid = str(rec["id"])
            if qid in seen:
                raise CCPOError(f"{where}: duplicate id '{qid}'")
            seen.add(qid)
            out.append(
                Question(
                    id=qid,
                    task="jsonl",
                    question=str(rec["question"]),
                    gold=gold,
                    context=parse_context(rec.get("context"), where),
                    conversation=conversation,
                )
            )
    return out


def _conversation(rec: dict[str, Any], where: str) -> Conversation | None:
    """A line's ``messages`` (an app's exported conversation), checked; None without one."""
    if rec.get("messages") is None:
        return None
    try:
        return conversation_of(rec["messages"])
    except ConversationError as e:
        raise CCPOError(f"{where}: {e}") from None
