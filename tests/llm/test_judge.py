"""``ccpo traces judge`` against a scripted judge on 127.0.0.1, through the real entry point:
each reply is labelled by the judge's rating (or pairwise verdicts) against the reference
model's reply; an unreadable rating is asked once more, then left unjudged and counted;
a run stopped by its budget resumes without paying for a call twice; the judge and the
rule are in meta.labels and in the guarantee of a policy trained on the labels."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from pathlib import Path

from ccpo.llm.judge import parse_rating, parse_verdict
from ccpo.testing.scripted_server import ScriptedServer
from ccpo.traces.io import read_traces
from ccpo.traces.labels import labels_of, rule_labels
from tests.helpers.cli import CCPO, assert_usage_error, run_ccpo
from tests.helpers.importing import labels_by_model

MODELS = ("small-m", "mid-m", "big-m")  # priced in that order: big-m is the reference
JUDGE = "judge-m"
# question -> replies of small-m and mid-m (big-m always replies "REF answer <q>")
REPLIES = {
    "q1": ("GOOD reply one", "GOOD reply one too"),
    "q2": ("BAD reply", "GOOD reply two"),
    "q3": ("BAD short", "FLAKY but good"),  # the judge's first reply to FLAKY is unreadable
    "q4": ("GARBLED reply", "GOOD reply four"),  # never a readable rating: unjudged
    "q5": ("", "BAD again"),  # an empty reply is not asked: never accepted
}
_GRADED = re.compile(r"<reply_to_grade>\n(.*?)\n</reply_to_grade>", re.S)
_PAIR = re.compile(r"<reply_A>\n(.*?)\n</reply_A>\n\n<reply_B>\n(.*?)\n</reply_B>", re.S)


def _table(tmp_path: Path) -> Path:
    rows = []
    for q, (small, mid) in REPLIES.items():
        for model, answer in zip(MODELS, (small, mid, f"REF answer {q}"), strict=True):
            rows.append({"question_id": q, "question": f"Please help with {q}.", "model": model,
                         "answer": answer, "input_tokens": 20, "output_tokens": 40})  # fmt: skip
    path = tmp_path / "table.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _traces(tmp_path: Path) -> tuple[Path, Path]:
    """The traces to judge (imported; family exact) and the price file (judge included)."""
    prices = tmp_path / "prices.json"
    from ccpo.traces.prices import write_price_file

    write_price_file(prices, {"small-m": (0.1, 0.4), "mid-m": (1, 4), "big-m": (10, 40),
                              JUDGE: (1000.0, 1000.0)}, "test")  # fmt: skip
    out = tmp_path / "traces.jsonl"
    res = run_ccpo("traces", "import", str(_table(tmp_path)), "--task", "chatlike", "--family",
                   "exact", "--prices", str(prices), "--out", str(out))  # fmt: skip
    assert res.returncode == 0, res.stderr
    return out, prices


class Judge:
    """The scripted judge's replies, read from the prompt: GOOD or FLAKY (after its first
    unreadable reply) rate 9, BAD rates 3, GARBLED is never readable; pairwise, the
    reference wins against BAD and ties otherwise."""

    def __init__(self) -> None:
        self.flaked = False

    def __call__(self, req: dict) -> str:
        text = req["messages"][-1]["content"]
        pair = _PAIR.search(text)
        if pair:
            a, b = pair.groups()
            if "BAD" in a:
                return "B is right where A is not.\nVerdict: B"
            if "BAD" in b:
                return "A is right.\nVerdict: [[A]]"
            return "Both do the job.\nVerdict: tie"
        reply = _GRADED.search(text).group(1)
        if "GARBLED" in reply or ("FLAKY" in reply and not self.flaked):
            self.flaked = self.flaked or "FLAKY" in reply
            return "Hmm, hard to say."
        return "Wrong." + "\nRating: 3" if "BAD" in reply else "Matches the reference.\nRating: 9"


def _judge(traces: Path, prices: Path, srv: ScriptedServer, out: Path, cache: Path, *extra):
    return run_ccpo("traces", "judge", str(traces), "--out", str(out), "--judge-model", JUDGE,
                    "--judge-url", srv.url, "--prices", str(prices), "--cache", str(cache),
                    "--concurrency", "1", "--quiet", *extra)  # fmt: skip


def test_parsers_read_the_last_rating_and_verdict_only() -> None:
    assert parse_rating("Rating: [[7]] … on reflection Rating: 8") == 8
    assert parse_rating("rating = 9.5") == 9.5
    assert parse_rating("Rating: 11") is None and parse_rating("no number") is None
    assert parse_verdict("Verdict: A ... Verdict: tie") == "tie"
    assert parse_verdict("verdict: [[b]]") == "B" and parse_verdict("A is better") is None


def test_ratings_label_each_reply_and_an_unreadable_one_is_retried_then_unjudged(tmp_path):
    traces, prices = _traces(tmp_path)
    out, cache = tmp_path / "judged.jsonl", tmp_path / "cache.sqlite"
    with ScriptedServer(fallback=Judge(), logprobs_mode="reject") as srv:
        res = _judge(traces, prices, srv, out, cache)
        assert res.returncode == 0, res.stderr
        # 9 non-empty replies asked once, FLAKY once more, GARBLED once more
        assert srv.n_completions == 9 + 2
        temps = {r.get("temperature") for r in srv.requests}
    assert temps == {0.0}
    flat = " ".join(res.stdout.split())
    assert "2 judge replies unreadable and asked again; 1 unjudged (never guessed)" in flat
    assert "1 unjudged, question left out: q4: small-m" in flat
    assert "labels: acceptance (rated ≥ 8 of 10 by judge-m against big-m's reply)" in flat
    assert labels_by_model(out) == {
        "q1": {"small-m": True, "mid-m": True, "big-m": True},
        "q2": {"small-m": False, "mid-m": True, "big-m": True},
        "q3": {"small-m": False, "mid-m": True, "big-m": True},
        "q5": {"small-m": False, "mid-m": False, "big-m": True},
    }
    judged = read_traces(out)
    labels = labels_of(judged)
    assert rule_labels(labels) == {"kind": "judged", "judge": JUDGE, "reference": "big-m",
                                   "mode": "rating", "rule": "score>=8",
                                   "prompt": "ccpo-judge/1"}  # fmt: skip
    q2 = next(t for t in judged if t.id == "q2")
    assert q2.gold == ["REF answer q2"]
    assert q2.rounds[0].base.model_extra["judge"] == {"rating": 3.0}
    total, this_run, calls, earlier, served = _spend(res.stdout)
    assert total == this_run > 0 and (calls, earlier, served) == (11, 0.0, 0)


def test_an_interrupted_run_resumes_without_paying_twice(tmp_path) -> None:
    traces, prices = _traces(tmp_path)
    out, cache = tmp_path / "judged.jsonl", tmp_path / "cache.sqlite"
    with ScriptedServer(fallback=Judge(), logprobs_mode="reject") as srv:
        res = _judge(traces, prices, srv, out, cache, "--max-cost", "1.5")
        assert res.returncode == 1, (res.stdout, res.stderr)
        assert "stopped" in res.stdout and not out.exists()
        first = srv.n_completions
        assert 0 < first < 11
        res = _judge(traces, prices, srv, out, cache)
        assert res.returncode == 0, res.stderr
        assert srv.n_completions == 11  # every call paid once over both runs
        assert _spend(res.stdout)[2::2] == (11 - first, first)  # calls made, replies served
        # a third run pays nothing at all
        res = _judge(traces, prices, srv, out, cache, "--force")
        assert res.returncode == 0 and srv.n_completions == 11


def _spend(stdout: str) -> tuple[float, float, int, float, int]:
    """What a run printed it spent: in all, by this run (on how many calls), by earlier runs
    (how many replies the cache served)."""
    flat = " ".join(stdout.split())
    m = re.search(
        r"spent \$([0-9.]+) in all: \$([0-9.]+) by this run on (\d+) judge calls, "
        r"\$([0-9.]+) by earlier runs \((\d+) replies served by the cache\)",
        flat,
    )
    assert m, flat
    return float(m[1]), float(m[2]), int(m[3]), float(m[4]), int(m[5])


def _billed(srv: ScriptedServer, prices: Path) -> float:
    from ccpo.traces.prices import load_prices

    table = load_prices(prices)
    return sum(table.cost(m, i, o) for m, (i, o) in srv.billed.items())


def test_the_spend_is_printed_when_the_judge_dies_and_in_all_after_a_resume(tmp_path) -> None:
    """The judge endpoint is gone for good after four replies (404: its model removed): the
    run stops, exit 1, and prints what it paid (it printed the error only). Resumed against
    the endpoint back, it prints the whole judging's spend (the replies earlier runs paid for,
    which the cache serves, priced) and this run's part (it printed this run's only)."""
    traces, prices = _traces(tmp_path)
    out, cache = tmp_path / "judged.jsonl", tmp_path / "cache.sqlite"
    judge = Judge()
    with ScriptedServer(logprobs_mode="reject", failure_kinds=("404",)) as srv:

        def dying(req: dict) -> str:
            if srv.n_completions == 3:  # this is the fourth reply: the next requests fail
                srv.failure_rate = 1.0
            return judge(req)

        srv.fallback = dying
        res = _judge(traces, prices, srv, out, cache)
        assert res.returncode == 1, (res.stdout, res.stderr)
        assert "stopped" in res.stdout and "HTTP 404" in res.stdout and not out.exists()
        first = _billed(srv, prices)
        assert srv.n_completions == 4 and first > 0
        total, this_run, calls, earlier, served = _spend(res.stdout)
        assert (calls, served, earlier) == (4, 0, 0.0)
        assert abs(this_run - first) < 1e-4 and abs(total - first) < 1e-4
        srv.failure_rate = 0.0  # the endpoint is back: resume
        res = _judge(traces, prices, srv, out, cache)
        assert res.returncode == 0, (res.stdout, res.stderr)
        assert srv.n_completions == 11  # nothing paid twice
        total, this_run, calls, earlier, served = _spend(res.stdout)
    assert (calls, served) == (7, 4)
    assert abs(earlier - first) < 1e-4 and abs(this_run - (_billed(srv, prices) - first)) < 1e-4
    assert abs(total - _billed(srv, prices)) < 1e-4  # the whole judging's bill


def test_a_killed_run_resumed_prints_what_the_cache_recorded_in_all(tmp_path) -> None:
    """``kill -9`` while the judge holds its fifth reply: the four replies before are cached.
    Resumed, the run prints them as the earlier runs' spend (at the tokens each recorded)
    beside its own, and "in all" is the endpoint's bill but the one reply the kill cut off,
    which nothing recorded (the endpoint billed it, the resume paid for it again)."""
    traces, prices = _traces(tmp_path)
    out, cache = tmp_path / "judged.jsonl", tmp_path / "cache.sqlite"
    judge, held, release = Judge(), threading.Event(), threading.Event()
    with ScriptedServer(logprobs_mode="reject") as srv:

        def holding(req: dict) -> str:
            if srv.n_completions == 4 and not release.is_set():
                held.set()
                release.wait(30)
            return judge(req)

        srv.fallback = holding
        args = [CCPO, "traces", "judge", str(traces), "--out", str(out), "--judge-model", JUDGE,
                "--judge-url", srv.url, "--prices", str(prices), "--cache", str(cache),
                "--concurrency", "1", "--quiet"]  # fmt: skip
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert held.wait(60), proc.communicate(timeout=5)
            four = _billed(srv, prices)
            proc.kill()  # SIGKILL: nothing printed, nothing written
        finally:
            proc.communicate(timeout=30)
            release.set()
        while srv.n_completions < 5:  # the endpoint bills the reply cut off
            time.sleep(0.01)
        cut_off = _billed(srv, prices) - four
        res = _judge(traces, prices, srv, out, cache)
        assert res.returncode == 0, (res.stdout, res.stderr)
        total, this_run, calls, earlier, served = _spend(res.stdout)
        billed = _billed(srv, prices)
    assert (calls, served) == (7, 4) and srv.n_completions == 12  # the cut-off one twice
    assert abs(earlier - four) < 1e-4 and abs(this_run - (billed - four - cut_off)) < 1e-4
    assert abs(total - (billed - cut_off)) < 1e-4


def test_pairwise_asks_both_orders_and_the_reference_winning_either_rejects(tmp_path) -> None:
    traces, prices = _traces(tmp_path)
    out = tmp_path / "pairwise.jsonl"
    with ScriptedServer(fallback=Judge(), logprobs_mode="reject") as srv:
        res = _judge(traces, prices, srv, out, tmp_path / "c.sqlite", "--mode", "pairwise")
        assert res.returncode == 0, res.stderr
        assert srv.n_completions == 2 * 9
    got = labels_by_model(out)
    assert got["q2"] == {"small-m": False, "mid-m": True, "big-m": True}
    assert got["q4"]["small-m"] is True  # GARBLED is only unreadable as a rating
    assert "judged by judge-m at least as good as big-m's reply" in " ".join(res.stdout.split())
    q2 = next(t for t in read_traces(out) if t.id == "q2")
    assert q2.rounds[0].base.model_extra["judge"] == {"pairwise": ["B", "A"]}


def test_bad_judge_options_are_refused_before_any_call(tmp_path) -> None:
    traces, prices = _traces(tmp_path)
    with ScriptedServer(fallback=Judge()) as srv:
        for extra, needles in (
            (("--accept", "score>=reference-1"), ("does not rate itself",)),
            (("--accept", "rating is high"), ("score OP NUMBER",)),
            (("--mode", "pairwise", "--accept", "score>=7"), ("--accept applies to ratings",)),
            (("--mode", "vote"), ("--mode 'vote'",)),
            (("--reference", "nobody"), ("--reference 'nobody'",)),
        ):
            res = _judge(traces, prices, srv, tmp_path / "x.jsonl", tmp_path / "c.sqlite", *extra)
            assert_usage_error(res, *needles)
        assert srv.n_requests == 0


def test_a_policy_on_judged_traces_names_judge_and_rule_in_its_guarantee(tmp_path) -> None:
    from ccpo.policies.registry import load_policy
    from ccpo.traces.io import write_traces

    traces, prices = _traces(tmp_path)
    out = tmp_path / "judged.jsonl"
    with ScriptedServer(fallback=Judge(), logprobs_mode="reject") as srv:
        assert _judge(traces, prices, srv, out, tmp_path / "c.sqlite").returncode == 0
    # enough questions to train on: the judged traces repeated under new ids
    judged = read_traces(out)
    many = [t.model_copy(update={"id": f"{t.id}-{i}"}) for i in range(40) for t in judged]
    big = tmp_path / "many.jsonl"
    write_traces(big, many)
    res = run_ccpo("train", "--traces", str(big), "--alpha", "0.2", "--method", "depth-k",
                   "--answer", "single", "--prices", str(prices),
                   "--out", str(tmp_path / "pol"))  # fmt: skip
    assert res.returncode == 0, res.stderr
    statement = load_policy(tmp_path / "pol").guarantee_statement()
    assert statement == (
        "the answer is rated ≥ 8 of 10 by judge-m against big-m's reply with probability ≥ 0.8"
    )


def test_the_conversation_is_the_traces_messages_when_it_has_them(tmp_path) -> None:
    traces, _ = _traces(tmp_path)
    tr = read_traces(traces)[0]
    assert tr.conversation().as_list() == [{"role": "user", "content": "Please help with q1."}]
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    chat = type(tr).model_validate({**tr.to_json_dict(), "messages": msgs})
    assert chat.conversation().as_list() == msgs


def test_the_ladders_prices_travel_beside_the_judged_traces(tmp_path) -> None:
    """The import's own price file (``traces.prices.json``, from its ``--prices``) is carried
    beside the judged output, with only the judge's price given to ``judge``: ``train`` then
    prices the judged traces without ``--prices``, as it would the imported ones."""
    from ccpo.traces.prices import read_price_file, write_price_file

    traces, prices = _traces(tmp_path)
    judge_only = write_price_file(tmp_path / "judge-price.json", {JUDGE: (1000.0, 1000.0)}, "t")
    out = tmp_path / "judged.jsonl"
    with ScriptedServer(fallback=Judge(), logprobs_mode="reject") as srv:
        res = _judge(traces, judge_only, srv, out, tmp_path / "c.sqlite")
    assert res.returncode == 0, res.stderr
    side = tmp_path / "judged.prices.json"
    assert f"wrote the prices of its models to {side}" in " ".join(res.stdout.split())
    carried, given = read_price_file(side), read_price_file(prices)
    assert sorted(carried.models) == sorted(MODELS)  # the ladder's, not the judge's
    assert all(carried.price(m) == given.price(m) for m in MODELS)
    res = run_ccpo("traces", "stats", str(out))  # no --prices: read beside the traces
    assert res.returncode == 0, res.stderr


def test_a_verify_step_takes_the_label_of_the_reply_it_returns(tmp_path) -> None:
    """The judge grades each model's reply once; a verify step (mid-m's verdict on small-m's
    reply, simulated here) is labelled as the reply it returns, never as mid-m's."""
    from ccpo.traces.prices import write_price_file

    prices = write_price_file(tmp_path / "prices.json", {"small-m": (0.1, 0.4), "mid-m": (1, 4),
                              "big-m": (10, 40), JUDGE: (1000.0, 1000.0)}, "test")  # fmt: skip
    traces = tmp_path / "verified.jsonl"
    res = run_ccpo("traces", "import", str(_table(tmp_path)), "--task", "chatlike", "--family",
                   "exact", "--prices", str(prices), "--out", str(traces), "--verifier",
                   "mid-m", "--verify-after", "small-m", "--simulate-verifier", "1")  # fmt: skip
    assert res.returncode == 0, res.stderr
    out, cache = tmp_path / "judged.jsonl", tmp_path / "cache.sqlite"
    with ScriptedServer(fallback=Judge(), logprobs_mode="reject") as srv:
        res = _judge(traces, prices, srv, out, cache)
        assert res.returncode == 0, res.stderr
        assert srv.n_completions == 9 + 2  # as without the verify step: no reply twice
    for tr in read_traces(out):
        check = tr.rounds[1]
        assert check.verdict_mode == "verify" and check.guide.model == "mid-m"
        assert check.guide.correct == check.base.correct == tr.rounds[0].base.correct
    q2 = read_traces(out)[1]  # small-m's reply judged BAD, mid-m's GOOD
    assert [r.guide.correct for r in q2.rounds] == [False, False, True, True]
