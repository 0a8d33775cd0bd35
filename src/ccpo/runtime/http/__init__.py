"""Where ``ccpo serve`` reaches into uvicorn's internals, in one place.

- :mod:`~ccpo.runtime.http.connections`: the connection guard, a subclass of uvicorn's HTTP
  protocol (deadlines for a request's head and body, a cap on open connections, a cap on a
  head's size). A rail against slow and hostile clients, not a speed-up: always on, and the
  reason ``uvicorn`` is bounded to the minors it was tested on.

Every request then takes FastAPI's and uvicorn's plain route. Three fast paths that used to
sit ahead of it (``POST /v1/answer`` and ``GET /healthz`` answered before FastAPI's routing,
a response's head and body joined into one write) were measured against it and removed:
each bought less than 0.5 ms at concurrency 1 and less than 10 % answers/s at concurrency 64
(``benchmarks/results/fast_paths.md``).
"""
