from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin import helpers
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db.models.constants import LOOKUP_SEP
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from pydantic import ValidationError

from actions import engine, notify
from actions.conditions import ConditionError
from actions.core import describe_errors, field_errors, registry
from actions.models import (
    PERSON_EVENTS,
    ApiToken,
    AuditAnchor,
    AuditCheck,
    AuditExport,
    AuditHead,
    Delegation,
    DeliveryAttempt,
    DirectoryResource,
    Grant,
    Interrupt,
    Membership,
    Notification,
    Policy,
    Preferences,
    Role,
    Run,
    RunEvent,
    SignInGroup,
    SignInIdentity,
    Team,
    TeamChannels,
    TeamRule,
    Webhook,
)
from actions.notify.webhook import url_problem

# Never reachable through the admin's query string, on any model, through any relation: an
# action's checkpoint, a run's driver state, a token's hash. Django's admin lets staff filter
# a changelist by any local field (``?state__comment__startswith=pin 4``), one character at a
# time; ``exclude`` hides a field from the form, not from lookups.
PRIVATE_FIELDS = frozenset({"state", "driver_state", "key_hash", "secret"})


class GuardedAdmin(admin.ModelAdmin[Any]):
    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        if PRIVATE_FIELDS.intersection(lookup.split(LOOKUP_SEP)):
            return False
        return super().lookup_allowed(lookup, value, request)


class TeamChannelsForm(forms.ModelForm[TeamChannels]):
    email_events = forms.MultipleChoiceField(
        choices=[(e, e) for e in PERSON_EVENTS], widget=forms.CheckboxSelectMultiple, required=False
    )
    slack_events = forms.MultipleChoiceField(
        choices=[(e, e) for e in PERSON_EVENTS], widget=forms.CheckboxSelectMultiple, required=False
    )

    class Meta:
        model = TeamChannels
        fields = ["email_events", "slack_channel", "slack_events"]


class TeamChannelsInline(admin.StackedInline[TeamChannels, Team]):
    """Which events reach the team's people by mail and in Slack (without a row: all of them
    by mail; in Slack, with SLACK_BOT_TOKEN set, assigned approvals to their assignees directly,
    and no channel)."""

    model = TeamChannels
    form = TeamChannelsForm
    can_delete = False


class MembershipInline(admin.TabularInline[Membership, Team]):
    """The team's members and their roles, to read: they are changed on the team's own page
    (or by manage.py team_member), through the engine, which keeps a team's last admin and
    leaves a team whose members come from the identity provider to it."""

    model = Membership
    fields = ("user", "role")
    readonly_fields = ("user", "role")
    extra = 0
    can_delete = False

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False


@admin.register(Team)
class TeamAdmin(GuardedAdmin):
    list_display = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [MembershipInline, TeamChannelsInline]


@admin.register(SignInGroup)
class SignInGroupAdmin(GuardedAdmin):
    """Which of the identity provider's groups make their members members of which team, in
    which role, at each sign-in (docs/how-to/sso.md). A team with any is managed by the provider."""

    list_display = ["group", "team", "role"]
    list_filter = ["team", "role"]
    search_fields = ["group"]


@admin.register(SignInIdentity)
class SignInIdentityAdmin(GuardedAdmin):
    """Who each single sign-on user is at the provider (written at their sign-ins). Staff link
    an identity to the account a person had before single sign-on here: its user."""

    list_display = ["user", "subject", "issuer", "last_signed_in_at"]
    search_fields = ["user__username", "subject"]
    raw_id_fields = ["user"]
    readonly_fields = ["issuer", "subject", "created_at", "last_signed_in_at"]


@admin.register(DirectoryResource)
class DirectoryResourceAdmin(GuardedAdmin):
    """The users and groups the company's directory provisioned (SCIM). Staff link a directory
    user to an account it may not take over by itself (a staff member's): its user."""

    list_display = ["resource_type", "resource_id", "user"]
    list_filter = ["resource_type"]
    search_fields = ["resource_id", "user__username"]
    raw_id_fields = ["user"]
    readonly_fields = ["resource_type", "resource_id", "payload"]


@admin.register(Preferences)
class PreferencesAdmin(GuardedAdmin):
    list_display = ["user", "email", "email_digest", "slack_user_id"]
    search_fields = ["user__username", "user__email", "slack_user_id"]
    autocomplete_fields = ["user"]


class PolicyForm(forms.ModelForm[Policy]):
    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        act = registry.find(cleaned.get("action") or "")
        default = cleaned.get("default_answer")
        upstream, _, tool = (cleaned.get("action") or "").partition("/")
        team = cleaned.get("team")
        if act is None and tool and team is not None and team.mcp_upstreams.filter(name=upstream).exists():
            pass  # a tool of the team's MCP gateway (<upstream>/<tool>): its answers are plain approvals
        elif act is None:
            self.add_error(
                "action",
                f"There is no action named {cleaned.get('action')!r}, nor a tool of the team's MCP"
                " gateway (<upstream>/<tool>).",
            )
        elif default is not None:
            # Refused now, not when a deadline passes months later.
            try:
                act.validate_answer(default)
            except ValidationError as exc:
                errors = describe_errors(field_errors(exc), "answer")
                self.add_error("default_answer", f"It does not fit {act.name}'s answer schema: {errors}")
        names = [each.strip() for each in (cleaned.get("assignees") or "").split(",") if each.strip()]
        if (
            names
            and team is not None
            and (unknown := sorted(set(names) - Membership.who_decide(team, names)))
        ):
            # An approval assigned to someone who may not decide it could never be decided.
            self.add_error("assignees", f"Not an approver or admin of {team}: {', '.join(unknown)}.")
        return cleaned


@admin.register(Policy)
class PolicyAdmin(GuardedAdmin):
    form = PolicyForm
    list_display = [
        "action",
        "team",
        "deadline_minutes",
        "escalate_after_minutes",
        "escalate_to",
        "approvals_required",
        "assignees",
        "requester_may_approve",
    ]
    list_filter = ["team"]


class TeamRuleForm(forms.ModelForm[TeamRule]):
    """A team's rule, refused when saved unless it can work: a condition that compiles (the
    error names the line and column), the fields its outcome needs, an answer that fits."""

    class Meta:
        model = TeamRule
        fields = [
            "team", "name", "action", "when", "then", "answer", "reason", "approvals", "assignees",
            "route_to", "position", "enabled",
        ]  # fmt: skip
        widgets = {"when": forms.Textarea(attrs={"rows": 3, "cols": 80, "spellcheck": "false"})}

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if when := cleaned.get("when"):
            try:
                engine.compile_condition(when)
            except ConditionError as exc:
                self.add_error("when", f"This is not a condition a rule can use: {exc}.")
        name = cleaned.get("action") or ""
        act = registry.find(name) if name else None
        if name and act is None:
            self.add_error("action", f"There is no action named {name!r}.")
        then = cleaned.get("then")
        if then == TeamRule.Then.APPROVE:
            self._clean_approve(act, cleaned.get("answer"))
        elif then == TeamRule.Then.REJECT and not (cleaned.get("reason") or "").strip():
            self.add_error("reason", "A rule that rejects must give the reason the run ends with.")
        elif then == TeamRule.Then.REQUIRE and not cleaned.get("approvals"):
            self.add_error("approvals", "Say how many people must approve.")
        elif then == TeamRule.Then.ASSIGN:
            names = [each.strip() for each in (cleaned.get("assignees") or "").split(",") if each.strip()]
            team = cleaned.get("team") or self.instance.team
            members = get_user_model().objects.filter(
                username__in=names, memberships__team=team, memberships__role__in=Role.DECIDE, is_active=True
            )
            known = set(members.values_list("username", flat=True))
            if not names:
                self.add_error("assignees", "Name at least one user.")
            elif unknown := [each for each in names if each not in known]:
                self.add_error("assignees", f"Not an approver or admin of {team}: {', '.join(unknown)}.")
        elif then == TeamRule.Then.ROUTE:
            route_to, team = cleaned.get("route_to"), cleaned.get("team") or self.instance.team_id
            if route_to is None:
                self.add_error("route_to", "Say which team it routes to.")
            elif route_to == team or getattr(route_to, "pk", None) == getattr(team, "pk", team):
                self.add_error("route_to", "Route to another team than the rule's own.")
        return cleaned

    def _clean_approve(self, act: Any, answer: Any) -> None:
        if act is not None and not act.policy.auto_approve:
            self.add_error("then", f"{act.name} may not be approved automatically (auto_approve=False).")
        elif act is not None and act.answer_model is not None and answer is None:
            self.add_error("answer", f"{act.name} takes a typed answer: give the one to approve with.")
        elif act is not None and answer is not None:
            try:
                act.validate_answer(answer)
            except ValidationError as exc:
                errors = describe_errors(field_errors(exc), "answer")
                self.add_error("answer", f"It does not fit {act.name}'s answer schema: {errors}")


@admin.register(TeamRule)
class TeamRuleAdmin(GuardedAdmin):
    """A team's rules, with a dry run: what a new or changed rule would have done to the
    team's last 1,000 interrupts, shown before it is saved."""

    form = TeamRuleForm
    change_form_template = "admin/actions/teamrule/change_form.html"
    list_display = ["name", "team", "action", "when", "then", "position", "enabled"]
    list_filter = ["team", "then", "enabled"]
    search_fields = ["name", "when", "action"]
    DRY_RUN_LIMIT = 1000
    DRY_RUN_SHOWN = 50

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return ["team"] if obj is not None else []  # a rule stays with its team

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: Any = None,
    ) -> HttpResponse:
        if request.method == "POST" and "_dryrun" in request.POST:
            return self.dry_run_view(request, object_id)
        return super().changeform_view(request, object_id, form_url, extra_context)

    def dry_run_view(self, request: HttpRequest, object_id: str | None) -> HttpResponse:
        obj = self.get_object(request, object_id) if object_id else None
        if object_id and obj is None:
            raise Http404
        if not (self.has_change_permission(request, obj) if obj else self.has_add_permission(request)):
            raise Http404
        if not request.user.has_perm("actions.view_interrupt"):
            # The dry run shows the team's interrupts: only to whoever may read them anyway.
            raise PermissionDenied("The dry run shows interrupts: it needs the permission to view them.")
        form_class = self.get_form(request, obj, change=obj is not None)
        form = form_class(request.POST, instance=obj)
        context: dict[str, Any] = {}
        if form.is_valid():
            context["dry_run"] = self._dry_run(form.instance)
        fieldsets: Any = list(self.get_fieldsets(request, obj))
        readonly = self.get_readonly_fields(request, obj)
        admin_form = helpers.AdminForm(form, fieldsets, {}, readonly, model_admin=self)
        context.update(
            self.admin_site.each_context(request),
            title=f"Dry run of {form.instance.name or 'a new rule'}",
            subtitle=None,
            adminform=admin_form,
            object_id=object_id,
            original=obj,
            is_popup=False,
            to_field=None,
            media=self.media + admin_form.media,
            inline_admin_formsets=[],
            errors=helpers.AdminErrorList(form, []),
            preserved_filters=self.get_preserved_filters(request),
        )
        return self.render_change_form(request, context, add=obj is None, change=obj is not None, obj=obj)

    def _dry_run(self, rule: TeamRule) -> dict[str, Any]:
        compiled = engine.CompiledRule(
            rule.name,
            rule.action,
            engine.compile_condition(rule.when),
            engine.outcome_of(rule),
            rule.pk,
            (rule.position, rule.pk or 2**62),
        )
        looked, held, failed = engine.dry_run(rule.team, compiled, self.DRY_RUN_LIMIT)
        agreeing = [each.agrees for each in held]
        return {
            "looked": looked,
            "limit": self.DRY_RUN_LIMIT,
            "held": held[: self.DRY_RUN_SHOWN],
            "held_count": len(held),
            "failed": failed[:10],
            "failed_count": len(failed),
            "outcome": compiled.then.describe(),
            "agree": agreeing.count(True),
            "disagree": agreeing.count(False),
            "taken_earlier": sum(1 for each in held if each.earlier),
            "still_pending": sum(1 for each in held if each.interrupt.status == Interrupt.Status.PENDING),
        }


@admin.register(Grant)
class GrantAdmin(GuardedAdmin):
    """Standing grants, given from the decision form: listed, revoked at once (they are also on
    each team's Grants page)."""

    list_display = [
        "id", "team", "action", "granted_by_name", "scope", "expires_at", "uses", "last_used_at",
        "revoked_at",
    ]  # fmt: skip
    list_filter = ["team", "action"]
    readonly_fields = [field.name for field in Grant._meta.fields] + ["scope"]
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # given by approving, from the decision form

    @admin.action(description="Revoke the selected grants now")
    def revoke(self, request: HttpRequest, queryset: Any) -> None:
        done = sum(engine.revoke_grant(grant, request.user) for grant in queryset)
        self.message_user(request, f"Revoked {done} grant{'s' if done != 1 else ''}.")


@admin.register(Delegation)
class DelegationAdmin(GuardedAdmin):
    list_display = ["user", "delegate", "starts_at", "ends_at"]
    autocomplete_fields = ["user", "delegate"]


@admin.register(ApiToken)
class ApiTokenAdmin(GuardedAdmin):
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


class ReadOnlyAdmin(GuardedAdmin):
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
    # The checkpoint is the action's private state: on no admin page but its own, below.
    exclude = ["state"]
    readonly_fields = ["checkpoint"]

    @admin.display(description="Checkpoint")
    def checkpoint(self, obj: Interrupt) -> str:
        request = getattr(self, "_request", None)
        if request is None or not request.user.is_superuser:
            return "Private to the action (superusers may view it; each view is logged)."
        url = reverse("admin:actions_interrupt_checkpoint", args=[obj.pk])
        return format_html('<a href="{}">Show checkpoint</a> (the view is logged)', url)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        self._request = request
        return super().get_readonly_fields(request, obj)

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view(self.checkpoint_view)
        return [
            path("<int:pk>/checkpoint/", view, name="actions_interrupt_checkpoint"),
            *super().get_urls(),
        ]

    def checkpoint_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        if not request.user.is_superuser:
            raise Http404
        interrupt = get_object_or_404(Interrupt, pk=pk)
        engine.log_event(interrupt.run_id, RunEvent.Kind.CHECKPOINT_VIEWED, request.user, interrupt)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Checkpoint of {interrupt}",
            "interrupt": interrupt,
            "state": json.dumps(interrupt.state, indent=2, ensure_ascii=False, sort_keys=True),
        }
        return TemplateResponse(request, "admin/actions/interrupt/checkpoint.html", context)


@admin.register(RunEvent)
class RunEventAdmin(ReadOnlyAdmin):
    list_display = ["at", "run", "kind", "actor_name"]
    list_filter = ["kind"]


@admin.register(AuditHead)
class AuditHeadAdmin(ReadOnlyAdmin):
    """The chain's heads as published: compare them with the copies held elsewhere."""

    list_display = ["at", "seq", "head"]


@admin.register(AuditCheck)
class AuditCheckAdmin(ReadOnlyAdmin):
    list_display = ["at", "ok", "events", "seq", "head"]
    list_filter = ["ok"]


@admin.register(AuditExport)
class AuditExportAdmin(ReadOnlyAdmin):
    list_display = ["at", "user_name", "what", "format", "filters"]
    list_filter = ["what", "format"]
    search_fields = ["user_name"]


@admin.register(AuditAnchor)
class AuditAnchorAdmin(ReadOnlyAdmin):
    list_display = ["seq", "run_id", "hash", "pruned_at"]


class WebhookForm(forms.ModelForm[Webhook]):
    def clean_url(self) -> str:
        """The API's rule for an endpoint (public addresses unless the site allows private
        ones): a URL changed here is checked as one registered there."""
        url = str(self.cleaned_data["url"])
        if problem := url_problem(url):
            raise forms.ValidationError(problem)
        return url


@admin.register(Webhook)
class WebhookAdmin(GuardedAdmin):
    """A team's endpoints (made through the API, which shows the secret once). A disabled one
    says why; enabling it again clears its failures."""

    form = WebhookForm
    list_display = ["url", "team", "created_at", "failing_since", "disabled_at"]
    list_filter = ["team", ("disabled_at", admin.EmptyFieldListFilter)]
    exclude = ["secret"]
    readonly_fields = ["created_at", "created_by_name", "failing_since", "disabled_at", "disabled_reason"]
    actions = ["enable"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # POST /api/webhooks, which shows the secret once

    @admin.action(description="Enable selected webhooks again")
    def enable(self, request: HttpRequest, queryset: Any) -> None:
        queryset.update(disabled_at=None, disabled_reason="", failing_since=None)


class DeliveryAttemptInline(admin.TabularInline[DeliveryAttempt, Notification]):
    model = DeliveryAttempt
    fields = ["at", "ok", "status_code", "error", "duration_ms"]
    readonly_fields = ["at", "ok", "status_code", "error", "duration_ms"]
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdmin):
    """Every notification and each attempt to deliver it; redeliver sends one again now."""

    list_display = [
        "created_at", "type", "channel", "webhook", "recipient", "outcome", "attempts", "delivered_at"
    ]  # fmt: skip
    list_filter = ["outcome", "channel", "type"]
    inlines = [DeliveryAttemptInline]
    actions = ["redeliver"]

    @admin.action(description="Redeliver selected notifications now")
    def redeliver(self, request: HttpRequest, queryset: Any) -> None:
        count = notify.redeliver(list(queryset.values_list("pk", flat=True)))
        self.message_user(request, f"{count} notification(s) will be sent again now.")
