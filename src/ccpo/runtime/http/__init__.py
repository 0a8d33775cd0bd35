"""Where ``ccpo serve`` reaches into uvicorn's and FastAPI's internals, in one place.

- :mod:`~ccpo.runtime.http.connections`: the connection guard, a subclass of uvicorn's HTTP
  protocol (deadlines for a request's head and body, a cap on open connections, a cap on a
  head's size). A rail against slow and hostile clients, always on.
- the fast paths, each behind a switch of :class:`~ccpo.runtime.config.ServerConfig`; with a
  switch off the request takes FastAPI's and uvicorn's plain route, with the same status,
  body and headers:

  - ``fast_answer`` and ``fast_health`` (:mod:`~ccpo.runtime.http.ahead`): ``POST /v1/answer``
    and ``GET /healthz`` answered by pure-ASGI layers ahead of FastAPI's routing;
  - ``joined_writes`` (:mod:`~ccpo.runtime.http.joined_writes`): a response's head and body
    in one write to the socket.

What each fast path buys, measured: ``benchmarks/results/fast_paths.md``.
"""
