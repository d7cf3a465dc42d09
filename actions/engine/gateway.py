"""The MCP gateway's state: the upstream servers a team registers (their address checked, their
credentials sealed), each tool's policy, the tools they last listed, and the calls made through
them. Nothing here talks to an upstream: actions.drivers.gateway does, in a run's step.

A call is a run (consumer ``gateway``, action ``<upstream>/<tool>``): its pause is decided like
any other (the team's rules and grants over ``action`` and ``input``, the arguments; then
people), and its step calls the upstream once, after the approval. A host that sends a call
again, the same tool with the same arguments, before it has been given the first one's result
joins the first: a retry does not ask twice, nor run twice."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from actions.engine import outbound, sealed
from actions.engine.driving import arguments_hash
from actions.engine.errors import InvalidInput, NotAllowed, check_size
from actions.engine.policies import role_refusal
from actions.engine.schemas import field_error
from actions.engine.steps import start_run
from actions.models import (
    UPSTREAM_NAME,
    Actor,
    ApiToken,
    GatewayCall,
    McpUpstream,
    Membership,
    Role,
    Run,
    Team,
    actor_name,
)

logger = logging.getLogger(__name__)

MAX_HEADERS = 20
MAX_HEADER_BYTES = 8192
# RFC 9110's token: what a header's name may be.
_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,100}$")
# Set by the gateway itself, or by the transport: not the team's to choose.
_RESERVED = {"host", "content-length", "content-type", "accept", "connection", "transfer-encoding",
             "mcp-protocol-version", "mcp-session-id"}  # fmt: skip
Policy = McpUpstream.Policy


def _may_manage(by: Actor, team: Team) -> None:
    """Team admins (and staff, and a token of the team's, whose scope the API checked) may
    change its upstreams."""
    if by is None or isinstance(by, ApiToken):
        if isinstance(by, ApiToken) and by.team_id != team.pk:
            raise NotAllowed("This token is another team's.")
        return
    if getattr(by, "is_staff", False) or Membership.has(by.pk, [team.pk], Role.MANAGE):
        return
    raise NotAllowed(
        role_refusal(by, [team.pk], Role.MANAGE, "manage the team's MCP gateway")
        or f"Only admins of {team} can manage its MCP gateway."
    )


def check_headers(headers: Any) -> dict[str, str]:
    """The headers an upstream is sent with every request (its credentials), checked."""
    if headers is None:
        return {}
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise InvalidInput(
            "headers must be an object of strings", [field_error("headers", "an object of strings")]
        )
    if len(headers) > MAX_HEADERS:
        raise InvalidInput(
            f"at most {MAX_HEADERS} headers", [field_error("headers", f"at most {MAX_HEADERS}")]
        )
    if len(json.dumps(headers).encode()) > MAX_HEADER_BYTES:
        raise InvalidInput(
            f"the headers are over {MAX_HEADER_BYTES} bytes", [field_error("headers", "too large")]
        )
    for name, value in headers.items():
        if not _HEADER_NAME.match(name):
            raise InvalidInput(f"not a header name: {name!r}", [field_error("headers", f"bad name {name!r}")])
        if name.lower() in _RESERVED:
            raise InvalidInput(
                f"the gateway sets {name} itself", [field_error("headers", f"{name} is the gateway's")]
            )
        if any(char in value for char in "\r\n\0"):
            raise InvalidInput(
                f"the value of {name} has a line break", [field_error("headers", f"{name}: no line breaks")]
            )
    return dict(headers)


def register(team: Team, name: str, url: str, headers: Any = None, *, by: Actor) -> McpUpstream:
    """Register an upstream MCP server for ``team``. InvalidInput (nothing kept) for a name
    already taken or not a name, a URL the site may not call (GRUNDLAG_WEBHOOK_ALLOW_PRIVATE's
    rules: public addresses only), headers that are not headers."""
    _may_manage(by, team)
    name = (name or "").strip()
    try:
        UPSTREAM_NAME(name)
    except ValidationError as exc:
        raise InvalidInput(f"name: {exc.messages[0]}", [field_error("name", exc.messages[0])]) from None
    url = (url or "").strip()
    if len(url) > 2000:
        raise InvalidInput("url: at most 2,000 characters", [field_error("url", "too long")])
    if problem := outbound.url_problem(url):
        raise InvalidInput(f"url: {problem}", [field_error("url", problem)])
    checked = check_headers(headers)
    upstream = McpUpstream(
        team=team,
        name=name,
        url=url,
        headers_sealed=sealed.seal(json.dumps(checked)) if checked else "",
        header_names=sorted(checked),
        created_by_name=actor_name(by),
    )
    try:
        with transaction.atomic():
            upstream.save()
    except IntegrityError:
        raise InvalidInput(
            f"{team} already has an MCP upstream named {name}", [field_error("name", "already taken")]
        ) from None
    logger.info("MCP upstream %s registered by %s: %s", upstream, actor_name(by), url)
    return upstream


def remove(upstream: McpUpstream, *, by: Actor) -> None:
    """Remove an upstream: its tools are served no more; the calls made through it stay in the
    history (a pending one is cancelled by whoever cancels its run)."""
    _may_manage(by, upstream.team)
    upstream.delete()
    logger.info("MCP upstream %s removed by %s", upstream, actor_name(by))


def set_policy(upstream: McpUpstream, tool: str, policy: str, *, by: Actor) -> None:
    """The policy of one tool (``tool`` "": the default for every tool not set)."""
    _may_manage(by, upstream.team)
    if policy not in Policy.values:
        raise InvalidInput(
            f"policy must be one of {', '.join(Policy.values)}", [field_error("policy", "unknown")]
        )
    if tool:
        upstream.tool_policies = {**upstream.tool_policies, tool: policy}
        upstream.save(update_fields=["tool_policies"])
    else:
        upstream.default_policy = policy
        upstream.save(update_fields=["default_policy"])
    logger.info(
        "MCP upstream %s: %s set to %s by %s", upstream, tool or "the default", policy, actor_name(by)
    )


def clear_policy(upstream: McpUpstream, tool: str, *, by: Actor) -> None:
    """The tool follows the upstream's default policy again."""
    _may_manage(by, upstream.team)
    upstream.tool_policies = {name: policy for name, policy in upstream.tool_policies.items() if name != tool}
    upstream.save(update_fields=["tool_policies"])
    logger.info("MCP upstream %s: %s follows the default, set by %s", upstream, tool, actor_name(by))


def headers_of(upstream: McpUpstream) -> dict[str, str]:
    return json.loads(sealed.unseal(upstream.headers_sealed)) if upstream.headers_sealed else {}


def record_tools(upstream_id: int, tools: list[dict[str, Any]] | None, error: str = "") -> None:
    """What an upstream's tools/list said (None, with ``error``: it could not be asked)."""
    changes: dict[str, Any] = {"tools_fetched_at": timezone.now(), "tools_error": error[:500]}
    if tools is not None:
        changes["tools"] = tools
    McpUpstream.objects.filter(pk=upstream_id).update(**changes)


def tools_changed(upstream_id: int) -> None:
    """The upstream said its list changed: it is asked again at the next tools/list."""
    McpUpstream.objects.filter(pk=upstream_id).update(tools_fetched_at=None)


def for_token(token: ApiToken, name: str) -> McpUpstream | None:
    return McpUpstream.objects.filter(team_id=token.team_id, name=name).select_related("team").first()


def start_call(
    token: ApiToken, upstream: McpUpstream, tool: str, arguments: dict[str, Any]
) -> tuple[Run, bool]:
    """The run of a call to ``tool`` with ``arguments``, and whether it is an earlier one's: the
    same token's same call, whose result it has not been given yet (a retry joins it). Else a
    new run, whose step asks (or not) as the tool's policy says. InvalidInput: arguments too
    large."""
    check_size("the arguments", arguments)
    digest = arguments_hash(arguments)
    policy = upstream.policy_for(tool)
    with transaction.atomic():
        # One call at a time per upstream makes "join or start" one decision (SQLite's writes
        # are one at a time anyway).
        McpUpstream.objects.select_for_update().filter(pk=upstream.pk).first()
        earlier = (
            GatewayCall.objects.filter(
                token=token, upstream=upstream, tool=tool, arguments_sha256=digest, delivered=False
            )
            .exclude(run__status=Run.Status.CANCELLED)
            .select_related("run")
            .order_by("-created_at")
            .first()
        )
        if earlier is not None:
            return earlier.run, True
        described = upstream.tool(tool) or {}
        run = start_run(
            f"{upstream.name}/{tool}",
            {"upstream": upstream.name, "tool": tool, "arguments": arguments},
            upstream.team,
            token,
            Run.Consumer.GATEWAY,
            driver_state={
                "upstream": upstream.pk,
                "tool": tool,
                "arguments": arguments,
                "policy": policy,
                "input_schema": described.get("inputSchema"),
                "description": (described.get("description") or "")[:500],
            },
        )
        GatewayCall.objects.create(
            run=run, upstream=upstream, token=token, tool=tool, arguments_sha256=digest
        )
    return run, False


def delivered(run_id: int) -> None:
    """The host has been given the call's final result: the same call again is a new call."""
    GatewayCall.objects.filter(run_id=run_id, delivered=False).update(delivered=True)


def claim_call(run_id: int) -> bool:
    """Whether this step may call the upstream: the first to ask, once, ever (a conditional
    UPDATE: a step run again after its worker was lost mid-call gets False)."""
    return bool(GatewayCall.objects.filter(run_id=run_id, called_at=None).update(called_at=timezone.now()))
