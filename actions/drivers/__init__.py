"""The drivers: one module per consumer of the engine.

- ``action``: a run of one registered action (the API, the dashboard);
- ``agent``: a model's loop whose tool calls are actions that may pause;
- ``sandbox`` (and ``sandbox_child``, the process it runs scripts in): scripts that compose
  actions, replayed from their call log.

The engine finds a run's driver by its consumer. The agent and sandbox drivers register
themselves when imported (the app's ``ready()`` imports them); every other consumer runs the
plain action.
"""

from __future__ import annotations

from actions.drivers.action import ActionDriver
from actions.drivers.base import Driver

_DRIVERS: dict[str, Driver] = {}
_ACTION = ActionDriver()


def register(consumer: str, driver: Driver) -> None:
    _DRIVERS[consumer] = driver


def driver_for(consumer: str) -> Driver:
    return _DRIVERS.get(consumer, _ACTION)


def runs_an_action(consumer: str) -> bool:
    """Whether the run's ``action`` names a registered action (its input is validated by it),
    rather than a driver's own kind of run (an agent, a script)."""
    return consumer not in _DRIVERS
