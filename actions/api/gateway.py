"""The MCP gateway's upstreams: the token's team's MCP servers, served at /mcp/gateway/<name>/
(actions.drivers.gateway)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.http import HttpRequest
from ninja import Router, Schema, Status
from ninja.errors import HttpError
from pydantic import Field

from actions import engine
from actions.api.base import Error, In, needs, token_of
from actions.models import McpUpstream, Scope

router = Router()


class UpstreamIn(In):
    name: str = Field(
        min_length=1,
        max_length=50,
        description="Lower-case letters, digits and hyphens: the tools are served at /mcp/gateway/{name}/, "
        "and rules name them {name}/{tool}",
        json_schema_extra={"pattern": "^[a-z0-9](?:[a-z0-9-]{0,48}[a-z0-9])?$"},
    )
    url: str = Field(
        min_length=1,
        max_length=2000,
        description="The server's Streamable HTTP endpoint: http or https, resolving to public addresses "
        "only (unless the site sets GRUNDLAG_WEBHOOK_ALLOW_PRIVATE); checked again at each request",
        json_schema_extra={"format": "uri", "pattern": "^[Hh][Tt][Tt][Pp][Ss]?://"},
    )
    headers: dict[str, str] | None = Field(
        default=None,
        description="Sent with every request to it (its credentials, e.g. Authorization); stored sealed and "
        "never shown again",
    )
    default_policy: McpUpstream.Policy = Field(
        default=McpUpstream.Policy.RULES,
        description="ask: a person decides every call; rules: the team's rules and grants, then people; "
        "never: calls go straight through",
    )
    tool_policies: dict[str, McpUpstream.Policy] = Field(
        default_factory=dict, description="A policy per tool name, over the default"
    )


class UpstreamOut(Schema):
    id: int
    name: str
    url: str
    header_names: list[str] = Field(description="The headers it is sent; their values are never shown")
    default_policy: str
    tool_policies: dict[str, str]
    tools: list[str] = Field(description="Its tools, as it last listed them")
    tools_fetched_at: datetime | None
    tools_error: str
    gateway_path: str = Field(description="Where agent hosts reach its tools, with a token of the team's")
    created_at: datetime


def upstream_out(upstream: McpUpstream) -> dict[str, Any]:
    return {
        "id": upstream.pk,
        "name": upstream.name,
        "url": upstream.url,
        "header_names": upstream.header_names,
        "default_policy": upstream.default_policy,
        "tool_policies": upstream.tool_policies,
        "tools": [tool.get("name", "") for tool in upstream.tools],
        "tools_fetched_at": upstream.tools_fetched_at,
        "tools_error": upstream.tools_error,
        "gateway_path": f"/mcp/gateway/{upstream.name}/",
        "created_at": upstream.created_at,
    }


@router.post(
    "/mcp-upstreams",
    response={201: UpstreamOut, 403: Error, 422: Error},
    tags=["gateway"],
    auth=needs(Scope.GATEWAY_WRITE),
)
def create_upstream(request: HttpRequest, payload: UpstreamIn) -> Status[dict[str, Any]]:
    """Put the team's approvals in front of an MCP server: its tools are served at
    `/mcp/gateway/{name}/`, and each call is decided by its tool's policy before it is made."""
    token = token_of(request)
    with transaction.atomic():
        upstream = engine.gateway.register(token.team, payload.name, payload.url, payload.headers, by=token)
        for tool, policy in payload.tool_policies.items():
            engine.gateway.set_policy(upstream, tool, policy, by=token)
        if payload.default_policy != upstream.default_policy:
            engine.gateway.set_policy(upstream, "", payload.default_policy, by=token)
        engine.idempotency.record(None)
    return Status(201, upstream_out(upstream))


@router.get("/mcp-upstreams", response=list[UpstreamOut], tags=["gateway"], auth=needs(Scope.GATEWAY_WRITE))
def list_upstreams(request: HttpRequest) -> list[dict[str, Any]]:
    return [upstream_out(upstream) for upstream in McpUpstream.objects.filter(team=token_of(request).team_id)]


@router.delete(
    "/mcp-upstreams/{name}",
    response={204: None, 404: Error},
    tags=["gateway"],
    auth=needs(Scope.GATEWAY_WRITE),
)
def delete_upstream(request: HttpRequest, name: str) -> Status[None]:
    token = token_of(request)
    upstream = engine.gateway.for_token(token, name)
    if upstream is None:
        raise HttpError(404, "no such MCP upstream")
    engine.gateway.remove(upstream, by=token)
    return Status(204, None)
