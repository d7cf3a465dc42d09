// The TypeScript client against `make run`'s server, with node's own test runner.
// tests/integration/test_typescript_client.py starts the server, gives the URL and a token of
// its team, and has a reviewer decide on the dashboard, as a person does: "Deploy billing 2.3?"
// approved with the window "tonight", "Rotate the signing key?" rejected ("not this week").
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  ApiError,
  Grundlag,
  OPERATIONS,
  Rejected,
  SCHEMAS,
  TimedOut,
  canonicalJson,
  fetchJwks,
  InvalidReceipt,
  verifyReceipt,
  verifyWebhook,
  WebhookVerificationError,
} from "../dist/index.js";

const baseUrl = process.env.GRUNDLAG_URL;
const asker = new Grundlag({ baseUrl, token: process.env.GRUNDLAG_TOKEN });

async function pendingWith(message) {
  for await (const it of asker.interrupts({ status: "pending" })) if (it.message === message) return it;
  throw new Error(`"${message}" is not in the inbox`);
}

const SCHEMA = {
  type: "object",
  properties: { window: { type: "string", enum: ["tonight", "weekend"] } },
  required: ["window"],
};

test("requestApproval resolves with the answer the reviewer gave", async () => {
  const answer = await asker.requestApproval(
    { message: "Deploy billing 2.3?", data: { service: "billing" }, answerSchema: SCHEMA },
    { timeoutSeconds: 60 },
  );
  assert.deepEqual(answer, { window: "tonight" });
});

test("an approval's receipt verifies offline, for its own question and once", async () => {
  const asked = { message: "Deploy billing 2.4?", data: { service: "billing", replicas: 3.0 }, answerSchema: SCHEMA };
  const created = await asker.createApproval(asked);
  const approval = await asker.waitForApproval(created.id, { timeoutSeconds: 60 });
  assert.equal(approval.status, "approved");
  const jwks = await fetchJwks(baseUrl);
  // An approval's arguments are its question, as the server recorded it.
  const question = { message: asked.message, data: asked.data, answer_schema: SCHEMA };
  const seen = new Set();
  const team = "demo";
  await assert.rejects(verifyReceipt(approval.receipt, jwks, question), TypeError);  // for whom?
  const receipt = await verifyReceipt(approval.receipt, jwks, question, { team, action: "approval", seen });
  assert.deepEqual(receipt.answer, { window: "weekend" });
  assert.equal(receipt.approved_by[0].name, "reviewer1");
  assert.equal(receipt.interrupt, approval.interrupt_id);
  const refused = async (args, options, why) =>
    await assert.rejects(verifyReceipt(approval.receipt, jwks, args, options), (error) => {
      assert.ok(error instanceof InvalidReceipt, String(error));
      assert.match(error.message, why);
      return true;
    });
  await refused(question, { team, seen }, /used already/);
  await refused({ ...question, data: { service: "billing", replicas: 30 } }, { team }, /other arguments/);
  await refused(question, { team, action: "transfer_funds" }, /approves action/);
  await refused(question, { team: "payroll" }, /approves team/);
  await refused(question, { audience: "https://payments.example.com/mcp" }, /approves audience/);
  await refused(question, { team, now: new Date(Date.now() + 2 * 3600 * 1000) }, /expired/);
  const [head, body, signature] = approval.receipt.split(".");
  const forged = `${head}.${body}.${signature.slice(0, -4)}${signature.slice(-4) === "AAAA" ? "BBBB" : "AAAA"}`;
  await assert.rejects(verifyReceipt(forged, jwks, question, { team }), InvalidReceipt);
});

test("canonicalJson writes RFC 8785's form, as the server hashes it", () => {
  assert.equal(
    canonicalJson({ b: [1, 2.0, 1e-7, 1e21, 0.1, -0, "é\n"], a: null, é: true }),
    '{"a":null,"b":[1,2,1e-7,1e+21,0.1,0,"é\\n"],"é":true}',
  );
});

test("a rejection rejects with Rejected and the reviewer's reason", async () => {
  const asked = asker.requestApproval({ message: "Rotate the signing key?" }, { timeoutSeconds: 60 });
  await assert.rejects(asked, (error) => {
    assert.ok(error instanceof Rejected);
    assert.equal(error.status, "rejected");
    assert.equal(error.reason, "not this week");
    return true;
  });
});

test("TimedOut leaves it pending, or cancels it when asked to", async () => {
  await assert.rejects(
    asker.requestApproval({ message: "Wait for me?" }, { timeoutSeconds: 1 }),
    (error) => error instanceof TimedOut,
  );
  const left = await pendingWith("Wait for me?");
  assert.equal((await asker.getApproval(left.run_id)).status, "pending");
  let cancelledId;
  await assert.rejects(
    asker.requestApproval({ message: "Cancel me?" }, { timeoutSeconds: 1, cancelOnTimeout: true }),
    (error) => {
      cancelledId = error.approvalId;
      return error instanceof TimedOut;
    },
  );
  assert.equal((await asker.getApproval(cancelledId)).status, "cancelled");
});

test("a retry with the same Idempotency-Key is answered with the first approval", async () => {
  const key = `ts-${Date.now()}`;
  const first = await asker.createApproval({ message: "Once only?" }, { idempotencyKey: key });
  const again = await asker.createApproval({ message: "Once only?" }, { idempotencyKey: key });
  assert.equal(again.id, first.id);
  await assert.rejects(
    asker.createApproval({ message: "Something else?" }, { idempotencyKey: key }),
    (error) => error instanceof ApiError && error.status === 422,
  );
});

test("runs are started, answered and listed over every page", async () => {
  const run = await asker.startRun("send_invoice", { invoice_id: "TS-1", amount: 1 }, { wait: 20 });
  assert.equal(run.status, "interrupted");
  const done = await asker.resume(run.interrupt.id, { approved: true }, { wait: 20 });
  assert.equal(done.status, "completed");
  const ids = [];
  for await (const each of asker.runs({ limit: 2 })) ids.push(each.id);
  assert.ok(ids.includes(run.id));
  assert.equal(new Set(ids).size, ids.length, "no run listed twice across pages");
});

test("a bad request is refused with the API's detail", async () => {
  await assert.rejects(
    asker.createApproval({ message: "" }),
    (error) => error instanceof ApiError && error.status === 422 && Boolean(error.detail),
  );
});

test("every type and operation agrees with the server's OpenAPI document", async () => {
  const document = await (await fetch(`${baseUrl}/api/openapi.json`)).json();
  for (const [name, { schema, fields }] of Object.entries(SCHEMAS)) {
    const declared = Object.keys(document.components.schemas[schema]?.properties ?? {});
    assert.deepEqual([...fields].sort(), declared.sort(), `${name} (${schema})`);
  }
  for (const [name, [method, path, schema]] of Object.entries(OPERATIONS)) {
    const operation = document.paths[path]?.[method];
    assert.ok(operation, `${name}: ${method.toUpperCase()} ${path} is not in the API`);
    const ok = operation.responses["200"].content["application/json"].schema.$ref;
    assert.equal(ok.split("/").pop(), schema, name);
  }
});

// Standard Webhooks' own test vector (https://github.com/standard-webhooks/standard-webhooks).
const VECTOR = {
  secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
  headers: {
    "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
    "webhook-timestamp": "1614265330",
    "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
  },
  body: '{"test": 2432232314}',
  at: new Date(1614265330 * 1000),
};

test("verifyWebhook accepts Standard Webhooks' test vector and nothing changed in it", async () => {
  assert.deepEqual(await verifyWebhook(VECTOR.secret, VECTOR.headers, VECTOR.body, VECTOR.at), {
    test: 2432232314,
  });
  const refused = (error) => error instanceof WebhookVerificationError;
  await assert.rejects(verifyWebhook(VECTOR.secret, VECTOR.headers, '{"test": 2432232315}', VECTOR.at), refused);
  const later = new Date(VECTOR.at.getTime() + 10 * 60 * 1000);
  await assert.rejects(verifyWebhook(VECTOR.secret, VECTOR.headers, VECTOR.body, later), refused);
  const forged = { ...VECTOR.headers, "webhook-id": "msg_other" };
  await assert.rejects(verifyWebhook(VECTOR.secret, forged, VECTOR.body, VECTOR.at), refused);
  const titled = Object.fromEntries(Object.entries(VECTOR.headers).map(([k, v]) => [k.replace(/^w/, "W"), v]));
  assert.deepEqual(await verifyWebhook(VECTOR.secret, titled, VECTOR.body, VECTOR.at), { test: 2432232314 });
  assert.deepEqual(await verifyWebhook(VECTOR.secret, new Headers(VECTOR.headers), VECTOR.body, VECTOR.at), {
    test: 2432232314,
  });
  const { "webhook-signature": _, ...unsigned } = VECTOR.headers;
  await assert.rejects(verifyWebhook(VECTOR.secret, unsigned, VECTOR.body, VECTOR.at), refused);
});
