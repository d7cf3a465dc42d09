"""Runs: the team's runs, one run's timeline and conversation, starting an action from the
dashboard, cancelling a run; and a person's own notification settings."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db.models import Q
from django.forms import ModelForm
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST
from django_htmx.http import HttpResponseClientRedirect

from actions import engine
from actions.core import UnknownAction, registry
from actions.models import Interrupt, Preferences, Role, Run, RunEvent, Team
from actions.web.forms import form_for_schema
from actions.web.views import AuthenticatedRequest, decision_context, get_run_for_user, is_htmx

# Runs


def _timeline(run: Run) -> list[RunEvent]:
    return list(run.events.select_related("interrupt").order_by("at", "id"))


def _conversation(run: Run, interrupts: list[Interrupt]) -> list[dict[str, Any]]:
    """An agent's messages for display, each tool call with its parsed arguments and its latest
    interrupt, if it paused."""
    # Each call with the latest interrupt of its turn and position (ids may repeat across turns).
    latest = {
        (it.binding.get("turn"), it.binding.get("position")): it for it in interrupts if it.tool_call_id
    }
    shown = []
    turn = -1
    for message in run.driver_state.get("messages", []):
        calls = []
        if message.get("role") == "assistant":
            turn += 1
        for position, call in enumerate(message.get("tool_calls") or []):
            function = call.get("function", {})
            try:
                arguments = json.loads(function.get("arguments") or "{}")
            except json.JSONDecodeError:
                arguments = function.get("arguments")
            calls.append(
                {
                    "id": call.get("id"),
                    "name": function.get("name"),
                    "arguments": arguments,
                    "interrupt": latest.get((turn, position)),
                }
            )
        shown.append(
            {
                "role": message.get("role"),
                "content": message.get("content"),
                "calls": calls,
                "tool_call_id": message.get("tool_call_id"),
            }
        )
    return shown


@login_required
def run_detail(request: AuthenticatedRequest, pk: int) -> HttpResponse:
    run = get_run_for_user(request.user, pk)
    interrupts = list(run.interrupts.order_by("seq"))
    decisions = [decision_context(request, it) for it in interrupts if it.is_pending]
    context = {
        "run": run,
        "events": _timeline(run),
        "interrupts": interrupts,
        "decisions": decisions,
        "conversation": _conversation(run, interrupts) if run.consumer == Run.Consumer.AGENT else None,
        "may_cancel": _may_cancel(request.user, run),
    }
    if is_htmx(request):
        return render(request, "actions/partials/run_body.html", context)
    return render(request, "actions/run.html", context)


def _may_cancel(user: User, run: Run) -> bool:
    return run.status in engine.CANCELLABLE and not engine.why_not_cancel(user, run)


@login_required
@require_POST
def cancel_run(request: AuthenticatedRequest, pk: int) -> HttpResponse:
    """Cancel the run (a form with a confirmation box on the run's page)."""
    run = get_run_for_user(request.user, pk)
    if not request.POST.get("confirm"):
        messages.error(request, "Not cancelled: tick the box to confirm.")
        return redirect(run)
    try:
        engine.cancel(run, request.user)
    except (engine.NotCancellable, engine.NotAllowed, engine.Busy) as exc:
        messages.error(request, f"Not cancelled: {str(exc).rstrip('.')}.")
    else:
        messages.success(request, f"Cancelled run {run.pk}; its pending approvals left the inbox.")
    return redirect(run)


@login_required
def start(request: AuthenticatedRequest) -> HttpResponse:
    teams = Team.where(request.user, Role.DECIDE)
    return render(request, "actions/start.html", {"actions": registry.all(), "has_team": teams.exists()})


@login_required
def start_action(request: AuthenticatedRequest, name: str) -> HttpResponse:
    try:
        act = registry.get(name)
    except UnknownAction:
        raise Http404("No such action") from None
    teams = Team.where(request.user, Role.DECIDE)
    form_class = form_for_schema(act.input_schema())
    form = form_class(request.POST or None, prefix="input")
    error = ""
    if request.method == "POST":
        team = teams.filter(slug=request.POST.get("team", "")).first()
        if team is None:
            error = "Choose one of your teams."
        elif form.is_valid():
            try:
                run = engine.start_run(act.name, form.payload(), team, request.user, Run.Consumer.DASHBOARD)
            except engine.InvalidInput as exc:
                form.add_model_errors(exc.errors)
            except engine.PayloadTooLarge as exc:
                form.add_error(None, str(exc))
            else:
                if is_htmx(request):
                    return HttpResponseClientRedirect(run.get_absolute_url())
                return redirect(run)
    context = {"action": act, "form": form, "teams": teams, "error": error}
    return render(
        request, "actions/start_action.html", context, status=422 if request.method == "POST" else 200
    )


@login_required
def runs(request: AuthenticatedRequest) -> HttpResponse:
    """Recent runs of the user's teams."""
    visible = Run.visible_to(request.user).select_related("team")
    status = request.GET.get("status", "")
    if status:
        visible = visible.filter(status=status)
    query = request.GET.get("q", "").strip()
    if query:
        visible = visible.filter(Q(action__icontains=query) | Q(started_by_name__icontains=query))
    return render(
        request,
        "actions/runs.html",
        {"runs": visible[:100], "status": status, "q": query, "statuses": Run.Status.choices},
    )


# A person's own notification settings


class PreferencesForm(ModelForm[Preferences]):
    class Meta:
        model = Preferences
        fields = ["email", "email_digest"]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if cleaned.get("email_digest") and not cleaned.get("email"):
            raise ValidationError("A digest is mail: turn mail on to get one.")
        return cleaned


@login_required
def preferences(request: AuthenticatedRequest) -> HttpResponse:
    prefs = Preferences.objects.filter(user=request.user).first() or Preferences(user=request.user)
    form = PreferencesForm(request.POST if request.method == "POST" else None, instance=prefs)
    if form.is_valid():
        form.save()
        messages.success(request, "Saved.")
        return redirect("notification-preferences")
    return render(request, "actions/preferences.html", {"form": form, "has_email": bool(request.user.email)})
