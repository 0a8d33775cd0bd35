"""The scripted LLM world: canned replies by prompt, served over real HTTP on 127.0.0.1."""

from __future__ import annotations

import hashlib
import re

from ccpo.testing.scripted_server import ScriptedServer, prompt_text

MODELS = ("base-m", "guide-m", "policy-m", "exit-m")


def _h(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


def _question(text: str) -> str:
    m = re.findall(r"Question: (.*?)(?:\n[A-D]\. |\n|$)", text)
    return m[-1] if m else text


def guide_reply(req: dict) -> str:
    text = prompt_text(req)
    q = re.search(r"Q: (.*?)\nA: ", text, re.S)
    qh = _h(q.group(1) if q else text)
    final = re.search(r"Final answer: (.*)\nYour response", text)
    ans = final.group(1).strip() if final else ""
    if qh % 3 == 0:
        return "Yes"
    if "A." in text and "B." in text:
        return f"No [{'ABCD'[qh % 4]}]"
    return f"No [{ans} Jr]" if ans else "No [Unknown]"


def cot_reply(req: dict) -> str:
    text = prompt_text(req)
    q = _question(text)
    letter = "ABCD"[(_h(q) + int(req.get("temperature", 0) * 7) + text.count("Attempt")) % 4]
    if "A. " in text:
        return f"Step 1: consider the options.\nStep 2: eliminate.\nAnswer: {letter}"
    return f"Reasoning about it.\nAnswer: answer {letter}"


def react_reply(req: dict) -> str:
    text = prompt_text(req)
    m = re.search(r"Thought (\d+):$", text.rstrip())
    step = int(m.group(1)) if m else 1
    q = _question(text)
    words = re.findall(r"[A-Z][a-z]+", q)
    ent = words[0] if words else "thing"
    if step == 1:
        return f" I should look up {ent}.\nAction 1: search[{ent}]\nObservation 1: fake"
    if step == 2:
        return " Look for a keyword.\nAction 2: lookup[the]"
    if step == 3 and _h(q) % 2 == 0:
        return " Not sure yet, searching again.\nAction 3: search[zzzz qqqq]"
    return f" I know it.\nAction {step}: finish[{ent}]"


def make_world(**kw) -> ScriptedServer:
    rules = [
        (r"^Evaluate the answer\.", guide_reply),
        (r"decision-making assistant", lambda r: "2" if _h(prompt_text(r)) % 2 else "3"),
        (
            r"You must decide whether to exit",
            lambda r: (
                "[EXIT]" if len(re.findall(r"\(\d+\) ", prompt_text(r))) >= 3 else "[CONTINUE]"
            ),
        ),
        (r"interleaving Thought, Action, Observation", react_reply),
    ]
    return ScriptedServer(rules=rules, fallback=cot_reply, **kw)
