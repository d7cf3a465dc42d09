"""The gateway consumer: a tool call an agent host makes to a team's upstream MCP server
through the gateway (/mcp/gateway/<name>/), decided before it is made.

Each call is a run (actions.engine.gateway.start_call). Its step pauses, and the pause is the
team's to decide like any other: its rules and grants read ``action``, ``<upstream>/<tool>``, and
``input``, the arguments; "always ask" lets neither approve; "never ask" is an approving rule of
the tool's own, after the team's (which may still reject, route or ask for more). No token
approves it (the host's token asked), and a reviewer may edit the arguments before approving.
Once approved, the next step calls the upstream, once: with the arguments approved, and the
approval's signed receipt in the call's ``_meta`` (``io.grundlag/receipt``), for the upstream to
check (actions.engine.receipts). The upstream's result, an error result included, is the run's
output; a call that could not be made (the upstream down, refusing, too slow) fails the run
with why.

Upstreams are spoken to with the official ``mcp`` SDK's client over Streamable HTTP, at the
address the URL was checked to resolve to (actions.engine.outbound), with the credentials
registered for them (sealed in the database), no proxy from the environment and no redirect.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, cast

import mcp_types as types
from asgiref.sync import async_to_sync, sync_to_async
from django.conf import settings

from actions.core import Approve, Rule
from actions.engine import gateway, outbound, receipts
from actions.engine.driving import Answers, Driver, Pause, StepResult, call_binding
from actions.models import Interrupt, McpUpstream, Run

logger = logging.getLogger(__name__)

RECEIPT_META = "io.grundlag/receipt"
# "never ask": approved at once, unless one of the team's rules (evaluated first) says otherwise.
NEVER_ASK = Rule("never ask (the tool's policy)", "true", Approve())
RUN_META = "io.grundlag/run"
MAX_TOOLS = 1000
MAX_TOOLS_BYTES = 1024 * 1024


class UpstreamFailed(Exception):
    """The upstream could not be asked: why, in words the team can act on."""


def _http(upstream: McpUpstream, headers: dict[str, str]) -> Any:
    """An HTTP client for the upstream (httpx2, as the SDK's transport takes), which sends every
    request to the address its host was checked to resolve to (the Host header and TLS's server
    name stay the host's). The SDK's client is loaded here, where an upstream is spoken to: the
    processes of a site that has none need not load it."""
    import httpx2  # noqa: PLC0415

    problem, addresses = outbound.resolve(upstream.url)
    if problem:
        raise UpstreamFailed(f"refused: {problem}")

    class Pinned(httpx2.AsyncHTTPTransport):
        async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
            url, _, extensions = outbound.pinned(str(request.url), addresses[0])
            request.url = httpx2.URL(url)
            request.extensions = {**request.extensions, **extensions}
            return await super().handle_async_request(request)

    seconds = settings.GRUNDLAG_GATEWAY_CALL_SECONDS
    return httpx2.AsyncClient(
        headers=headers,
        timeout=httpx2.Timeout(seconds),
        transport=Pinned(),
        follow_redirects=False,
        trust_env=False,
    )


class _Listener:
    """Notes an upstream's ``notifications/tools/list_changed`` heard during an exchange."""

    def __init__(self) -> None:
        self.tools_changed = False

    async def __call__(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self.tools_changed = True


async def _exchange(upstream: McpUpstream, ask: Any) -> Any:
    from mcp import Client  # noqa: PLC0415 - loaded where an upstream is spoken to (_http says why)
    from mcp.client.streamable_http import streamable_http_client  # noqa: PLC0415

    listener = _Listener()
    headers = gateway.headers_of(upstream)
    try:
        async with (
            asyncio.timeout(settings.GRUNDLAG_GATEWAY_CALL_SECONDS),
            _http(upstream, headers) as http,
            Client(
                streamable_http_client(upstream.url, http_client=http),
                message_handler=listener,
                cache=None,
                read_timeout_seconds=settings.GRUNDLAG_GATEWAY_CALL_SECONDS,
            ) as client,
        ):
            answer = await ask(client)
    except UpstreamFailed:
        raise
    except TimeoutError:
        raise UpstreamFailed(f"no answer within {settings.GRUNDLAG_GATEWAY_CALL_SECONDS:g} s") from None
    except Exception as exc:  # noqa: BLE001 - whatever stopped the exchange, said to the team
        why = _redacted(_why(exc), headers)
        logger.info("MCP upstream %s failed: %s", upstream, why)
        raise UpstreamFailed(why) from None
    if listener.tools_changed:
        await sync_to_async(gateway.tools_changed)(upstream.pk)
    return answer


def _redacted(text: str, headers: dict[str, str]) -> str:
    """``text`` without the upstream's credentials (an HTTP library's error may quote a header)."""
    for value in headers.values():
        if len(value) >= 4:
            text = text.replace(value, "[redacted]")
    return text


def _why(exc: BaseException) -> str:
    inner = exc
    while isinstance(inner, BaseExceptionGroup) and inner.exceptions:
        inner = inner.exceptions[0]
    return f"{type(inner).__name__}: {inner}"[:500]


async def list_tools(upstream: McpUpstream) -> list[dict[str, Any]]:
    """The upstream's tools, every page (at most MAX_TOOLS), as its tools/list says them."""

    async def ask(client: Any) -> list[dict[str, Any]]:
        tools: list[dict[str, Any]] = []
        cursor = None
        while True:
            page = await client.list_tools(cursor=cursor)
            tools += [tool.model_dump(by_alias=True, mode="json", exclude_none=True) for tool in page.tools]
            cursor = page.next_cursor
            if not cursor or not page.tools or len(tools) >= MAX_TOOLS:
                return tools[:MAX_TOOLS]

    tools: list[dict[str, Any]] = await _exchange(upstream, ask)
    if len(json.dumps(tools)) > MAX_TOOLS_BYTES:
        raise UpstreamFailed(f"its tools/list is over {MAX_TOOLS_BYTES // 1024} KiB")
    return tools


def refresh_tools(upstream: McpUpstream) -> list[dict[str, Any]]:
    """Ask the upstream for its tools now, and keep what it said (or why it could not say).
    Raises UpstreamFailed."""
    try:
        tools: list[dict[str, Any]] = async_to_sync(list_tools)(upstream)
    except UpstreamFailed as exc:
        gateway.record_tools(upstream.pk, None, str(exc))
        raise
    gateway.record_tools(upstream.pk, tools)
    upstream.tools = tools
    return tools


async def call_tool(
    upstream: McpUpstream, tool: str, arguments: dict[str, Any], meta: dict[str, Any]
) -> dict[str, Any]:
    """The upstream's result of the call (an error result is a result)."""

    async def ask(client: Any) -> dict[str, Any]:
        result: types.CallToolResult = await client.call_tool(
            tool, arguments, meta=cast(types.RequestParamsMeta, meta)
        )
        return result.model_dump(by_alias=True, mode="json", exclude_none=True)

    output: dict[str, Any] = await _exchange(upstream, ask)
    return output


def binding(run: Run) -> dict[str, Any]:
    """The call a gateway run's pause is for: its tool and the arguments the host sent."""
    return call_binding(run.action, run.driver_state.get("arguments"), turn=0, position=0)


class GatewayDriver(Driver):
    def step(self, run: Run, answers: Answers) -> StepResult:
        state = run.driver_state
        bound = binding(run)
        answer = answers.for_call(bound)
        if answer is None:
            return StepResult(Run.Status.INTERRUPTED, pauses=[self.pause(run, bound)])
        arguments = state.get("arguments") or {}
        if answer is not None and answer.arguments is not None:
            arguments = answer.arguments
        upstream = McpUpstream.objects.filter(pk=state.get("upstream")).select_related("team").first()
        if upstream is None:
            return StepResult(
                Run.Status.FAILED, error="the MCP upstream was removed before the call was made"
            )
        meta: dict[str, Any] = {RUN_META: run.pk}
        approved = (
            Interrupt.objects.filter(run_id=run.pk, status=Interrupt.Status.APPROVED).order_by("-seq").first()
        )
        if approved is not None:
            meta[RECEIPT_META] = receipts.receipt_for(approved, run)
        if not gateway.claim_call(run.pk):
            return StepResult(
                Run.Status.FAILED,
                error=(
                    f"the call to {upstream.name} was begun before and its outcome was not recorded"
                    " (the worker stopped during it): it is not made twice; ask the upstream what it did"
                ),
            )
        try:
            result = async_to_sync(call_tool)(upstream, state["tool"], arguments, meta)
        except UpstreamFailed as exc:
            return StepResult(
                Run.Status.FAILED, error=f"the MCP upstream {upstream.name} could not be called: {exc}"
            )
        if len(json.dumps(result)) > settings.GRUNDLAG_MAX_PAYLOAD_BYTES:
            # It ran: what it said is too large to keep, and saying so is the result.
            said = (
                f"{state['tool']} ran on {upstream.name}; its result was over the site's limit of"
                f" {settings.GRUNDLAG_MAX_PAYLOAD_BYTES} bytes and is not kept."
            )
            result = {"content": [{"type": "text", "text": said}], "isError": True}
        return StepResult(Run.Status.COMPLETED, output=result)

    def pause(self, run: Run, bound: dict[str, Any]) -> Pause:
        state = run.driver_state
        upstream_name, _, tool = run.action.partition("/")
        # The host's token asked: no token approves it, whatever its scopes (a person does, or
        # a rule or a grant where the tool's policy lets them).
        policy: dict[str, Any] = {"requester_may_approve": False}
        if not self.approves_automatically(run):
            policy["auto_approve"] = False
        elif state.get("policy") == McpUpstream.Policy.NEVER:
            # The tool's own rule, after the team's: a team rule that rejects, routes or asks for
            # more approvals comes first; else this approves it at once.
            policy["rules"] = (NEVER_ASK,)
        return Pause(
            f"Call {tool} on {upstream_name}",
            {
                "upstream": upstream_name,
                "tool": tool,
                "description": state.get("description") or "",
                "arguments": state.get("arguments"),
            },
            None,
            action=run.action,
            binding=bound,
            arguments=state.get("arguments"),
            policy=policy,
        )

    def approves_automatically(self, run: Run) -> bool:
        return bool(run.driver_state.get("policy") != McpUpstream.Policy.ASK)

    def proposed_arguments(self, run: Run, bound: dict[str, Any]) -> Any:
        return run.driver_state.get("arguments") if bound == binding(run) else None

    def arguments_schema(self, run: Run) -> dict[str, Any] | None:
        schema = run.driver_state.get("input_schema")
        return schema if isinstance(schema, dict) else {"type": "object"}
