"""docs/deploy.md as written, against the real ``ccpo serve`` (a subprocess on 127.0.0.1): the
feedback limits it documents, and its local PostgreSQL quick start."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest

from ccpo.testing import free_port
from tests.helpers.cli import ENV, start_serve, stop_server, write_deploy_config
from tests.helpers.serve import Q


@pytest.mark.parametrize(
    ("flags", "accepted"),
    [((), 10), (("--feedback-per-minute", "6000", "--feedback-burst", "1000"), 14)],
    ids=["default", "batch-setting"],
)
def test_feedback_limits_as_documented(flags, accepted, world, policy_dir, prices_path, tmp_path):
    """docs/deploy.md: one address may send 10 feedbacks at once by default (the 11th is a
    429 with Retry-After); the documented batch setting takes them all."""
    cfg = write_deploy_config(tmp_path, world, prices_path)
    proc, url = start_serve(policy_dir, cfg, free_port(), *flags)
    try:
        for i in range(14):
            r = httpx.post(url + "/v1/answer", json={"question": Q, "id": f"q-{i}"}, timeout=60)
            assert r.status_code == 200, r.text
        codes = [
            httpx.post(
                url + "/v1/feedback", json={"id": f"q-{i}", "none_of_them": True}
            ).status_code
            for i in range(14)
        ]
        retry = httpx.post(url + "/v1/feedback", json={"id": "q-0", "none_of_them": True})
    finally:
        stop_server(proc)
    assert codes == [200] * accepted + [429] * (14 - accepted), codes
    if accepted < 14:
        assert retry.status_code == 429 and int(retry.headers["Retry-After"]) >= 1


def test_the_postgresql_quick_start_of_deploy_md_works(world, policy_dir, prices_path, tmp_path):
    """docs/deploy.md's local PostgreSQL quick start, run as written (as an ordinary user: the
    ``postgres`` user when the tests run as root; on a free port instead of 5432, in a
    throw-away home), then ``ccpo serve`` on the state URL it gives answers and stores."""
    import os
    import shutil
    import tempfile

    from ccpo.testing.postgres import find_pg_bin, runuser

    pg_bin = find_pg_bin()
    if pg_bin is None or shutil.which("psql") is None:
        pytest.skip("no PostgreSQL on this machine")
    doc = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text()
    block = doc.split("**A local PostgreSQL in five minutes**")[1].split("```bash\n")[1]
    port = str(free_port())
    script = block.split("```")[0].replace("5432", port)
    home = Path(tempfile.mkdtemp(prefix="ccpo-quick-start-"))  # outside pytest's 0700 tree
    as_user: list[str] = []
    if os.geteuid() == 0:  # initdb refuses root, as the doc says
        as_user = [runuser(), "-u", "postgres", "--"]
        shutil.chown(home, "postgres")
    env = {"PATH": f"{pg_bin}:/usr/bin:/bin", "HOME": str(home)}
    setup = subprocess.run([*as_user, "env", *(f"{k}={v}" for k, v in env.items()),
                            "bash", "-e", "-c", script],
                           capture_output=True, text=True, timeout=180)  # fmt: skip
    try:
        assert setup.returncode == 0, setup.stdout + setup.stderr
        state = f"postgresql://ccpo@127.0.0.1:{port}/ccpo"
        pgpass = tmp_path / "pgpass"  # the line the doc appended, readable by this user
        shutil.copy(home / ".pgpass", pgpass)
        pgpass.chmod(0o600)
        proc, url = start_serve(
            policy_dir, write_deploy_config(tmp_path, world, prices_path), free_port(),
            "--state", state, env={**ENV, "PGPASSFILE": str(pgpass)},
        )  # fmt: skip
        try:
            r = httpx.post(url + "/v1/answer", json={"question": Q, "id": "qs-1"}, timeout=60)
            assert r.status_code == 200, r.text
        finally:
            log = stop_server(proc)
        assert "Traceback" not in log, log
        import psycopg

        with psycopg.connect(state, passfile=str(pgpass)) as conn:
            assert conn.execute("SELECT count(*) FROM ccpo_answers").fetchone() == (1,)
    finally:
        subprocess.run([*as_user, str(pg_bin / "pg_ctl"), "-D", str(home / "ccpo-pg"),
                        "-m", "immediate", "stop"], capture_output=True, timeout=60)  # fmt: skip
        shutil.rmtree(home, ignore_errors=True)
