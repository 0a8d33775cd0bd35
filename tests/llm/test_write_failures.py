"""A full disk or an output that cannot be created: one line through the real ``ccpo`` entry
point, never a traceback, and nothing half-made left behind.

"Disk full" is a file-size limit (``RLIMIT_FSIZE``) on the subprocess: past it every write
fails with ``EFBIG``, as it would with ``ENOSPC``, without filling the machine's disk. (The
tests run as root, so a read-only folder is an output whose parent is a file.)"""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ccpo.traces.io import read_traces
from tests.helpers.cli import ENV as CHILD_ENV
from tests.helpers.world import make_world

ROOT = Path(__file__).resolve().parents[2]
ENV = {**CHILD_ENV, "COLUMNS": "300"}


def ccpo(*args: str, max_file_bytes: int | None = None) -> subprocess.CompletedProcess:
    def limit() -> None:
        if max_file_bytes is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, max_file_bytes))

    return subprocess.run(
        [sys.executable, "-m", "ccpo", *args],
        env=ENV, capture_output=True, text=True, timeout=120, preexec_fn=limit,
    )  # fmt: skip


def one_line(r: subprocess.CompletedProcess, needle: str, code: int) -> None:
    """Exit ``code`` (1: the disk is full, rerun to finish; 2: an output that cannot be
    written), one line on stderr holding ``needle``, no traceback (the README's table)."""
    assert r.returncode == code, (r.returncode, r.stderr)
    assert needle in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_sim_on_a_full_disk_leaves_no_half_made_file(tmp_path):
    out = tmp_path / "sim.jsonl"
    r = ccpo("sim", "--out", str(out), "--n", "1400", max_file_bytes=50_000)
    one_line(r, f"{out}: cannot write (File too large)", 1)
    assert list(tmp_path.iterdir()) == []  # neither the file nor its temporary
    # an older file is kept whole when its replacement cannot be written
    assert ccpo("sim", "--out", str(out), "--n", "20").returncode == 0
    before = out.read_bytes()
    one_line(
        ccpo("sim", "--out", str(out), "--n", "1400", max_file_bytes=50_000), "cannot write", 1
    )
    assert out.read_bytes() == before and len(list(tmp_path.iterdir())) == 1


def test_sim_into_a_folder_that_cannot_exist(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    one_line(ccpo("sim", "--out", str(blocker / "sim.jsonl"), "--n", "5"), "cannot write", 2)


def _collect_config(srv, tmp_path: Path, prices: Path, **kw) -> Path:
    values = {
        "task": "mmlu",
        "rounds": 2,
        "n": 30,
        "base_model": "base-m",
        "base_url": srv.url,
        "guide_model": "guide-m",
        "guide_url": srv.url,
        "prices": [str(prices)],
        "cache": str(tmp_path / "cache.sqlite"),
        "concurrency": 4,
        **kw,
    }
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(values))
    return p


@pytest.mark.parametrize("workers", [1, 2])
def test_collect_on_a_full_disk_keeps_whole_lines(world, tmp_path, prices_file, workers):
    """Exit 1 (partial: rerun to finish), as the README lists a full disk, with one line and a
    clean, resumable file; the same with the run spread over worker processes."""
    conf = _collect_config(world, tmp_path, prices_file, cache=None, no_cache=True)
    out = tmp_path / "out.jsonl"
    r = ccpo("collect", "--config", str(conf), "--out", str(out), "--quiet",
             "--workers", str(workers), max_file_bytes=20_000)  # fmt: skip
    one_line(r, f"{out}: cannot write (File too large)", 1)
    kept = read_traces(out)  # every line whole and valid
    assert 0 < len(kept) < 30 and out.read_bytes().endswith(b"\n")
    # and the run resumes where it stopped once there is room
    assert ccpo("collect", "--config", str(conf), "--out", str(out), "--quiet").returncode == 0
    assert len(read_traces(out)) == 30


def test_collect_start_up_failures_leave_no_empty_output(tmp_path, prices_file):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with make_world() as srv:
        # the cache cannot be opened: found after the output was opened and locked
        conf = _collect_config(srv, tmp_path, prices_file, cache=str(blocker / "c.sqlite"))
        out = tmp_path / "out.jsonl"
        one_line(ccpo("collect", "--config", str(conf), "--out", str(out), "--quiet"), "cache", 2)
        assert not out.exists()
        # the output's folder cannot be created
        bad = blocker / "out.jsonl"
        one_line(ccpo("collect", "--config", str(conf), "--out", str(bad), "--quiet"), "cannot", 2)
        assert srv.n_requests == 0


def test_a_full_response_cache_is_exit_1_and_resumable(world, tmp_path, prices_file):
    """The response cache (SQLite) on a full disk (SQLITE_FULL, or SQLITE_IOERR as here): exit 1
    in one line naming the cache, and the output keeps whole lines (rerun to finish)."""
    conf = _collect_config(world, tmp_path, prices_file, n=60)
    out = tmp_path / "out.jsonl"
    cache = tmp_path / "cache.sqlite"
    # the cache grows faster than the output: it holds every call's request and response
    r = ccpo("collect", "--config", str(conf), "--out", str(out), "--quiet",
             max_file_bytes=60_000)  # fmt: skip
    one_line(r, f"{cache}: cannot write the response cache", 1)  # SQLITE_IOERR for EFBIG
    assert not out.exists() or out.read_bytes().endswith(b"\n")
    assert ccpo("collect", "--config", str(conf), "--out", str(out), "--quiet").returncode == 0
    assert len(read_traces(out)) == 60
