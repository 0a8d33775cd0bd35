"""The ``ccpo`` command as a subprocess: one-shot commands and their usage errors, ``ccpo
serve`` and the other server commands on a free port, and the environment of an install
without an extra; and in this process (:func:`ccpo_in`, :func:`ccpo_ok`) where the test is
about what a command does, not about the process it runs in."""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

from ccpo.testing import free_port, wait_for_http

from .serve import deploy_values

ROOT = Path(__file__).resolve().parents[2]
# the console script installed beside this interpreter (the venv's), else the one on PATH
_BESIDE = Path(sys.executable).parent / "ccpo"
CCPO = str(_BESIDE) if _BESIDE.is_file() else (shutil.which("ccpo") or "ccpo")
#: this tree's code first (whatever the venv's editable install points at), then tests.helpers
PYTHONPATH = os.pathsep.join([str(ROOT / "src"), str(ROOT)])


def fresh_home() -> Path:
    """A home folder that starts empty, one per test process (removed at its exit): the
    processes the tests spawn keep their caches (matplotlib's font cache, ...) there, as on a
    machine that never ran ccpo, never in the developer's ``~/.cache``."""
    if not _HOME:
        home = Path(tempfile.mkdtemp(prefix="ccpo-tests-home-"))
        atexit.register(shutil.rmtree, home, ignore_errors=True)
        _HOME.append(home)
    return _HOME[0]


_HOME: list[Path] = []


def home_env(home: Path) -> dict[str, str]:
    """The variables that place a process's caches and settings under ``home``."""
    return {"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "MPLCONFIGDIR": str(home / ".config" / "matplotlib")}  # fmt: skip


def user_env(home: Path | None = None) -> dict[str, str]:
    """A user's shell on a fresh machine: only this venv on PATH, a wide terminal (nothing
    wraps), this tree's code, and caches under ``home`` (default :func:`fresh_home`)."""
    return {"PATH": str(Path(sys.executable).parent), "COLUMNS": "200",
            "PYTHONPATH": PYTHONPATH, **home_env(home or fresh_home())}  # fmt: skip


def cache_env() -> dict[str, str]:
    """:func:`home_env` of :func:`fresh_home` but ``HOME``: the caches of a fresh machine for a
    process that keeps the user's home (the PostgreSQL tools may need it)."""
    return {k: v for k, v in home_env(fresh_home()).items() if k != "HOME"}


ENV = {**os.environ, **cache_env(), "COLUMNS": "200", "PYTHONPATH": PYTHONPATH}


# ----------------------------------------------------------------------------- commands
def ccpo(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the installed ``ccpo`` console script; wide terminal so nothing wraps."""
    return subprocess.run(
        [CCPO, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=user_env(),
    )


def run_ccpo(*args: str) -> subprocess.CompletedProcess:
    """Run the installed ``ccpo`` console script in this process's environment."""
    return subprocess.run([CCPO, *args], capture_output=True, text=True, timeout=60)


def ccpo_in(*args: str) -> subprocess.CompletedProcess[str]:
    """``ccpo`` with ``args`` run in this process through the console script's function
    (:func:`ccpo.cli.main`): its exit code and what it printed, as a subprocess would give
    them, on a wide terminal (nothing wraps), Python's warnings printed on stderr as a fresh
    process prints them. It saves the start of a Python process (about a second of CPU a
    command); the tests of the entry point itself, and of a fresh process (exit codes, usage
    errors, imports, signals), run the console script."""
    from ccpo.cli import main

    out, err = io.StringIO(), io.StringIO()
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "200"
    try:
        with (
            _wide_consoles(200),
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
            warnings.catch_warnings(),
        ):
            warnings.resetwarnings()  # Python's defaults, not pytest's capture
            warnings.simplefilter("default")
            warnings.showwarning = _print_warning
            try:
                code = main([str(a) for a in args])
            except SystemExit as e:  # a command that exits by itself
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        if before is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = before
    return subprocess.CompletedProcess(["ccpo", *args], code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def _wide_consoles(width: int):
    """The rich consoles the ``ccpo.cli`` modules made at import, ``width`` columns wide for a
    while: a console made where ``COLUMNS`` was set (pytest-xdist sets it to the terminal's
    width in its workers) keeps that width; one made later reads ``COLUMNS`` as it prints."""
    from rich.console import Console

    made = [
        c
        for name, mod in list(sys.modules.items())
        if name.startswith("ccpo.cli") and mod is not None
        for c in vars(mod).values()
        if isinstance(c, Console)
    ]
    widths = [c._width for c in made]
    for c in made:
        c._width = width
    try:
        yield
    finally:
        for c, w in zip(made, widths, strict=True):
            c._width = w


def _print_warning(message, category, filename, lineno, file=None, line=None) -> None:
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def ccpo_ok(*args: str) -> subprocess.CompletedProcess[str]:
    """``ccpo`` with ``args`` in this process (:func:`ccpo_in`), which must succeed."""
    res = ccpo_in(*args)
    assert res.returncode == 0, res.stderr[-2000:]
    return res


def assert_usage_error(r: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit 2, one line on stderr, no traceback, every needle in it."""
    err = r.stderr.strip()
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and len(err.splitlines()) == 1, r.stderr
    assert err.startswith("error: ")
    for n in needles:
        assert n in err, (n, err)
    assert err.lower().count("did you mean") <= 1, err
    return err


# ----------------------------------------------------------------------------- servers
def write_deploy_config(tmp_path: Path, world, prices: Path, **kw) -> Path:
    """``deploy.yaml`` in ``tmp_path``: :func:`~tests.helpers.serve.deploy_values` for
    ``world``, updated by ``kw``."""
    import yaml

    p = tmp_path / "deploy.yaml"
    p.write_text(yaml.safe_dump(deploy_values(world, prices, **kw)))
    return p


def start_serve(policy, cfg, port: int, *flags: str, env=ENV):
    """``ccpo serve`` through the real entry point on 127.0.0.1:``port``; returns the process
    and its URL once /healthz answers (the process is killed if it never does)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ccpo", "serve", "--policy", str(policy),
         "--config", str(cfg), "--port", str(port), *flags, "--log-level", "warning"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(url + "/healthz", proc, 90, "ccpo serve")
    except BaseException:
        proc.kill()
        proc.communicate(timeout=20)
        raise
    return proc, url


def start_server(what: str, *args: str) -> tuple[subprocess.Popen, str]:
    """A ccpo server command on a free port of 127.0.0.1, once its /healthz answers."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ccpo", what, *args, "--port", str(port),
         "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(url + "/healthz", proc, 90, f"ccpo {what}")
    except BaseException:
        proc.kill()
        proc.communicate(timeout=20)
        raise
    return proc, url


def stop_server(proc: subprocess.Popen) -> str:
    """Stop a server process; its stderr (the log)."""
    proc.terminate()
    try:
        return proc.communicate(timeout=30)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate(timeout=20)[1]


# ----------------------------------------------------------------------------- extras
def without(tmp_path: Path, *modules: str, env: dict | None = None) -> dict:
    """The environment of a subprocess in which ``modules`` (and their submodules) cannot be
    imported, as in an install without the extras that bring them: a ``sitecustomize`` on
    PYTHONPATH puts a finder first on ``sys.meta_path`` that refuses them as not installed."""
    site = tmp_path / "no-extras"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        f"BLOCKED = {tuple(modules)!r}\n"
        "class NotInstalled:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if any(name == m or name.startswith(m + '.') for m in BLOCKED):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, NotInstalled())\n"
    )
    base = dict(os.environ if env is None else env)
    return {**base, "COLUMNS": "200", "PYTHONPATH": os.pathsep.join([str(site), PYTHONPATH])}
