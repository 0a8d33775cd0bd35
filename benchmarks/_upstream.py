"""The gateway benchmark's upstream: the scripted MMLU world of :mod:`_world` (same replies,
same completion JSON as ``ccpo.testing.scripted_server``) served by aiohttp, so that at a few
thousand calls a second the upstream is not what limits the gateways under test.

    python benchmarks/_upstream.py LATENCY_S     # prints its base URL (…/v1) on the first line

``POST /record`` (``{"on": true}``) makes it keep every chat-completion body by the question
it asks (``Question <n>:`` in the prompt), in arrival order; ``GET /recorded`` returns them.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import sys
import time
from collections import defaultdict

from _world import base, guide
from aiohttp import web

from ccpo.testing.scripted_server import default_token_logprob, prompt_text, tokenize

QUESTION = re.compile(r"Question (\d+):")
GUIDE = re.compile(
    r"^Evaluate the answer\.", re.S
)  # _world's rule, as the scripted server reads it


def completion(req: dict) -> dict:
    """The scripted world's reply, in the scripted server's completion format."""
    text = prompt_text(req)
    reply = guide(req) if GUIDE.search(text) else base(req)
    for s in req.get("stop") or []:
        if s and s in reply:
            reply = reply[: reply.index(s)]
    toks = tokenize(reply)
    if req.get("max_tokens") and len(toks) > int(req["max_tokens"]):
        toks = toks[: int(req["max_tokens"])]
        reply = "".join(toks)
    choice: dict = {"index": 0, "message": {"role": "assistant", "content": reply},
                    "finish_reason": "stop", "logprobs": None}  # fmt: skip
    if req.get("logprobs"):
        k = int(req.get("top_logprobs") or 0)
        content = []
        for t in toks:
            lp = default_token_logprob(t)
            top = [{"token": t, "logprob": lp}] + [
                {"token": f"{t.strip()}~{j}", "logprob": lp - 2.0 * j} for j in range(1, k)
            ]
            content.append({"token": t, "logprob": lp, "top_logprobs": top})
        choice["logprobs"] = {"content": content}
    n_in = len(tokenize(text))
    return {"id": "chatcmpl-x", "object": "chat.completion", "created": int(time.time()),
            "model": req.get("model", "scripted"), "choices": [choice],
            "usage": {"prompt_tokens": n_in, "completion_tokens": len(toks),
                      "total_tokens": n_in + len(toks)}}  # fmt: skip


def app(latency: float) -> web.Application:
    recording: dict = {"on": False, "calls": defaultdict(list)}

    async def chat(request: web.Request) -> web.Response:
        raw = await request.read()
        req = json.loads(raw)
        if recording["on"]:
            m = QUESTION.search(prompt_text(req))
            if m:
                recording["calls"][m.group(1)].append(raw.decode())
        await asyncio.sleep(latency)
        return web.json_response(completion(req))

    async def record(request: web.Request) -> web.Response:
        recording["on"] = bool((await request.json()).get("on"))
        return web.json_response({"on": recording["on"]})

    async def recorded(request: web.Request) -> web.Response:
        return web.json_response(recording["calls"])

    a = web.Application()
    a.add_routes([web.post("/v1/chat/completions", chat), web.post("/record", record),
                  web.get("/recorded", recorded)])  # fmt: skip
    return a


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(f"http://127.0.0.1:{sock.getsockname()[1]}/v1", flush=True)
    web.run_app(app(float(sys.argv[1])), sock=sock, print=None, access_log=None, backlog=1024)
