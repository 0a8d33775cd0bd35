"""Bounded reading: a line over the cap is refused before it is held whole, and a ``.gz`` file is
decompressed only as far as the line being read, so a 1 MB gzip bomb (1 GiB of zeros) costs
no more memory than any small file. Through the real ``ccpo`` console script; peak memory is
the child's ``ru_maxrss``, measured by a wrapper process around it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from ccpo.traces.io import MAX_LINE_BYTES, write_traces
from tests.helpers.cli import user_env

CCPO = str(Path(sys.executable).with_name("ccpo"))
MB = 2**20

#: runs argv[1:] and prints the child's peak RSS in kB (Linux: ru_maxrss is in kB)
_WRAPPER = (
    "import resource, subprocess, sys\n"
    "r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
    "sys.stderr.write(r.stderr)\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    "sys.exit(r.returncode)\n"
)


def ccpo_rss(*args: str, env: dict | None = None) -> tuple[int, str, int]:
    """(exit code, stderr, peak RSS in MB) of ``ccpo args``."""
    r = subprocess.run(
        [sys.executable, "-c", _WRAPPER, CCPO, *args],
        capture_output=True, text=True, timeout=120,
        env={**user_env(), "COLUMNS": "300", **(env or {})},
    )  # fmt: skip
    return r.returncode, r.stderr, int(r.stdout.split()[-1]) // 1024


def gzip_bomb(path: Path, gib: int = 1) -> Path:
    """The issue's bomb: ~1 MB of gzip holding ``gib`` GiB of zero bytes and no newline, as 64
    gzip members per GiB (one member compressed once and written 64 times: quick to make)."""
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)  # wbits 31: a gzip member
    member = comp.compress(b"\0" * (16 * MB)) + comp.flush()
    with open(path, "wb") as fh:
        for _ in range(64 * gib):
            fh.write(member)
    return path


@pytest.mark.parametrize("command", ["validate", "train"])
def test_a_gzip_bomb_is_refused_in_bounded_memory(command, tmp_path):
    bomb = gzip_bomb(tmp_path / "bomb.jsonl.gz")
    assert bomb.stat().st_size < 2 * MB
    args = (
        ["traces", "validate", str(bomb)]
        if command == "validate"
        else ["train", "--traces", str(bomb), "--out", str(tmp_path / "pol")]
    )
    code, err, rss = ccpo_rss(*args)
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"bomb.jsonl.gz:1: line longer than the cap of {MAX_LINE_BYTES} bytes" in err, err
    assert rss <= 300, f"peak RSS {rss} MB"  # before the cap: 2.2 GB (validate), 2.4 GB (train)
    assert not (tmp_path / "pol").exists()


def test_the_cap_is_the_callers_to_raise(sim_traces, tmp_path):
    """A long but valid line: refused under a small cap (env or --max-line-bytes, error names
    file, line and cap), read under the default; a bad cap value is a usage error."""
    long = sim_traces[3].model_copy(update={"question": "q" * 200_000})
    f = tmp_path / "long.jsonl"
    write_traces(f, [*sim_traces[:3], long, *sim_traces[4:10]])
    for args, env in (
        (["--max-line-bytes", "100k", "traces", "validate", str(f)], None),
        (["traces", "stats", str(f)], {"CCPO_MAX_LINE_BYTES": "102400"}),
        (["evaluate", "--traces", str(f), "--out", str(tmp_path / "ev"), "--splits", "1"],
         {"CCPO_MAX_LINE_BYTES": "100k"}),
    ):  # fmt: skip
        code, err, _ = ccpo_rss(*args, env=env)
        assert code == 2, err
        assert f"long.jsonl:4: line longer than the cap of {100 * 1024} bytes" in err, err
        assert len(err.strip().splitlines()) == 1, err
    code, err, _ = ccpo_rss("traces", "validate", str(f))
    assert code == 0, err
    code, err, _ = ccpo_rss("--max-line-bytes", "lots", "traces", "validate", str(f))
    assert code == 2 and "--max-line-bytes 'lots': expected a positive number of bytes" in err


def test_lines_exactly_at_the_cap_and_crlf(tmp_path):
    """The cap counts a line's bytes without its end (\\n or \\r\\n): a line of exactly the cap
    is read, one byte more is refused; also at the end of a file without a final newline."""
    from ccpo.errors import TraceFormatError
    from ccpo.traces.io import iter_lines

    f = tmp_path / "t.txt"
    f.write_bytes(b"a" * 10 + b"\r\n" + b"b" * 10 + b"\n" + b"c" * 10)
    assert [len(t) for _, t in iter_lines(f, cap=10)] == [10, 10, 10]
    for data, line in ((b"a" * 11 + b"\n", 1), (b"x\n" + b"a" * 11, 2), (b"a" * 10 + b"\r\r\n", 1)):
        f.write_bytes(data)
        with pytest.raises(TraceFormatError, match=f"t.txt:{line}: line longer than the cap of 10"):
            list(iter_lines(f, cap=10))


def test_price_files_are_typed_and_bounded(tmp_path):
    """A price as a string is refused naming file:line:field; a price file over the cap too."""
    p = tmp_path / "p.json"
    p.write_text(
        '{"as_of": "2026-11-01", "source": "t",\n "models": {\n'
        '  "a": {"input_usd_per_mtok": 1, "output_usd_per_mtok": 2},\n'
        '  "b": {"input_usd_per_mtok": "2.5", "output_usd_per_mtok": 2}}}\n'
    )
    code, err, _ = ccpo_rss("prices", "show", "--prices", str(p))
    assert code == 2, err
    assert "p.json:4: field 'models.b.input_usd_per_mtok': Input should be a valid number" in err
    big = {"as_of": "x", "source": "y", "models": {f"m{i}": {"input_usd_per_mtok": 1,
           "output_usd_per_mtok": 1} for i in range(2000)}}  # fmt: skip
    p.write_text(json.dumps(big))
    code, err, _ = ccpo_rss("--max-line-bytes", "16k", "prices", "show", "--prices", str(p))
    assert code == 2 and "price file larger than the cap of 16384 bytes" in err, err
    assert os.path.getsize(p) > 16384
