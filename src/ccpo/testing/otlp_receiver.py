"""A small OTLP/HTTP trace receiver on 127.0.0.1, for tests and for looking at ``ccpo serve``'s
spans without a tracing backend (needs ``opentelemetry-proto``: the ``dev`` extra).

It accepts ``POST /v1/traces`` with a protobuf ``ExportTraceServiceRequest`` (gzip or not),
decodes it with opentelemetry-proto's own classes and keeps every span as a :class:`Span`;
:func:`span_tree` draws them as a tree. ``python -m ccpo.testing.otlp_receiver [PORT]`` runs
one and prints each trace as it arrives (point ``OTEL_EXPORTER_OTLP_ENDPOINT`` at it).
"""

from __future__ import annotations

import gzip
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
STATUS = {0: "UNSET", 1: "OK", 2: "ERROR"}


def _value(v: Any) -> Any:
    """An OTLP ``AnyValue`` as a Python value."""
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return None if which is None else getattr(v, which)


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


@dataclass
class Span:
    """One received span, decoded."""

    trace_id: str
    span_id: str
    parent_id: str  # "" for a root span
    name: str
    kind: str
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    status: str
    resource: dict[str, Any]
    start_ns: int
    end_ns: int

    @property
    def ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


@dataclass
class OTLPReceiver:
    """``with OTLPReceiver() as rx:`` an OTLP/HTTP receiver at ``rx.endpoint``; ``rx.spans``
    holds what arrived, ``rx.bodies`` the raw request bodies (decompressed)."""

    port: int = 0
    spans: list[Span] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self.on_spans: Any = None  # called with each request's spans (the CLI prints them)

    @property
    def endpoint(self) -> str:
        """What to put in ``OTEL_EXPORTER_OTLP_ENDPOINT`` (the exporter adds ``/v1/traces``)."""
        assert self._httpd is not None, "receiver not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def _receive(self, body: bytes) -> None:
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        got = []
        for rs in req.resource_spans:
            resource = _attrs(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(
                        Span(
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex(),
                            name=s.name,
                            kind=KINDS.get(s.kind, str(s.kind)),
                            attributes=_attrs(s.attributes),
                            events=[(e.name, _attrs(e.attributes)) for e in s.events],
                            status=STATUS.get(s.status.code, str(s.status.code)),
                            resource=resource,
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                        )
                    )
        with self._lock:
            self.bodies.append(body)
            self.spans.extend(got)
        if self.on_spans is not None:
            self.on_spans(got)

    def __enter__(self) -> OTLPReceiver:
        rx = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path.rstrip("/") != "/v1/traces":
                    self.send_error(404)
                    return
                try:
                    rx._receive(body)
                except Exception:  # a body that is no ExportTraceServiceRequest
                    self.send_error(400)
                    return
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        # shutdown() waits for the loop's next poll: every 50 ms, not the default 0.5 s
        threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    def wait_for(self, name: str, timeout: float = 30.0) -> list[Span]:
        """Wait until a span named ``name`` arrived; every span received so far."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            with self._lock:
                if any(s.name == name for s in self.spans):
                    return list(self.spans)
            time.sleep(0.05)
        raise TimeoutError(f"no span '{name}' within {timeout:g} s ({len(self.spans)} received)")


def _short(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def span_tree(spans: list[Span], events: bool = True) -> str:
    """The spans as a tree, children in start order: name, kind, duration, attributes, and each
    span's events below it."""
    by_parent: dict[str, list[Span]] = {}
    ids = {s.span_id for s in spans}
    for s in sorted(spans, key=lambda s: s.start_ns):
        by_parent.setdefault(s.parent_id if s.parent_id in ids else "", []).append(s)
    lines: list[str] = []

    def walk(s: Span, lead: str, last: bool, root: bool) -> None:
        branch = "" if root else ("└── " if last else "├── ")
        attrs = " ".join(f"{k}={_short(v)}" for k, v in sorted(s.attributes.items()))
        status = "" if s.status == "UNSET" else f" {s.status}"
        lines.append(f"{lead}{branch}{s.name} [{s.kind}{status}] {s.ms:.1f} ms  {attrs}")
        inner = lead + ("" if root else ("    " if last else "│   "))
        kids = by_parent.get(s.span_id, [])
        if events:
            for name, a in s.events:
                bar = "│ " if kids else "  "
                body = " ".join(f"{k}={_short(v)}" for k, v in a.items())
                lines.append(f"{inner}{bar} · {name} {body}")
        for i, k in enumerate(kids):
            walk(k, inner, i == len(kids) - 1, False)

    for r in by_parent.get("", []):
        walk(r, "", True, True)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run a receiver and print each trace as a tree once its root span arrived (a root ends,
    and so is exported, last); Ctrl-C stops it."""
    args = sys.argv[1:] if argv is None else argv
    pending: dict[str, list[Span]] = {}

    def show(got: list[Span]) -> None:
        for s in got:
            pending.setdefault(s.trace_id, []).append(s)
        for trace_id in {s.trace_id for s in got if not s.parent_id}:
            print(span_tree(pending.pop(trace_id)), flush=True)

    with OTLPReceiver(port=int(args[0]) if args else 4318) as rx:
        rx.on_spans = show
        print(f"OTLP/HTTP receiver: OTEL_EXPORTER_OTLP_ENDPOINT={rx.endpoint}", flush=True)
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
