"""The MCP endpoint: agent hosts call the team's actions as MCP tools, at /mcp/ over Streamable
HTTP, with the API's bearer token (the official ``mcp`` SDK's low-level server).

A tool call starts a run of the action (consumer ``mcp``) for the token's team. An action that
pauses waits in the team's inbox like any other; the call completes when a reviewer decides.

- Where the client takes tasks, the call returns a task at once: MCP's 2025-11-25 tasks
  (``tools/call`` with ``task``; ``tasks/get``, ``tasks/result``, ``tasks/cancel``,
  ``tasks/list``) and the 2026-07-28 tasks extension (``io.modelcontextprotocol/tasks``;
  ``tasks/get`` with the result inlined, ``tasks/cancel``). The task is the run: its id names
  the run (signed, so it cannot be guessed), and every answer about it is read from the
  database, so a task outlives the process that made it and is answered by any other.
- Otherwise the call waits for the run to finish, up to GRUNDLAG_MCP_WAIT_SECONDS, and then
  returns a result that says it is pending, with the link to it.
- A token's requests count against the API's rate of requests (GRUNDLAG_API_RATE: 429 with
  Retry-After, before the JSON-RPC is read), and its waits (a call's, tasks/result's) against
  its requests held at once (GRUNDLAG_MAX_WAITS_PER_TOKEN); tasks/result holds its answer
  GRUNDLAG_MCP_RESULT_HOLD_SECONDS at most.

Arguments are checked against the action's input schema before anything is started: a bad
call is an ``isError`` result naming the fields (so a model can correct it), and starts nothing.
The SDK keeps no state between requests here (stateless mode): any web process answers any.
"""

from __future__ import annotations

from actions.mcp.endpoint import Endpoint, mount
from actions.mcp.server import build_server

__all__ = ["Endpoint", "build_server", "mount"]
