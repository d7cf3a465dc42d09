"""The drivers: one module per consumer of the engine, beside the plain action's (the engine's
own, actions.engine.driving.ActionDriver).

- ``agent``: a model's loop whose tool calls are actions that may pause;
- ``sandbox`` (and ``sandbox_child``, the process it runs scripts in): scripts that compose
  actions, replayed from their call log;
- ``approval``: a question a service asks people (``POST /api/approvals``).

What a driver is, and the registry the engine finds a run's driver in, are the engine's
(actions.engine.driving); the app's ``ready()`` registers these.
"""
