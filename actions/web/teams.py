"""Your teams, and each team's page: its members and their roles, which its admins (and staff)
change here (actions.engine.members), its API tokens, which they make and revoke here
(actions.engine.tokens), and its MCP gateway's upstreams (actions.web.gateway)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from actions import engine
from actions.models import ApiToken, McpUpstream, Membership, Role, Scope, Team
from actions.web.views import AuthenticatedRequest


def team_for(request: AuthenticatedRequest, slug: str) -> Team:
    """The team, to its members (any role) and staff; 404 to anyone else."""
    teams = Team.objects.all() if request.user.is_staff else Team.where(request.user, Role.READ)
    team = teams.filter(slug=slug).first()
    if team is None:
        raise Http404("No such team")
    return team


@login_required
def teams(request: AuthenticatedRequest) -> HttpResponse:
    mine = Membership.objects.filter(user=request.user).select_related("team").order_by("team__name")
    return render(request, "actions/teams.html", {"memberships": mine})


def team_page(
    request: AuthenticatedRequest, team: Team, *, status: int = 200, error: str = "", **extra: Any
) -> HttpResponse:
    members = Membership.objects.filter(team=team).select_related("user").order_by("user__username")
    may_manage = engine.members.may_manage(request.user, team)
    context = {
        "team": team,
        "members": members,
        "roles": Role.choices,
        "may_manage": may_manage,
        "error": error,
        # The tokens are the admins' to see: their names and scopes say what the team automates.
        "tokens": _tokens(request, team) if may_manage else [],
        # A team whose members come from the identity provider or the directory: read only here.
        "from_provider": engine.members.from_provider(team),
        "scopes": Scope.choices,
        "upstreams": McpUpstream.objects.filter(team=team) if may_manage else [],
        "policies": McpUpstream.Policy.choices,
        "now": timezone.now(),
        **extra,
    }
    return render(request, "actions/team.html", context, status=status)


def _tokens(request: AuthenticatedRequest, team: Team) -> Any:
    tokens = ApiToken.objects.filter(team=team).order_by("-created_at")
    # The directory's (scim) tokens are staff's, whichever team they were made in.
    return [token for token in tokens if request.user.is_staff or Scope.SCIM not in token.scopes]


@login_required
def team(request: AuthenticatedRequest, slug: str) -> HttpResponse:
    return team_page(request, team_for(request, slug))


@login_required
@require_POST
def set_member(request: AuthenticatedRequest, slug: str) -> HttpResponse:
    """Add a member in a role, or change a member's role (the form names them by username)."""
    team = team_for(request, slug)
    # Before the username is looked up: who is not the team's admin learns nothing of who exists.
    if not engine.members.may_manage(request.user, team):
        return team_page(request, team, status=403, error=engine.members.why_not_manage(request.user, team))
    users = get_user_model()
    name = request.POST.get("username", "").strip()
    user = users.objects.filter(**{users.USERNAME_FIELD: name}).first() if name else None
    if user is None:
        error = f"There is no user named {name!r}." if name else "Name a user."
        return team_page(request, team, status=422, error=error)
    try:
        change = engine.members.set_role(team, user, request.POST.get("role", ""), request.user)
    except engine.InvalidInput as exc:
        return team_page(request, team, status=422, error=f"{str(exc)[:1].upper()}{str(exc)[1:]}.")
    except engine.NotAllowed as exc:
        return team_page(request, team, status=403, error=str(exc))
    if change.changed:
        messages.success(request, f"{name} is {change.after} in {team}.")
    return redirect("team", slug=team.slug)


@login_required
@require_POST
def create_token(request: AuthenticatedRequest, slug: str) -> HttpResponse:
    """A new token with the scopes ticked, lasting the days given (none: until revoked); its key
    is on the page this answers with, once, never again."""
    team = team_for(request, slug)
    days = request.POST.get("expires_in_days", "").strip()
    try:
        lasting = engine.tokens.lifetime(f"{days}d") if days else None
        token, key = engine.tokens.issue(
            team, request.POST.get("name", ""), request.POST.getlist("scopes"), lasting, request.user
        )
    except engine.InvalidInput as exc:
        return team_page(request, team, status=422, error=f"{str(exc)[:1].upper()}{str(exc)[1:]}.")
    except engine.NotAllowed as exc:
        return team_page(request, team, status=403, error=str(exc))
    # Not a redirect: the key is in this answer only (no-store), as nowhere else.
    response = team_page(request, team, new_token=token, new_key=key)
    response["Cache-Control"] = "no-store"
    return response


@login_required
@require_POST
def revoke_token(request: AuthenticatedRequest, slug: str, token_id: int) -> HttpResponse:
    team = team_for(request, slug)
    token = ApiToken.objects.filter(team=team, pk=token_id).select_related("team").first()
    if token is None:
        raise Http404("No such token")
    try:
        revoked = engine.tokens.revoke(token, request.user)
    except engine.NotAllowed as exc:
        return team_page(request, team, status=403, error=str(exc))
    if revoked:
        messages.success(request, f"Revoked {token}: it is refused from now on.")
    return redirect("team", slug=team.slug)


@login_required
@require_POST
def remove_member(request: AuthenticatedRequest, slug: str, user_id: int) -> HttpResponse:
    team = team_for(request, slug)
    membership = Membership.objects.filter(team=team, user_id=user_id).select_related("user").first()
    if membership is None:
        raise Http404("No such member")
    try:
        engine.members.remove(team, membership.user, request.user)
    except engine.NotAllowed as exc:
        return team_page(request, team, status=403, error=str(exc))
    messages.success(request, f"{membership.user.get_username()} is no longer in {team}.")
    return redirect("team", slug=team.slug)
