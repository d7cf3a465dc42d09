// An agent host on the official TypeScript MCP SDK: connects to /mcp/ with a team's token, lists
// the tools, calls one as a task (2025-11-25 tasks) and prints each message the SDK's stream
// yields, one JSON line each: taskCreated, taskStatus..., then result or error.
//   node mcp_task.mjs URL TOKEN TOOL 'ARGUMENTS_JSON'
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, token, tool, args] = process.argv.slice(2);
const say = (value) => process.stdout.write(JSON.stringify(value) + "\n");

const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
const client = new Client({ name: "grundlag-conformance", version: "1.0.0" });
await client.connect(transport);
const { tools } = await client.listTools();
say({ type: "tools", tools: tools.map((t) => ({ name: t.name, taskSupport: t.execution?.taskSupport })) });
const stream = client.experimental.tasks.callToolStream(
  { name: tool, arguments: JSON.parse(args) },
  undefined,
  { task: { ttl: 600000 }, timeout: 300000 },
);
for await (const message of stream) {
  say(message);
}
await client.close();
