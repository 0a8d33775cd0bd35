"""``ccpo serve`` as the tools users already run see it: the ``openai`` SDK as the client of
``POST /v1/chat/completions``, and ``/metrics`` read by Prometheus's own text parser."""

from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.serve import LiveServer, make_service

Q = "Which is a prime number?\nA. 4\nB. 6\nC. 7\nD. 9"


def test_the_openai_sdk_talks_to_ccpo_serve(world, policy_dir, prices_path, monkeypatch):
    monkeypatch.setenv("CCPO_SERVE_TOKEN", "tok-abcdef")
    with LiveServer(make_service(policy_dir, world, prices_path)) as ls:
        client = openai.OpenAI(base_url=ls.url + "/v1", api_key="tok-abcdef", max_retries=0)
        r = client.chat.completions.create(
            model="ccpo",
            messages=[
                {"role": "system", "content": "You answer multiple-choice questions."},
                {"role": "user", "content": "an earlier question"},
                {"role": "assistant", "content": "an earlier answer"},
                {"role": "user", "content": Q},
            ],
            temperature=0.7,  # accepted and ignored: the policy decides
            extra_body={"ccpo": {"id": "chat-1"}},
        )
        s = r.model_extra["ccpo"]  # the full ccpo.answer/v1 object alongside
        assert r.object == "chat.completion" and r.model == "ccpo" and r.id == "chatcmpl-chat-1"
        assert s["id"] == "chat-1" and s["question"] == Q and s["answers"]
        assert r.choices[0].message.content == "\n".join(s["answers"])
        assert r.choices[0].finish_reason == "stop"
        # the same id over the native endpoint is the stored answer set
        native = httpx.post(
            ls.url + "/v1/answer",
            json={"question": Q, "id": "chat-1"},
            headers={"Authorization": "Bearer tok-abcdef"},
        ).json()
        assert native == s
        # errors are OpenAI-style errors to the SDK
        with pytest.raises(openai.NotFoundError, match="use 'ccpo'"):
            client.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": Q}]
            )
        with pytest.raises(openai.UnprocessableEntityError, match="no user message"):
            client.chat.completions.create(
                model="ccpo", messages=[{"role": "system", "content": "hi"}]
            )
        # stream: true (many chat clients' default) is answered as server-sent events
        chunks = list(
            client.chat.completions.create(
                model="ccpo",
                messages=[{"role": "user", "content": Q}],
                stream=True,
                extra_body={"ccpo": {"id": "chat-1"}},
            )
        )
        assert all(c.object == "chat.completion.chunk" for c in chunks)
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        assert text == "\n".join(s["answers"])  # the stored answer set of id chat-1
        assert [c.choices[0].finish_reason for c in chunks][-1] == "stop"
        assert chunks[-1].model_extra["ccpo"] == s
        bad = openai.OpenAI(base_url=ls.url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.chat.completions.create(model="ccpo", messages=[{"role": "user", "content": Q}])


def test_async_sdk_and_content_parts(world, policy_dir, prices_path):
    import asyncio

    async def go(url: str):
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as c:
            return await c.chat.completions.create(
                model="ccpo",
                messages=[{"role": "user", "content": [{"type": "text", "text": Q}]}],
            )

    with LiveServer(make_service(policy_dir, world, prices_path)) as ls:
        r = asyncio.run(go(ls.url))
        assert r.model_extra["ccpo"]["question"] == Q and r.choices[0].message.content


def test_metrics_in_prometheus_text_format(world, policy_dir, prices_path):
    with LiveServer(make_service(policy_dir, world, prices_path)) as ls:
        for i in range(3):
            httpx.post(ls.url + "/v1/answer", json={"question": f"{Q} {i}", "id": f"m{i}"})
        httpx.post(ls.url + "/v1/feedback", json={"id": "m0", "none_of_them": True})
        r = httpx.get(ls.url + "/metrics")
        js = httpx.get(ls.url + "/metrics.json").json()
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    samples = {
        s.name: s.value for fam in text_string_to_metric_families(r.text) for s in fam.samples
    }
    assert samples["ccpo_requests_total"] == 3 == js["requests"]
    assert samples["ccpo_feedback_total"] == 1 and samples["ccpo_coverage"] == 0.0
    assert samples["ccpo_spent_usd_total"] == pytest.approx(js["dollars_spent"])
    assert samples["ccpo_kappa"] == 0.3 and samples["ccpo_kappa_lower"] == pytest.approx(0.2)
    assert samples["ccpo_kappa_moves_total"] == 0 and samples["ccpo_alpha"] == 0.1
    assert "ccpo_budget_usd" not in samples  # no total budget: left out, not a fake 0
    labels = {
        s.labels.get("replica") for f in text_string_to_metric_families(r.text) for s in f.samples
    }
    assert labels == {js["replica"]} and js["replica"]  # every sample names its replica
