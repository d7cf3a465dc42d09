"""Standing grants (given from the decision form) and time away (a delegate decides what is
assigned to you): each team's Grants page, revoking at once, and your Away page."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from actions import engine
from actions.models import Delegation, Grant, Role, Team
from actions.web.views import AuthenticatedRequest

ENDED_SHOWN = 50


def _grants_for(user: Any) -> Any:
    grants = Grant.objects.select_related("team", "run")
    return grants if user.is_staff else grants.filter(team__in=Team.where(user, Role.READ))


@login_required
def grants(request: AuthenticatedRequest) -> HttpResponse:
    """The standing grants of your teams: those in force, then the last ones that ended."""
    now = timezone.now()
    visible = _grants_for(request.user)
    live = engine.live_grants(visible, now).order_by("-created_at")
    ended = visible.exclude(pk__in=live.values("pk")).order_by("-created_at")[:ENDED_SHOWN]
    return render(request, "actions/grants.html", {"live": list(live), "ended": list(ended), "now": now})


@login_required
@require_POST
def revoke(request: AuthenticatedRequest, pk: int) -> HttpResponse:
    """The team's approvers and admins may revoke a grant: stopping one is never risky."""
    grant = _grants_for(request.user).filter(pk=pk).first()
    if grant is None:
        raise Http404("No such grant")
    try:
        revoked = engine.revoke_grant(grant, request.user)
    except engine.NotAllowed as exc:
        messages.error(request, str(exc))
        return redirect("grants")
    if revoked:
        messages.success(request, f"Revoked grant #{grant.pk}: it approves nothing more.")
    else:
        messages.info(request, f"Grant #{grant.pk} was revoked already.")
    return redirect("grants")


class AwayForm(forms.Form):
    delegate = forms.ModelChoiceField(queryset=get_user_model().objects.none(), label="Who decides for you")
    starts_at = forms.DateTimeField(
        label="From", widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M")
    )
    ends_at = forms.DateTimeField(
        label="Until", widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M")
    )

    def __init__(self, user: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Those who decide in a team where the user decides: only they can take their approvals.
        teammates = get_user_model().objects.filter(
            memberships__team__in=Team.where(user, Role.DECIDE),
            memberships__role__in=Role.DECIDE,
            is_active=True,
        )
        delegate = self.fields["delegate"]
        assert isinstance(delegate, forms.ModelChoiceField)
        delegate.queryset = teammates.exclude(pk=user.pk).distinct().order_by("username")


@login_required
def away(request: AuthenticatedRequest) -> HttpResponse:
    """Out of office: while you are away, approvals assigned to you go to your delegate."""
    now = timezone.now()
    initial = {"starts_at": now, "ends_at": now + timedelta(days=7)}
    form = AwayForm(request.user, request.POST if request.method == "POST" else None, initial=initial)
    if form.is_valid():
        data = form.cleaned_data
        try:
            made = engine.set_away(request.user, data["delegate"], data["starts_at"], data["ends_at"])
        except ValueError as exc:
            form.add_error(None, f"{str(exc)[:1].upper()}{str(exc)[1:]}.")
        else:
            messages.success(
                request, f"Away until {made.ends_at:%Y-%m-%d %H:%M}: {made.delegate} decides for you."
            )
            return redirect("away")
    current = Delegation.objects.filter(user=request.user, ends_at__gt=now).select_related("delegate")
    covering = Delegation.objects.filter(delegate=request.user, ends_at__gt=now).select_related("user")
    status = 422 if request.method == "POST" else 200
    return render(
        request,
        "actions/away.html",
        {"form": form, "current": current, "covering": covering, "now": now},
        status=status,
    )


@login_required
@require_POST
def back(request: AuthenticatedRequest, pk: int) -> HttpResponse:
    absence = Delegation.objects.filter(pk=pk, user=request.user).first()
    if absence is None:
        raise Http404("No such absence")
    engine.end_away(absence)
    messages.success(request, "Welcome back: what is assigned to you comes to you again.")
    return redirect("away")
