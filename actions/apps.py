from __future__ import annotations

import importlib

from django.apps import AppConfig
from django.conf import settings


class ActionsConfig(AppConfig):
    name = "actions"
    verbose_name = "Approvals"

    def ready(self) -> None:
        from django.contrib.auth import get_user_model
        from django.contrib.auth.signals import user_logged_out
        from django.core import checks
        from django.db.models import signals

        from actions import metrics, notify, tracing
        from actions.drivers.agent import AgentDriver
        from actions.drivers.approval import ApprovalDriver
        from actions.drivers.gateway import GatewayDriver
        from actions.drivers.sandbox import SandboxDriver
        from actions.engine import audit, driving, journal, members
        from actions.live import push as live
        from actions.live import waiting
        from actions.models import Membership, Run, Team
        from actions.web.middleware import axes_middleware_last

        # Runs of these consumers are stepped by their driver; every other runs a plain action.
        driving.register(Run.Consumer.AGENT, AgentDriver())
        driving.register(Run.Consumer.SANDBOX, SandboxDriver())
        driving.register(Run.Consumer.APPROVAL, ApprovalDriver())
        driving.register(Run.Consumer.GATEWAY, GatewayDriver())
        # The engine announces what changed, once it is committed; open pages hear of it.
        journal.team_changed.connect(live.on_team_changed, dispatch_uid="live-team")
        journal.run_changed.connect(live.on_run_changed, dispatch_uid="live-run")
        journal.discussed.connect(live.on_discussed, dispatch_uid="live-discussed")
        # A socket re-checks its user's access as soon as it changes, not at its next check.
        signals.m2m_changed.connect(
            live.on_membership_changed, sender=Team.members.through, dispatch_uid="live-members"
        )
        # A role changed, a membership made or ended one at a time (the Team page, the admin).
        signals.post_save.connect(live.on_role_changed, sender=Membership, dispatch_uid="live-role")
        signals.post_delete.connect(live.on_role_changed, sender=Membership, dispatch_uid="live-role-end")
        signals.post_save.connect(live.on_user_saved, sender=get_user_model(), dispatch_uid="live-user")
        # ...and what they left behind ends (their absences, the grants they gave).
        signals.post_save.connect(members.on_user_saved, sender=get_user_model(), dispatch_uid="user-left")
        user_logged_out.connect(live.on_logged_out, dispatch_uid="live-logout")
        # An API request waiting for a run (Prefer: wait) reads it again as soon as it changed.
        journal.run_changed.connect(waiting.on_run_changed, dispatch_uid="api-wait")
        # Notifications (mail, Slack, webhooks) go out soon after a change worth telling.
        journal.team_changed.connect(notify.dispatch_soon, dispatch_uid="notify-team")
        journal.run_changed.connect(notify.on_run_changed, dispatch_uid="notify-run")
        journal.discussed.connect(notify.on_discussed, dispatch_uid="notify-discussed")
        journal.reminded.connect(notify.dispatch_soon, dispatch_uid="notify-reminded")
        audit.head_published.connect(notify.on_audit_head, dispatch_uid="notify-audit-head")
        checks.register(axes_middleware_last, checks.Tags.security)
        # Production's figures (actions.metrics): the engine's signals, the database's counts.
        metrics.register()
        # Traces, in every process, when OTEL_EXPORTER_OTLP_ENDPOINT says where to (before the
        # first request: Django's instrumentation adds its middleware).
        if settings.GRUNDLAG_TRACES:
            tracing.setup()
        # The Celery tasks, which actions.background sends by name, are registered as they load.
        from actions import tasks  # noqa: F401

        # Importing a module registers the actions it defines with @action.
        for module in settings.GRUNDLAG_ACTION_MODULES:
            importlib.import_module(module)
