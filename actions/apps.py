from __future__ import annotations

import importlib

from django.apps import AppConfig
from django.conf import settings


class ActionsConfig(AppConfig):
    name = "actions"
    verbose_name = "Approvals"

    def ready(self) -> None:
        # The drivers of the agent and sandbox consumers register themselves with the runner.
        importlib.import_module("actions.drivers.agent")
        importlib.import_module("actions.drivers.sandbox")
        # Importing a module registers the actions it defines with @action.
        for module in settings.GRUNDLAG_ACTION_MODULES:
            importlib.import_module(module)
