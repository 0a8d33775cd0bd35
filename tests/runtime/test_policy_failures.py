"""A policy that fails on every question (a bug in it, not an endpoint) is visible and not paid
twice: over real HTTP against the scripted world, each question is a 500 ``policy_error`` that
the openai SDK does not retry (``x-should-retry: false``: its calls are paid once), counted in
``/metrics`` (the errors and the 5xx by kind), and ``/healthz`` says ``degraded`` after three in
a row, until a question is answered again; the same for an error of ccpo's own raised by the
policy (a ``CCPOError``: not an endpoint's). An upstream that fails is counted by its own
kind."""

from __future__ import annotations

import re

import httpx
import openai
import pytest

from ccpo.errors import CCPOError
from tests.helpers.serve import LiveServer, make_service

Q = "Which is a prime number?\nA. 4\nB. 6\nC. 7\nD. 9"


def _broken(error: type[Exception]):
    def decide(*args, **kwargs):
        raise error("operands could not be broadcast together with shapes (3,52) (38,)")

    return decide


# a bug in numpy's hands, or an error of ccpo's own raised by the policy: not an endpoint's
@pytest.mark.parametrize("error", [ValueError, CCPOError])
def test_a_failing_policy_is_counted_degrades_health_and_is_not_retried(
    policy_dir, world, prices_path, error
) -> None:
    svc = make_service(policy_dir, world, prices_path)
    works = svc.agent.policy.decide
    svc.agent.policy.decide = _broken(error)  # a bug in the policy: it fails on every question
    with LiveServer(svc) as live:
        sdk = openai.OpenAI(base_url=live.url + "/v1", api_key="none")  # its default retries
        calls = []
        for i in range(3):
            before = world.n_requests
            with pytest.raises(openai.InternalServerError) as e:
                sdk.chat.completions.create(
                    model="ccpo", messages=[{"role": "user", "content": f"{Q} ({i})"}]
                )
            calls.append(world.n_requests - before)
            r = e.value.response
            assert r.json()["error"]["type"] == "policy_error"
            assert error.__name__ in r.json()["error"]["message"]
            assert "broadcast" not in r.text  # (the exception's text stays in the log)
            assert r.headers["x-should-retry"] == "false"
        # one question's calls, paid once each time: not three times over the SDK's retries
        assert calls[0] > 0 and calls == [calls[0]] * 3
        assert world.n_requests == 3 * calls[0]
        m = httpx.get(live.url + "/metrics.json").json()
        assert m["errors"] == 3 and m["errors_by_kind"] == {"policy_error": 3}
        assert m["dollars_spent"] > 0
        text = httpx.get(live.url + "/metrics").text
        assert re.search(r'^ccpo_server_errors_total\{kind="policy_error",replica="[^"]*"\} 3\.0$',
                         text, re.M), text[-1500:]  # fmt: skip
        h = httpx.get(live.url + "/healthz")
        assert h.status_code == 503 and h.json()["status"] == "degraded"
        assert f"the policy failed on the last 3 questions ({error.__name__})" in h.json()["detail"]
        # fixed: one answered question and it is ok again
        svc.agent.policy.decide = works
        assert sdk.chat.completions.create(
            model="ccpo", messages=[{"role": "user", "content": Q}]
        ).choices
        assert httpx.get(live.url + "/healthz").json()["status"] == "ok"


def test_an_upstream_failure_is_counted_by_its_kind(policy_dir, world, prices_path) -> None:
    world.failure_rate, world.failure_kinds = 1.0, ("500",)
    with LiveServer(make_service(policy_dir, world, prices_path, max_retries=0)) as live:
        r = httpx.post(live.url + "/v1/answer", json={"question": Q})
        assert r.status_code == 502 and r.json()["error"]["type"] == "upstream_error"
        m = httpx.get(live.url + "/metrics.json").json()
        assert m["errors_by_kind"] == {"upstream_error": 1} and m["errors"] == 1
        assert httpx.get(live.url + "/healthz").json()["status"] == "ok"  # not the policy
