"""A team's MCP gateway on its Team page: the upstream MCP servers its admins register, and each
one's page, where its tools' policies are set (actions.engine.gateway; the calls themselves go
through actions.drivers.gateway)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from actions import engine
from actions.drivers import gateway as gateway_driver
from actions.models import McpUpstream
from actions.web.teams import team_for, team_page
from actions.web.views import AuthenticatedRequest


def _headers(text: str) -> dict[str, str]:
    """``Name: value`` lines, as the form takes them."""
    headers = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise engine.InvalidInput(f"write each header as Name: value ({line.strip()[:40]!r} is not)", [])
        headers[name.strip()] = value.strip()
    return headers


@login_required
@require_POST
def add_upstream(request: AuthenticatedRequest, slug: str) -> HttpResponse:
    team = team_for(request, slug)
    try:
        with transaction.atomic():
            upstream = engine.gateway.register(
                team,
                request.POST.get("name", ""),
                request.POST.get("url", ""),
                _headers(request.POST.get("headers", "")),
                by=request.user,
            )
            engine.gateway.set_policy(
                upstream, "", request.POST.get("default_policy", "rules"), by=request.user
            )
    except engine.InvalidInput as exc:
        return team_page(request, team, status=422, error=f"{str(exc)[:1].upper()}{str(exc)[1:]}.")
    except engine.NotAllowed as exc:
        return team_page(request, team, status=403, error=str(exc))
    _refresh(request, upstream)
    return redirect("team-upstream", slug=team.slug, name=upstream.name)


def _upstream(request: AuthenticatedRequest, slug: str, name: str) -> McpUpstream:
    team = team_for(request, slug)
    upstream = McpUpstream.objects.filter(team=team, name=name).select_related("team").first()
    if upstream is None or not engine.members.may_manage(request.user, team):
        raise Http404("No such MCP upstream")
    return upstream


def _refresh(request: AuthenticatedRequest, upstream: McpUpstream) -> None:
    try:
        tools = gateway_driver.refresh_tools(upstream)
    except gateway_driver.UpstreamFailed as exc:
        messages.error(request, f"{upstream.name} could not be asked for its tools: {exc}")
        return
    messages.success(request, f"{upstream.name} lists {len(tools)} tools.")


@login_required
def upstream_page(request: AuthenticatedRequest, slug: str, name: str) -> HttpResponse:
    upstream = _upstream(request, slug, name)
    tools = [
        {**tool, "policy": upstream.tool_policies.get(tool.get("name", ""), "")} for tool in upstream.tools
    ]
    context = {
        "upstream": upstream,
        "team": upstream.team,
        "tools": tools,
        "policies": McpUpstream.Policy.choices,
        "gateway_url": request.build_absolute_uri(f"/mcp/gateway/{upstream.name}/"),
    }
    return render(request, "actions/upstream.html", context)


@login_required
@require_POST
def set_policies(request: AuthenticatedRequest, slug: str, name: str) -> HttpResponse:
    """The default policy and each listed tool's (empty: the default)."""
    upstream = _upstream(request, slug, name)
    try:
        engine.gateway.set_policy(upstream, "", request.POST.get("default_policy", ""), by=request.user)
        for tool in upstream.tools:
            tool_name = tool.get("name", "")
            chosen = request.POST.get(f"policy-{tool_name}", "")
            if chosen:
                engine.gateway.set_policy(upstream, tool_name, chosen, by=request.user)
            elif tool_name in upstream.tool_policies:
                engine.gateway.clear_policy(upstream, tool_name, by=request.user)
    except (engine.InvalidInput, engine.NotAllowed) as exc:
        messages.error(request, str(exc))
        return redirect("team-upstream", slug=slug, name=name)
    messages.success(request, "Saved: calls from now on are decided so.")
    return redirect("team-upstream", slug=slug, name=name)


@login_required
@require_POST
def refresh_upstream(request: AuthenticatedRequest, slug: str, name: str) -> HttpResponse:
    _refresh(request, _upstream(request, slug, name))
    return redirect("team-upstream", slug=slug, name=name)


@login_required
@require_POST
def remove_upstream(request: AuthenticatedRequest, slug: str, name: str) -> HttpResponse:
    upstream = _upstream(request, slug, name)
    try:
        engine.gateway.remove(upstream, by=request.user)
    except engine.NotAllowed as exc:
        return team_page(request, upstream.team, status=403, error=str(exc))
    messages.success(request, f"Removed {upstream.name}: its tools are served no more.")
    return redirect("team", slug=slug)
