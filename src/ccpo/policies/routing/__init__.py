"""Routing before the first call: a router picks the round a question starts at, from its
text alone, and a routed policy wraps the policy it starts (docs/theory.md, "Routing before
the first call").

- :mod:`~ccpo.policies.routing.router`: the router (:class:`Router`, :func:`fit_router`);
- :mod:`~ccpo.policies.routing.holder`: what both routed policies share
  (:class:`RouterHolder`: τ̂, the start round, the router's files);
- :mod:`~ccpo.policies.routing.single`: a single answer behind a router
  (:class:`RoutedPolicy`, :func:`route`);
- :mod:`~ccpo.policies.routing.pareto`: τ and λ certified together by Pareto testing (the
  order of the pairs made on the training split, one fixed sequence at δ);
- :mod:`~ccpo.policies.routing.sets`: a CStop answer set behind a router
  (:class:`RoutedSetPolicy`, :func:`route_set_policy`).
"""
