"""The calls of a round that do not depend on each other are sent at once: an ``agree``
round's base and guide are both open at the server before either is answered (a scripted
server that holds each request until a second one arrives records it), while a ``judge``
round's guide, which reads the base's answer, only follows it. What is stored is unchanged."""

from __future__ import annotations

import threading

from ccpo.llm.collect import collect
from ccpo.testing.scripted_server import ScriptedServer, prompt_text
from ccpo.traces.io import read_traces
from tests.helpers.collecting import cfg_for
from tests.helpers.world import cot_reply, guide_reply

#: how long a request waits for a partner before it gives up (a guard, not a measurement)
WAIT = 5.0
#: how long a judge round's request waits to show it came alone: a partner sent at once would
#: arrive within milliseconds (every request of a question waits this long, so keep it short)
ALONE = 2.0


class Overlap:
    """Holds each request until another is open, and records whether one came."""

    def __init__(self, wait: float = WAIT) -> None:
        self.wait = wait
        self.lock = threading.Lock()
        self.open = 0
        self.overlapped = False  # two requests were open at once
        self.together: list[bool] = []
        self.partner = threading.Condition(self.lock)

    def reply(self, inner):
        def hold(req: dict) -> str:
            with self.partner:
                self.open += 1
                self.overlapped |= self.open >= 2
                self.partner.notify_all()
                met = self.partner.wait_for(lambda: self.overlapped, timeout=self.wait)
                self.together.append(bool(met))
            try:
                return inner(req)
            finally:
                with self.lock:
                    self.open -= 1

        return hold


def _collect(srv, tmp_path, prices_file, ladder):
    cfg = cfg_for(srv, tmp_path, prices_file, "mmlu", ladder=ladder, rounds=1, n=1,
                  base_model=None, guide_model=None, concurrency=2,
                  endpoints={"*": {"url": srv.url}})  # fmt: skip
    assert collect(cfg, progress=False).complete
    return read_traces(cfg.out)


def test_an_agree_rounds_base_and_guide_are_open_at_once(tmp_path, prices_file) -> None:
    seen = Overlap()
    ladder = [{"base": "base-m", "guide": "guide-m", "verdict": "agree"}]
    with ScriptedServer(fallback=seen.reply(cot_reply)) as srv:
        traces = _collect(srv, tmp_path, prices_file, ladder)
        models = [r["model"] for r in srv.requests]
    # one question: its two calls met at the server (the client allows 2 calls at once)
    assert seen.together == [True, True]
    assert sorted(models) == ["base-m", "guide-m"]
    for t in traces:  # stored as before: base and guide each answered alone
        r = t.rounds[0]
        assert (r.base.model, r.guide.model, r.verdict_mode) == ("base-m", "guide-m", "agree")
        assert r.guide.verdict == ("yes" if r.guide.answer == r.base.answer else "no")


def test_a_judge_rounds_guide_waits_for_the_base(tmp_path, prices_file) -> None:
    seen = Overlap(wait=ALONE)

    def reply(req: dict) -> str:
        is_guide = prompt_text(req).startswith("Evaluate the answer.")
        return guide_reply(req) if is_guide else cot_reply(req)

    ladder = [{"base": "base-m", "guide": "guide-m", "verdict": "judge"}]
    with ScriptedServer(fallback=seen.reply(reply), match_last=False) as srv:
        cfg = cfg_for(srv, tmp_path, prices_file, "mmlu", ladder=ladder, rounds=1, n=1,
                      base_model=None, guide_model=None, concurrency=2, timeout=30.0,
                      endpoints={"*": {"url": srv.url}})  # fmt: skip
        assert collect(cfg, progress=False).complete
    assert seen.together == [False, False]  # the base alone, then the guide alone
