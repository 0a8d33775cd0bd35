"""Helpers shared by the tests, and by the tests alone (what benchmarks and users may use too
lives in :mod:`ccpo.testing`). Fixtures stay in the ``conftest.py`` files; the functions,
classes and constants they and the test modules share live here, one module per purpose:

- ``world``: the scripted LLM world (``make_world``, its replies, ``MODELS``).
- ``serve``: ``ccpo serve``'s app in a thread (``LiveServer``, ``make_service``), the deploy
  settings and prices it runs with, the store the running test uses (``state_at``), and
  HTTP calls to it (``Q``, ``post``, ``assert_json_error``).
- ``cli``: the ``ccpo`` command as a subprocess (``ccpo``, ``run_ccpo``) or in this process
  (``ccpo_in``, ``ccpo_ok``), its servers (``start_serve``, ``start_server``,
  ``stop_server``), usage-error checks and the environment without an extra (``without``).
- ``policies``: tiny trained policies on synthetic traces.
- ``collecting``: ``ccpo collect`` configs and checks of what it wrote.
- ``importing``: small tables for ``ccpo traces import`` (illustrative, not LLM output).
- ``probs``: random action probabilities.
"""
