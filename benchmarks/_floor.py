"""The gateway benchmark's floor: the least a gateway can do. ``POST /v1/answer`` replays,
one after the other, the LLM calls ccpo made for that question (recorded by the upstream:
``python benchmarks/_floor.py PORT UPSTREAM_URL CALLS_JSON``) and returns the last reply."""

import json
import re
import sys
from pathlib import Path

import aiohttp
from aiohttp import web

port, upstream, calls = int(sys.argv[1]), sys.argv[2], json.loads(Path(sys.argv[3]).read_text())
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer sk-no-key-required"}


async def answer(request: web.Request) -> web.Response:
    q = (await request.json())["question"]
    reply = None
    for body in calls[re.search(r"Question (\d+):", q).group(1)]:
        async with request.app["http"].post(upstream + "/chat/completions", data=body,
                                            headers=HEADERS) as r:  # fmt: skip
            reply = (await r.json())["choices"][0]["message"]["content"]
    return web.json_response({"answers": [reply]})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def session(app: web.Application):
    app["http"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    yield
    await app["http"].close()


app = web.Application()
app.add_routes([web.post("/v1/answer", answer), web.get("/healthz", healthz)])
app.cleanup_ctx.append(session)
web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, backlog=1024)
