"""The request path of ``ccpo serve`` runs on the event loop: no route or dependency that
FastAPI would run in its thread pool (a thread hop per request)."""

from __future__ import annotations

import inspect

from fastapi.routing import APIRoute

from ccpo.runtime.server import create_app


def _calls(dependant):
    for d in dependant.dependencies:
        yield d.call
        yield from _calls(d)


def test_no_route_or_dependency_hops_to_a_thread():
    routes = [r for r in create_app(None).routes if isinstance(r, APIRoute)]
    guarded = [r for r in routes if r.path in ("/v1/answer", "/v1/feedback", "/metrics")]
    assert len(guarded) == 3 and all(list(_calls(r.dependant)) for r in guarded)
    for route in routes:
        assert inspect.iscoroutinefunction(route.endpoint), route.path
        for call in _calls(route.dependant):
            fn = call if inspect.isfunction(call) else type(call).__call__
            assert inspect.iscoroutinefunction(fn), (route.path, call)
