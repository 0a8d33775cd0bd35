"""OpenTelemetry from ``ccpo serve`` (the real entry point, a subprocess) to a real OTLP/HTTP
receiver on 127.0.0.1 (:mod:`ccpo.testing.otlp_receiver`, decoding the protobuf
``ExportTraceServiceRequest`` with opentelemetry-proto's classes), against the scripted LLM
server: one question gives one ``invoke_agent`` span with a child span per LLM call."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from ccpo.cli import main
from ccpo.testing import free_port, wait_for_http
from ccpo.testing.otlp_receiver import OTLPReceiver, span_tree
from ccpo.traces.io import read_traces
from tests.helpers.cli import ENV, start_serve, without, write_deploy_config
from tests.helpers.serve import Q

SECRET = "sk-test-otel-9f8e7d6c5b4a"
QUESTION_SPAN = "invoke_agent ccpo"


def _otel_env(rx: OTLPReceiver, **extra: str) -> dict:
    clean = {k: v for k, v in ENV.items() if not k.startswith("OTEL_")}
    return {
        **clean,
        "OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint,
        "OTEL_SERVICE_NAME": "ccpo-test",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test",
        "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=t1",
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # export within 50 ms rather than 5 s
        **extra,
    }


def _serve_one(world, policy, prices, tmp_path, env: dict, headers=None, **config):
    """Serve ``policy`` with ``env`` (and deploy ``config`` values), answer one question
    (sent with ``headers``); (answer set, stderr, LLM requests made)."""
    keys = {"base_key_env": "CCPO_TEST_KEY", "guide_key_env": "CCPO_TEST_KEY"}
    cfg = write_deploy_config(tmp_path, world, prices, **keys, **config)
    before = world.n_requests
    env = {**env, "CCPO_TEST_KEY": SECRET}  # the endpoints' API key: never exported
    proc, url = start_serve(
        policy, cfg, free_port(), "--state", str(tmp_path / "state.sqlite"), env=env
    )
    try:
        r = httpx.post(
            url + "/v1/answer", json={"question": Q, "id": "q-1"}, headers=headers, timeout=30
        )
        assert r.status_code == 200, r.text
        calls = world.n_requests - before
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    return r.json(), err, calls


def test_one_question_is_one_span_with_a_child_per_llm_call(
    world, policy_dir, prices_path, tmp_path
):
    with OTLPReceiver() as rx:  # κ = 0: every round runs (next is in C(o_t) until T)
        env = _otel_env(rx)
        ans, err, calls = _serve_one(world, policy_dir, prices_path, tmp_path, env, kappa=0.0)
        spans = rx.wait_for(QUESTION_SPAN)
    print(span_tree(spans))  # shown with -s: the tree of one question
    assert f"OpenTelemetry traces to {rx.endpoint} (OTLP/HTTP)" in err
    roots = [s for s in spans if s.name == QUESTION_SPAN]
    assert len(roots) == 1
    q = roots[0]
    kids = [s for s in spans if s.parent_id == q.span_id]
    assert len(spans) == 1 + len(kids) == 1 + calls  # nothing else, one span per request made
    assert q.parent_id == "" and q.kind == "INTERNAL" and q.status == "UNSET"
    assert q.resource["service.name"] == "ccpo-test"
    assert q.resource["deployment.environment"] == "test"
    a = q.attributes
    assert a["gen_ai.operation.name"] == "invoke_agent" and a["gen_ai.agent.name"] == "ccpo"
    assert a["ccpo.question.id"] == "q-1" and a["ccpo.policy"] == "ccpo"
    assert a["ccpo.task"] == "mmlu" and a["ccpo.horizon"] == 4 and a["ccpo.alpha"] == 0.1
    assert a["ccpo.kappa"] == ans["kappa"] == 0.0
    assert a["ccpo.rounds"] == ans["rounds"] == 4 and a["ccpo.set_size"] == len(ans["answers"])
    assert a["ccpo.cost_usd"] == pytest.approx(ans["cost_usd"], rel=1e-12)
    # one event per round: C(o_t) and π as the answer set's log has them
    assert [e[0] for e in q.events] == ["ccpo.round"] * ans["rounds"]
    for (_, ev), log in zip(q.events, ans["log"], strict=True):
        assert ev["ccpo.round"] == log["round"]
        assert ev["ccpo.decision"] == "+".join(log["actions"])
        assert ev["ccpo.go_on"] == ("next" in log["actions"])
        assert ev["ccpo.pi.next"] == pytest.approx(log["pi"]["next"], rel=1e-12)
        assert ev["ccpo.cost_usd"] == pytest.approx(log["cost_usd"], rel=1e-12)
    assert a["ccpo.decision"] == "+".join(ans["log"][-1]["actions"])
    # the LLM calls: GenAI conventions, in the question's trace, inside its time
    rounds = {(s.attributes["ccpo.round"], s.attributes["ccpo.role"]) for s in kids}
    assert rounds == {(t, r) for t in range(1, ans["rounds"] + 1) for r in ("base", "guide")}
    for s in kids:
        c = s.attributes
        assert s.trace_id == q.trace_id and s.kind == "CLIENT" and s.status == "UNSET"
        assert q.start_ns <= s.start_ns <= s.end_ns <= q.end_ns
        model = {"base": "base-m", "guide": "guide-m"}[c["ccpo.role"]]
        assert s.name == f"chat {model}"
        assert c["gen_ai.operation.name"] == "chat" and c["gen_ai.provider.name"] == "_OTHER"
        assert c["gen_ai.request.model"] == c["gen_ai.response.model"] == model
        assert c["gen_ai.usage.input_tokens"] > 0 and c["gen_ai.usage.output_tokens"] > 0
        assert c["gen_ai.request.max_tokens"] > 0 and "gen_ai.request.temperature" in c
        assert c["server.address"] == "127.0.0.1" and c["server.port"] == world.port
        assert c["ccpo.cached"] is False and c["ccpo.cost_usd"] > 0
        assert c["gen_ai.response.finish_reasons"] == ["stop"]
    assert sum(s.attributes["ccpo.cost_usd"] for s in kids) == pytest.approx(ans["cost_usd"])
    assert a["gen_ai.usage.input_tokens"] == sum(
        s.attributes["gen_ai.usage.input_tokens"] for s in kids
    )
    # privacy: no prompt, question or answer, and never the API key, in what was exported
    raw = b"".join(rx.bodies)
    assert SECRET.encode() not in raw
    assert b"prime number" not in raw
    assert not any("gen_ai.input.messages" in s.attributes for s in spans)
    for text in ans["answers"]:
        assert text.encode() not in raw or len(text) < 3  # one-letter choices occur anywhere


def test_message_content_only_when_opted_in(world, policy_dir, prices_path, tmp_path):
    """``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`` (the conventions' opt-in)
    adds the messages to the LLM-call spans; the API key still never leaves. The request's
    W3C ``traceparent`` makes the question a child of the caller's span, in its trace."""
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    with OTLPReceiver() as rx:
        env = _otel_env(rx, OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="true")
        headers = {"traceparent": f"00-{trace_id}-{parent}-01"}
        _serve_one(world, policy_dir, prices_path, tmp_path, env, headers)
        spans = rx.wait_for(QUESTION_SPAN)
    q = next(s for s in spans if s.name == QUESTION_SPAN)
    assert q.trace_id == trace_id and q.parent_id == parent
    assert {s.trace_id for s in spans} == {trace_id}
    kids = [s for s in spans if s.name.startswith("chat ")]
    assert kids and all(s.parent_id == q.span_id for s in kids)
    for s in kids:
        msgs = json.loads(s.attributes["gen_ai.input.messages"])
        assert msgs[-1]["role"] == "user" and msgs[0]["parts"][0]["type"] == "text"
        out = json.loads(s.attributes["gen_ai.output.messages"])
        assert out[0]["role"] == "assistant"
    assert any("prime number" in s.attributes["gen_ai.input.messages"] for s in kids)
    assert SECRET.encode() not in b"".join(rx.bodies)


def test_unset_endpoint_exports_nothing_and_imports_no_sdk(
    world, policy_dir, prices_path, tmp_path
):
    """Other OTEL_* settings without an endpoint: tracing stays off. The SDK and the exporter
    are unimportable in this process, and the question is answered all the same."""
    env = without(tmp_path, "opentelemetry.sdk", "opentelemetry.exporter", env=ENV)
    env = {k: v for k, v in env.items() if not k.startswith("OTEL_EXPORTER_OTLP")}
    env.update(OTEL_SERVICE_NAME="ccpo-test", OTEL_TRACES_SAMPLER="always_on")
    with OTLPReceiver() as rx:
        ans, err, calls = _serve_one(world, policy_dir, prices_path, tmp_path, env)
        assert ans["answers"] and calls > 0
        assert rx.spans == [] and rx.bodies == []
    assert "OpenTelemetry" not in err and "Traceback" not in err


def _serve_fails(env: dict, policy_dir, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ccpo", "serve", "--policy", str(policy_dir),
         "--port", str(free_port()), "--state", str(tmp_path / "s.sqlite")],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize(
    "var", ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
)
def test_endpoint_set_without_the_extra_names_it(policy_dir, tmp_path, var):
    env = without(tmp_path, "opentelemetry.sdk", "opentelemetry.exporter", env=ENV)
    r = _serve_fails({**env, var: "http://127.0.0.1:4318"}, policy_dir, tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert f"{var} is set: exporting OpenTelemetry traces needs" in r.stderr
    assert "pip install 'ccpo[otel]'" in r.stderr


@pytest.mark.parametrize(
    "settings, needle",
    [
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_PROTOCOL=grpc: ccpo"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, "must be an http:// or https://"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://u:pw@h:99999"}, "must be an http:// or"),
    ],
)
def test_settings_it_cannot_use_are_refused_with_what_to_do(policy_dir, tmp_path, settings, needle):
    env = {**ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", **settings}
    r = _serve_fails(env, policy_dir, tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and needle in r.stderr and "Traceback" not in r.stderr
    assert "pw" not in r.stderr  # a password in the URL is never printed


def test_what_turns_tracing_on():
    """An endpoint variable turns it on; ``OTEL_SDK_DISABLED=true`` or
    ``OTEL_TRACES_EXPORTER=none`` keep it off all the same."""
    from ccpo.llm.tracing import wanted

    on = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert wanted(on) == "OTEL_EXPORTER_OTLP_ENDPOINT"
    assert wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://h:4318/v1/traces"}) is not None
    assert wanted({"OTEL_SERVICE_NAME": "x", "OTEL_EXPORTER_OTLP_ENDPOINT": " "}) is None
    assert wanted({**on, "OTEL_SDK_DISABLED": "true"}) is None
    assert wanted({**on, "OTEL_SDK_DISABLED": "false"}) == "OTEL_EXPORTER_OTLP_ENDPOINT"
    assert wanted({**on, "OTEL_TRACES_EXPORTER": "none"}) is None


def test_a_reused_step_has_no_span_and_its_round_says_so(tmp_path):
    """An imported ladder of one model per step: each round's guide repeats its base's call
    (paid once): the round event lists it in ``ccpo.reused`` and no LLM-call span is made for
    it. (An imported 4-model table, a depth-k policy, κ = 0 so that every round runs, against
    replay-server.)"""
    import yaml

    from ccpo.testing.ladder_table import write_ladder_table

    table, prices = write_ladder_table(tmp_path, n=60, seed=0)
    traces, pol = tmp_path / "t.jsonl", tmp_path / "pol"
    for args in (
        ["traces", "import", str(table), "--task", "medqa", "--family", "mcq",
         "--prices", str(prices), "--out", str(traces)],
        ["train", "--traces", str(traces), "--method", "depth-k", "--prices", str(prices),
         "--out", str(pol)],
    ):  # fmt: skip
        assert main(args) == 0
    port = free_port()
    replay = subprocess.Popen(
        [sys.executable, "-m", "ccpo", "replay-server", "--traces", str(traces),
         "--port", str(port), "--log-level", "warning"],
        env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    cfg = tmp_path / "deploy.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {"endpoints": {"*": {"url": f"http://127.0.0.1:{port}/v1"}}, "kappa": 0.0,
             "prices": [str(prices)]}
        )
    )  # fmt: skip
    question = read_traces(traces)[0].question
    try:
        wait_for_http(f"http://127.0.0.1:{port}/healthz", replay, 60, "replay-server")
        with OTLPReceiver() as rx:
            proc, url = start_serve(pol, cfg, free_port(), "--state",
                                     str(tmp_path / "s.sqlite"), env=_otel_env(rx))  # fmt: skip
            try:
                body = {"question": question}
                ans = httpx.post(url + "/v1/answer", json=body, timeout=30).json()
            finally:
                proc.terminate()
                proc.communicate(timeout=20)
            spans = rx.wait_for(QUESTION_SPAN)
    finally:
        replay.terminate()
        replay.communicate(timeout=20)
    root = next(s for s in spans if s.name == QUESTION_SPAN)
    calls = sorted((s for s in spans if s.parent_id == root.span_id), key=lambda s: s.start_ns)
    T = ans["horizon"]
    assert T >= 2 and ans["rounds"] == root.attributes["ccpo.rounds"] == T
    reused = {ev["ccpo.round"]: ev.get("ccpo.reused", []) for _, ev in root.events}
    assert reused == {t: ["guide"] for t in range(1, T + 1)}
    made = sorted((s.attributes["ccpo.round"], s.attributes["ccpo.role"]) for s in calls)
    assert made == [(t, "base") for t in range(1, T + 1)]
    assert [lg["models"] for lg in ans["log"]] == [
        [s.attributes["gen_ai.request.model"] for s in calls if s.attributes["ccpo.round"] == t]
        for t in range(1, T + 1)
    ]


def test_a_failed_call_is_an_error_span_without_its_message(policy_dir, prices_path, tmp_path):
    """An endpoint that answers 500 until the retries run out: the call's span and the
    question's are status ERROR with ``error.type``; the error's message (which names the
    endpoint) is not exported."""
    from tests.helpers.world import make_world

    with make_world(failure_rate=1.0, failure_kinds=("500",)) as dead, OTLPReceiver() as rx:
        cfg = write_deploy_config(tmp_path, dead, prices_path, max_retries=1)
        env = {**_otel_env(rx), "CCPO_TEST_KEY": SECRET}
        proc, url = start_serve(policy_dir, cfg, free_port(), "--state",
                                 str(tmp_path / "s.sqlite"), env=env)  # fmt: skip
        try:
            r = httpx.post(url + "/v1/answer", json={"question": Q}, timeout=30)
        finally:
            proc.terminate()
            proc.communicate(timeout=20)
        spans = rx.wait_for(QUESTION_SPAN)
    assert r.status_code == 502, r.text
    q = next(s for s in spans if s.name == QUESTION_SPAN)
    calls = [s for s in spans if s.parent_id == q.span_id]
    assert len(calls) == 1 and calls[0].name == "chat base-m"
    for s in (q, calls[0]):
        assert s.status == "ERROR" and s.attributes["error.type"] == "LLMCallError"
    assert (
        "ccpo.rounds" not in q.attributes and "gen_ai.usage.input_tokens" not in calls[0].attributes
    )
    raw = b"".join(rx.bodies)
    assert b"giving up" not in raw and b"HTTP 500" not in raw


def test_ask_exports_the_question_trace_too(world, policy_dir, prices_path, tmp_path):
    """``ccpo ask`` (a subprocess that exits right after answering) exports the same span tree
    as serve: one ``invoke_agent`` span, a child per LLM call, flushed before it exits."""
    cfg = write_deploy_config(tmp_path, world, prices_path, kappa=0.0)
    with OTLPReceiver() as rx:
        before = world.n_requests
        out = subprocess.run(
            [sys.executable, "-m", "ccpo", "ask", Q, "--policy", str(policy_dir),
             "--config", str(cfg), "--json"],
            env=_otel_env(rx, OTEL_BSP_SCHEDULE_DELAY="60000"),  # only the exit flush sends
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        calls = world.n_requests - before
        spans = rx.wait_for(QUESTION_SPAN)
    ans = json.loads(out.stdout)
    roots = [s for s in spans if s.name == QUESTION_SPAN]
    assert len(roots) == 1 and roots[0].attributes["ccpo.rounds"] == ans["rounds"] == 4
    kids = [s for s in spans if s.parent_id == roots[0].span_id]
    assert len(kids) == calls == 8 and all(s.name.startswith("chat ") for s in kids)
