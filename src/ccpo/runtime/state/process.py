"""Who holds a lease of the state store, and whether that process still runs.

- :func:`owner_token`: a random token made when a store opens; a lease belongs to it, not to
  a (host, pid) pair, which processes of separate PID namespaces (containers sharing a host
  name) may share;
- :func:`process_identity`: where the process can be checked for life: the kernel's boot id,
  its PID namespace, its pid there and the pid's start time (Linux with its own ``/proc``;
  empty elsewhere: its lease then ends only when it expires);
- :func:`gone`: the process of an identity in this process's own PID namespace has exited
  (its pid is free, or now another process's). Any other identity is never judged gone.

Why leases are owned this way: docs/decisions.md ("Lease owners"); docs/glossary.md, "lease".
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def owner_token() -> str:
    """A fresh random token for the leases of one process."""
    return uuid.uuid4().hex


def _start_time(pid: int) -> str | None:
    """The start time of ``pid`` (clock ticks since boot, ``/proc/PID/stat`` field 22)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = stat.rsplit(b")", 1)[-1].split()  # after the command name: fields 3, 4, ...
    return fields[19].decode() if len(fields) > 19 else None


def _namespace() -> str | None:
    """This process's PID namespace (kernel boot id / namespace), if ``/proc`` shows it."""
    try:
        if os.readlink("/proc/self") != str(os.getpid()):  # a /proc of another namespace
            return None
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def process_identity() -> str:
    """``boot/namespace/pid/start`` of this process; empty when it cannot be checked."""
    ns, pid = _namespace(), os.getpid()
    start = _start_time(pid) if ns else None
    return f"{ns}/{pid}/{start}" if ns and start else ""


def gone(identity: str, mine: str) -> bool:
    """The process ``identity`` names ran in the PID namespace of ``mine`` (this process's
    identity) and has exited. False when it cannot be told (another namespace or host, an
    identity left empty)."""
    if not identity or not mine or identity.count("/") != 3:
        return False
    ns, pid, start = identity.rsplit("/", 2)
    if ns != mine.rsplit("/", 2)[0]:
        return False
    return not pid.isdigit() or _start_time(int(pid)) != start
