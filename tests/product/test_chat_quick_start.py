"""The README's quick start 3 runs as written on a fresh clone: its commands, read from the
README itself, run through the installed ``ccpo`` console script in a folder holding what a
clone has (``docs/examples``), with a user's environment (empty home, caches); the ports are
free ones instead of 9000 and 8000 (the only change). Import, train, dry-run (equal to the
replay), ``replay-server`` and ``serve`` all succeed; a conversation of the example gets one
model's logged reply whole, one that is not in the logs a 404 ``not_recorded``. The example
itself is what ``scripts/make_chat_example.py`` derives from the bundled set, and the README's
``endpoints.yaml`` is the file's."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import openai
import pytest
import yaml

from ccpo.testing import free_port, wait_for_http
from tests.helpers.cli import CCPO, ROOT, stop_server, user_env

pytestmark = pytest.mark.slow

EXAMPLES = ROOT / "docs" / "examples"
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _section() -> str:
    start = README.index("## Quick start 3")
    return README[start : README.index("\n## ", start + 1)]


def _block(lang: str) -> str:
    found = re.search(rf"```{lang}\n(.*?)```", _section(), re.S)
    assert found, f"quick start 3 shows no {lang} block"
    return found.group(1)


def _commands() -> list[list[str]]:
    """The bash block's commands, continuation lines joined, comments dropped."""
    text = _block("bash").replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in text.splitlines() if line.strip()]


def _script():
    path = ROOT / "scripts" / "make_chat_example.py"
    spec = importlib.util.spec_from_file_location("make_chat_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_is_derived_from_the_bundled_set() -> None:
    script = _script()
    table = EXAMPLES / "chat-logs.jsonl"
    lines = table.read_text(encoding="utf-8").splitlines(keepends=True)
    assert lines == [script.line(r) for r in script.example()]  # byte for byte
    rows = [json.loads(x) for x in lines]
    assert table.stat().st_size < 300_000
    assert len({r["question_id"] for r in rows}) == script.N == 42 and len(rows) == 5 * 42
    prices = json.loads((EXAMPLES / "chat-logs.prices.json").read_text(encoding="utf-8"))
    assert prices == script.prices({r["model"] for r in rows})
    readme = yaml.safe_load(_block("yaml"))
    assert (
        readme["endpoints"]
        == yaml.safe_load((EXAMPLES / "endpoints.yaml").read_text())["endpoints"]
    )


def _clone(tmp: Path, replay_port: int) -> Path:
    """What a fresh clone holds of the example, its endpoints on ``replay_port``."""
    ex = tmp / "docs" / "examples"
    ex.mkdir(parents=True)
    for name in ("chat-logs.jsonl", "chat-logs.prices.json"):
        shutil.copyfile(EXAMPLES / name, ex / name)
    text = (EXAMPLES / "endpoints.yaml").read_text(encoding="utf-8")
    (ex / "endpoints.yaml").write_text(text.replace(":9000/", f":{replay_port}/"))
    return tmp


def test_quick_start_3_runs_as_written(tmp_path) -> None:
    replay_port, serve_port = free_port(), free_port()
    cwd = _clone(tmp_path, replay_port)
    env, servers = user_env(), []
    commands = _commands()
    assert [c[:2] for c in commands] == [["ccpo", "traces"], ["ccpo", "train"], ["ccpo", "dry-run"],
                                         ["ccpo", "replay-server"], ["ccpo", "serve"]]  # fmt: skip
    try:
        for argv in commands:
            argv = [CCPO, *(a.replace("9000", str(replay_port)) for a in argv[1:])]
            if argv[-1] == "&" or argv[1] == "serve":  # a server: in the background
                argv = [a for a in argv if a != "&"]
                port = replay_port if argv[1] == "replay-server" else serve_port
                if argv[1] == "serve":
                    argv += ["--port", str(port)]
                proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True)  # fmt: skip
                servers.append(proc)
                wait_for_http(f"http://127.0.0.1:{port}/healthz", proc, 90, argv[1])
                continue
            res = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                                 timeout=300)  # fmt: skip
            assert res.returncode == 0, (argv[1], res.stderr[-2000:])
            assert "Traceback" not in res.stderr
            if argv[1] == "dry-run":
                assert "42/42 answer sets equal the policy's replay" in res.stdout, res.stdout
        _ask(cwd, serve_port)
    finally:
        for proc in reversed(servers):
            stop_server(proc)


def _ask(cwd: Path, port: int) -> None:
    rows = [json.loads(x) for x in (cwd / "docs/examples/chat-logs.jsonl").open(encoding="utf-8")]
    sdk = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
    for qid in dict.fromkeys(r["question_id"] for r in rows[::50]):  # a few conversations
        logged = {r["answer"] for r in rows if r["question_id"] == qid}
        messages = next(r["messages"] for r in rows if r["question_id"] == qid)
        done = sdk.chat.completions.create(model="ccpo", messages=messages)
        content, s = done.choices[0].message.content, done.model_extra["ccpo"]
        assert content in logged and s["guarantee"]["answer"] == "single"  # one reply, whole
    with pytest.raises(openai.NotFoundError) as e:
        sdk.chat.completions.create(model="ccpo", messages=[{"role": "user", "content": "Hi!"}])
    err = e.value.response.json()["error"]
    assert err["type"] == "not_recorded" and "not in the recorded traces" in err["message"]
