"""The MCP gateway's state: the upstream servers a team registers (their address checked, their
credentials sealed), each tool's policy, the tools they last listed, and the calls made through
them. Nothing here talks to an upstream: actions.drivers.gateway does, in a run's step.

A call is a run (consumer ``gateway``, action ``<upstream>/<tool>``): its pause is decided like
any other (the team's rules and grants over ``action`` and ``input``, the arguments; then
people), and its step calls the upstream once, after the approval. A host that sends a call
again, the same tool with the same arguments, before it has been given the first one's result
joins the first (within GRUNDLAG_GATEWAY_RETRY_SECONDS): a retry does not ask twice, nor run
twice."""

from __future__ import annotations

import contextlib
import json
import logging
import re
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from actions.engine import outbound, sealed
from actions.engine.decisions import cancel
from actions.engine.driving import arguments_hash
from actions.engine.errors import InvalidInput, NotAllowed, NotCancellable, check_size
from actions.engine.policies import role_refusal
from actions.engine.schemas import REFUSED, check_answer_schema, field_error
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
# Each upstream is a server the site calls for the team: a cap, as for webhooks.
MAX_UPSTREAMS_PER_TEAM = 20
MAX_HEADER_BYTES = 8192
# RFC 9110's token: what a header's name may be.
_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,100}$")
# RFC 9110's field-value, in ASCII: visible characters, spaces and tabs (no control character).
_HEADER_VALUE = re.compile(r"^[\t\x20-\x7e]*$")
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
        if not _HEADER_VALUE.match(value):
            raise InvalidInput(
                f"the value of {name} has a line break or another control character",
                [field_error("headers", f"{name}: no control characters")],
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
    if McpUpstream.objects.filter(team=team).count() >= MAX_UPSTREAMS_PER_TEAM:
        raise InvalidInput(
            f"a team has at most {MAX_UPSTREAMS_PER_TEAM} MCP upstreams; remove one first",
            [field_error("name", "too many upstreams")],
        )
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
    """Remove an upstream: its tools are served no more, and its calls still waiting for a
    decision are cancelled (they leave the inbox; their hosts' tasks end cancelled). The calls
    made through it stay in the history. An approved call whose step starts after this fails
    ("removed"); one whose step is already calling the server is not stopped."""
    _may_manage(by, upstream.team)
    with transaction.atomic():
        waiting = Run.objects.filter(
            gateway_call__upstream=upstream, status__in=[Run.Status.QUEUED, Run.Status.INTERRUPTED]
        ).values_list("pk", flat=True)
        for run in Run.objects.filter(pk__in=list(waiting)):
            # By the engine: removing the upstream is the admin's decision, whoever the calls
            # are assigned to (the log says who removed it). One that a worker took up, or that
            # finished, since it was read is past cancelling: its step finds the upstream gone.
            with contextlib.suppress(NotCancellable):
                cancel(run, None)
        upstream.delete()
    logger.info("MCP upstream %s removed by %s", upstream, actor_name(by))


def set_policy(upstream: McpUpstream, tool: str, policy: str, *, by: Actor) -> None:
    """The policy of one tool (``tool`` "": the default for every tool not set)."""
    _may_manage(by, upstream.team)
    if policy not in Policy.values:
        raise InvalidInput(
            f"policy must be one of {', '.join(Policy.values)}", [field_error("policy", "unknown")]
        )
    with transaction.atomic():
        # Locked: two admins setting two tools' policies at once both keep theirs.
        locked = McpUpstream.objects.select_for_update().get(pk=upstream.pk)
        if tool:
            locked.tool_policies = {**locked.tool_policies, tool: policy}
        else:
            locked.default_policy = policy
        locked.save(update_fields=["tool_policies", "default_policy"])
    upstream.tool_policies, upstream.default_policy = locked.tool_policies, locked.default_policy
    logger.info(
        "MCP upstream %s: %s set to %s by %s", upstream, tool or "the default", policy, actor_name(by)
    )


def clear_policy(upstream: McpUpstream, tool: str, *, by: Actor) -> None:
    """The tool follows the upstream's default policy again."""
    _may_manage(by, upstream.team)
    with transaction.atomic():
        locked = McpUpstream.objects.select_for_update().get(pk=upstream.pk)
        locked.tool_policies = {name: policy for name, policy in locked.tool_policies.items() if name != tool}
        locked.save(update_fields=["tool_policies"])
    upstream.tool_policies = locked.tool_policies
    logger.info("MCP upstream %s: %s follows the default, set by %s", upstream, tool, actor_name(by))


def headers_of(upstream: McpUpstream) -> dict[str, str]:
    return json.loads(sealed.unseal(upstream.headers_sealed)) if upstream.headers_sealed else {}


def record_tools(upstream_id: int, tools: list[dict[str, Any]] | None, error: str = "") -> None:
    """What an upstream's tools/list said (None, with ``error``: it could not be asked). A
    failure keeps what it said before for GRUNDLAG_GATEWAY_TOOLS_SECONDS, if it ever said
    anything; one that never listed its tools is asked again at the next request."""
    found = McpUpstream.objects.filter(pk=upstream_id)
    if tools is not None:
        found.update(tools=tools, tools_fetched_at=timezone.now(), tools_error="")
    else:
        found.update(tools_error=error[:500])
        found.exclude(tools=[]).update(tools_fetched_at=timezone.now())


def tools_changed(upstream_id: int) -> None:
    """The upstream said its list changed: it is asked again at the next tools/list."""
    McpUpstream.objects.filter(pk=upstream_id).update(tools_fetched_at=None)


# Keywords whose value maps names (of properties, of definitions) to subschemas: the names are
# the tool's, not keywords, and stay.
_NAMED = {"properties", "dependentSchemas", "$defs", "definitions"}


def _without(node: Any, keywords: set[str]) -> Any:
    if isinstance(node, dict):
        return {
            key: (
                {name: _without(each, keywords) for name, each in value.items()}
                if key in _NAMED and isinstance(value, dict)
                else _without(value, keywords)
            )
            for key, value in node.items()
            if key not in keywords
        }
    if isinstance(node, list):
        return [_without(each, keywords) for each in node]
    return node


def editable_schema(schema: Any) -> dict[str, Any]:
    """What a reviewer's edit of a tool's arguments is checked against, and its form made from:
    the tool's input schema, held to what the site takes of any schema from outside
    (actions.engine.schemas: no regular expressions, no references, bounded), with what it
    refuses left out; a schema that is still refused checks only that the arguments are an
    object."""
    if not isinstance(schema, dict):
        return {"type": "object"}
    for candidate in (schema, _without(schema, set(REFUSED))):
        try:
            check_answer_schema(candidate)
        except InvalidInput:
            continue
        return dict(candidate)
    return {"type": "object"}


def for_token(token: ApiToken, name: str) -> McpUpstream | None:
    return McpUpstream.objects.filter(team_id=token.team_id, name=name).select_related("team").first()


def start_call(
    token: ApiToken, upstream: McpUpstream, tool: str, arguments: dict[str, Any]
) -> tuple[Run, bool]:
    """The run of a call to ``tool`` with ``arguments``, and whether it is an earlier one's: the
    same token's same call whose result it has not been given yet, still waiting or made less
    than GRUNDLAG_GATEWAY_RETRY_SECONDS ago (a retry joins it). Else a new run, whose step asks
    (or not) as the tool's policy says. InvalidInput: arguments too large."""
    check_size("the arguments", arguments)
    digest = arguments_hash(arguments)
    policy = upstream.policy_for(tool)
    with transaction.atomic():
        # One call at a time per upstream makes "join or start" one decision (SQLite's writes
        # are one at a time anyway).
        McpUpstream.objects.select_for_update().filter(pk=upstream.pk).first()
        since = timezone.now() - timedelta(seconds=settings.GRUNDLAG_GATEWAY_RETRY_SECONDS)
        earlier = (
            GatewayCall.objects.filter(
                token=token, upstream=upstream, tool=tool, arguments_sha256=digest, delivered=False
            )
            # A call still waiting is joined however long its decision takes; a finished one,
            # whose result the host never asked for, only within the window.
            .filter(Q(created_at__gte=since) | ~Q(run__status__in=Run.FINISHED))
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
                "input_schema": editable_schema(described.get("inputSchema")),
                "description": (described.get("description") or "")[:500],
            },
        )
        GatewayCall.objects.create(
            run=run, upstream=upstream, token=token, tool=tool, arguments_sha256=digest
        )
    return run, False


def delivered(run_id: int, token: ApiToken) -> None:
    """The host that made the call (its token) has been given its final result: the same call
    again is a new call. Another token of the team reading the task changes nothing."""
    GatewayCall.objects.filter(run_id=run_id, token=token, delivered=False).update(delivered=True)


def claim_call(run_id: int) -> bool:
    """Whether this step may call the upstream: the first to ask, once, ever (a conditional
    UPDATE: a step run again after its worker was lost mid-call gets False)."""
    return bool(GatewayCall.objects.filter(run_id=run_id, called_at=None).update(called_at=timezone.now()))
