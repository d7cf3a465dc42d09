from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from actions.models import ApiToken, Interrupt, Run, RunEvent, Team


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin[Team]):
    list_display = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    filter_horizontal = ["members"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin[ApiToken]):
    list_display = ["name", "team", "prefix", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["team"]
    readonly_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        # A key is shown once, when it is made: use `manage.py create_api_token`.
        return False

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request: HttpRequest, queryset: Any) -> None:
        for token in queryset:
            token.revoke()


class ReadOnlyAdmin(admin.ModelAdmin[Any]):
    """History is changed only by the engine; the admin shows it."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ["id", "action", "team", "consumer", "status", "started_by_name", "created_at"]
    list_filter = ["status", "consumer", "team"]
    search_fields = ["action", "started_by_name"]
    exclude = ["driver_state"]


@admin.register(Interrupt)
class InterruptAdmin(ReadOnlyAdmin):
    list_display = ["id", "run", "seq", "action", "status", "decided_by_name", "created_at"]
    list_filter = ["status", "team", "action"]
    search_fields = ["message"]
    # The checkpoint is the action's private state: not on any admin page.
    exclude = ["state"]


@admin.register(RunEvent)
class RunEventAdmin(ReadOnlyAdmin):
    list_display = ["at", "run", "kind", "actor_name"]
    list_filter = ["kind"]
