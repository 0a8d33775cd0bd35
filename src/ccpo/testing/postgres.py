"""A throw-away PostgreSQL cluster for tests and benchmarks: ``initdb`` into a temporary
folder, ``pg_ctl start`` on a free port of 127.0.0.1, stopped and deleted on exit.

PostgreSQL refuses to run as root; as root the cluster runs as the ``postgres`` user (the
Debian package creates it) through ``runuser``. Where no PostgreSQL is installed,
:func:`find_pg_bin` returns None (tests skip, or fail under ``CI=true``)."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from pathlib import Path

from ccpo.testing import free_port


def find_pg_bin() -> Path | None:
    """The folder holding ``pg_ctl`` and ``initdb``: on ``$PATH``, or Debian's
    ``/usr/lib/postgresql/<version>/bin`` (newest first); None if there is none."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(os.path.realpath(found)).parent
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if (Path(d) / "pg_ctl").exists() and (Path(d) / "initdb").exists():
            return Path(d)
    return None


#: free space a RAM folder needs before a cluster goes there (a container's /dev/shm is often
#: 64 MB; every database is a copy of its template, several MB)
RAM_FREE_BYTES = 4 << 30


def ram_folder() -> str | None:
    """``/dev/shm`` where it is a writable folder in RAM with :data:`RAM_FREE_BYTES` free
    (Linux), else None."""
    shm = "/dev/shm"
    try:
        ok = os.path.isdir(shm) and os.access(shm, os.W_OK)
        return shm if ok and shutil.disk_usage(shm).free >= RAM_FREE_BYTES else None
    except OSError:
        return None


class PostgresCluster:
    """``with PostgresCluster() as pg: pg.new_database()`` → a ``postgresql://`` URL of an
    empty database. ``fsync=False`` (tests): faster, loses data only if the machine crashes.
    ``in_ram=True`` (tests): the data folder in :func:`ram_folder` where there is one, so that
    creating a database and deleting the cluster touch no disk (on disk otherwise)."""

    def __init__(self, fsync: bool = True, user: str = "ccpo", in_ram: bool = False) -> None:
        bin_ = find_pg_bin()
        if bin_ is None:
            raise RuntimeError("no PostgreSQL found (pg_ctl, initdb): apt-get install postgresql")
        self.bin = bin_
        self.user = user
        self.fsync = fsync
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="ccpo-pg-", dir=ram_folder() if in_ram else None))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self._as: list[str] = []
        if os.geteuid() == 0:  # PostgreSQL will not run as root
            self._as = [runuser(), "-u", "postgres", "--"]
            shutil.chown(self.root, "postgres")
            self.root.chmod(0o700)

    def _run(self, *args: str) -> None:
        subprocess.run(
            [*self._as, *args], check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )

    def start(self) -> PostgresCluster:
        self._run(
            str(self.bin / "initdb"), "-D", str(self.data), "-U", self.user, "-A", "trust",
            "--no-sync", "-E", "UTF8",
        )  # fmt: skip
        opts = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} "
            f"-c max_connections=200 -c fsync={'on' if self.fsync else 'off'}"
        )
        if not self.fsync:
            opts += " -c synchronous_commit=off -c full_page_writes=off"
        self._opts = opts
        self.start_server()
        return self

    # ------------------------------------------------------------------ faults (tests)
    def start_server(self) -> None:
        """``pg_ctl start`` (again, after :meth:`stop_server`): same port, same data."""
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o",
            self._opts, "-w", "-t", "60", "start",
        )  # fmt: skip

    def stop_server(self) -> None:
        """``pg_ctl stop -m fast``: connections are closed, new ones refused; the data stays."""
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def _pids(self) -> list[int]:
        """The postmaster and every process it started (the backends of open connections)."""
        pid = int((self.data / "postmaster.pid").read_text().split()[0])
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
        return [pid, *(int(x) for x in out.split())]

    def pause(self) -> None:
        """SIGSTOP the whole server (postmaster and backends): connections stay open and
        nothing answers, as when a database host hangs. :meth:`resume` undoes it."""
        for pid in self._pids():
            os.kill(pid, signal.SIGSTOP)

    def resume(self) -> None:
        for pid in self._pids():
            os.kill(pid, signal.SIGCONT)

    @property
    def url(self) -> str:
        """The cluster's ``postgres`` database."""
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/postgres"

    def new_database(self) -> str:
        """A fresh empty database; its URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        if self.data.exists():
            subprocess.run(
                [*self._as, str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
                 "-w", "stop"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
            )  # fmt: skip
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PostgresCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


def runuser() -> str:
    """``runuser`` (util-linux), also where PATH lacks the sbin folders (a minimal shell)."""
    for found in (shutil.which("runuser"), "/usr/sbin/runuser", "/sbin/runuser"):
        if found and Path(found).is_file():
            return found
    raise RuntimeError("running PostgreSQL as root needs runuser (util-linux): install it")
