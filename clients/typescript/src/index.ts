/**
 * A typed client for the Grundlag approvals API (the API of one team, as its token sees it),
 * on the platform's own `fetch` and Web Crypto: no other dependency. Node 18+, Deno, Bun and
 * browsers.
 *
 * Every POST carries an Idempotency-Key and is retried with it when its answer is lost (a
 * network error, 502/503/504, or "still being answered"), so the server makes its change once.
 * Waiting is the server's `Prefer: wait`, not a busy loop; a 429's `Retry-After` is waited out.
 */

export const MAX_WAIT_SECONDS = 30;
// How long a retry waits out "still being answered" (409 with Retry-After) for the first
// attempt, as the Python client does; and how long one attempt may take beyond its wait.
const IN_USE_PATIENCE_SECONDS = 120;
const ATTEMPT_MARGIN_SECONDS = 30;
const RETRIED = new Set([429, 502, 503, 504]);

/** What deciding an interrupt requires (its decision contract, settled when it was made). */
export interface Requires {
  team: string;
  approvals: number;
  assignees: string[];
  requester_may_approve: boolean;
  deadline: string | null;
  at_deadline: string | null;
  escalate_to: string | null;
  escalate_at: string | null;
}

/** A pause a run waits on. */
export interface Interrupt {
  id: number;
  seq: number;
  message: string;
  data: unknown;
  resume_url: string;
  reject_url: string;
  tool_call_id: string;
  requires: Requires | null;
}

export interface Run {
  id: number;
  action: string;
  consumer: string;
  status: string; // queued, running, interrupted, completed, failed, cancelled
  output: unknown;
  error: string;
  interrupt: Interrupt | null;
}

/** A question asked of the team (POST /api/approvals) and, once decided, its answer. */
export interface Approval {
  id: number;
  status: string; // pending, approved, rejected, expired, cancelled, failed
  message: string;
  data: unknown;
  answer: unknown;
  reason: string;
  decided_by: string | null;
  decided_via: string;
  decided_at: string | null;
  created_at: string;
  expires_at: string | null;
  approvals_required: number;
  assignees: string[];
  answer_schema: Record<string, unknown> | null;
  url: string;
  interrupt_id: number | null;
  /** Once approved: the decision as a signed receipt (check it with verifyReceipt). */
  receipt: string | null;
}

export interface RunSummary {
  id: number;
  action: string;
  consumer: string;
  status: string;
  output: unknown;
  error: string;
  started_by: string;
  created_at: string;
  finished_at: string | null;
}

export interface InterruptSummary {
  id: number;
  run_id: number;
  seq: number;
  action: string;
  message: string;
  data: unknown;
  status: string;
  created_at: string;
  decided_by: string | null;
  decided_at: string | null;
  requires: Requires | null;
}

/**
 * The OpenAPI schema each type reads, with the fields it declares: the client's tests check
 * them against the server's `/api/openapi.json`.
 */
export const SCHEMAS: Record<string, { schema: string; fields: string[] }> = {
  Requires: {
    schema: "Requires",
    fields: [
      "team",
      "approvals",
      "assignees",
      "requester_may_approve",
      "deadline",
      "at_deadline",
      "escalate_to",
      "escalate_at",
    ],
  },
  Interrupt: {
    schema: "InterruptOut",
    fields: ["id", "seq", "message", "data", "resume_url", "reject_url", "tool_call_id", "requires"],
  },
  Run: { schema: "RunOut", fields: ["id", "action", "consumer", "status", "output", "error", "interrupt"] },
  Approval: {
    schema: "ApprovalRequestOut",
    fields: [
      "id",
      "status",
      "message",
      "data",
      "answer",
      "reason",
      "decided_by",
      "decided_via",
      "decided_at",
      "created_at",
      "expires_at",
      "approvals_required",
      "assignees",
      "answer_schema",
      "url",
      "interrupt_id",
      "receipt",
    ],
  },
  RunSummary: {
    schema: "RunListItem",
    fields: ["id", "action", "consumer", "status", "output", "error", "started_by", "created_at", "finished_at"],
  },
  InterruptSummary: {
    schema: "InterruptListItem",
    fields: [
      "id",
      "run_id",
      "seq",
      "action",
      "message",
      "data",
      "status",
      "created_at",
      "decided_by",
      "decided_at",
      "requires",
    ],
  },
};

/** The operations the client calls: method, path and the schema of the answer it reads. */
export const OPERATIONS: Record<string, [string, string, string]> = {
  startRun: ["post", "/api/runs", "RunOut"],
  getRun: ["get", "/api/runs/{run_id}", "RunDetailOut"],
  cancelRun: ["post", "/api/runs/{run_id}/cancel", "RunOut"],
  runs: ["get", "/api/runs", "RunPage"],
  interrupts: ["get", "/api/interrupts", "InterruptPage"],
  resume: ["post", "/api/interrupts/{interrupt_id}/resume", "RunOut"],
  reject: ["post", "/api/interrupts/{interrupt_id}/reject", "RunOut"],
  createApproval: ["post", "/api/approvals", "ApprovalRequestOut"],
  getApproval: ["get", "/api/approvals/{approval_id}", "ApprovalRequestOut"],
  cancelApproval: ["post", "/api/approvals/{approval_id}/cancel", "ApprovalRequestOut"],
};

/** An answer the API refused: its status and `detail` (and the whole body). */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly detail: unknown,
    readonly body: Record<string, unknown>,
  ) {
    super(`${status}: ${typeof detail === "string" ? detail : JSON.stringify(detail)}`);
    this.name = "ApiError";
  }
}

/** The approval was not approved: rejected (with the reviewer's reason), expired, cancelled or failed. */
export class Rejected extends Error {
  constructor(
    readonly reason: string,
    readonly status: string,
    readonly approval: Approval,
  ) {
    super(reason || status);
    this.name = "Rejected";
  }
}

/** No decision within the caller's time; the approval stays pending (unless cancelled). */
export class TimedOut extends Error {
  constructor(readonly approvalId: number) {
    super(`approval ${approvalId} was not decided in time`);
    this.name = "TimedOut";
  }
}

export interface ApprovalRequest {
  message: string;
  data?: unknown;
  /** A JSON Schema of "type": "object" the answer must fit; the dashboard renders it as a form. */
  answerSchema?: Record<string, unknown>;
  deadlineSeconds?: number;
  defaultAnswer?: unknown;
  approvalsRequired?: number;
  assignees?: string[];
}

export interface Options {
  baseUrl: string;
  token: string;
  /** Attempts per request when its answer is lost (default 4). */
  attempts?: number;
  /** The fetch to use (default: the platform's). */
  fetch?: typeof fetch;
}

interface Call {
  body?: unknown;
  wait?: number;
  key?: string;
  params?: Record<string, string | number | undefined>;
}

export class Grundlag {
  private readonly baseUrl: string;
  private readonly token: string;
  private readonly attempts: number;
  private readonly fetch: typeof fetch;

  constructor(options: Options) {
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.token = options.token;
    this.attempts = options.attempts ?? 4;
    this.fetch = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  // Approvals

  /** Ask the team; resolves at once (or after `wait` seconds, at most 30) with its state. */
  async createApproval(request: ApprovalRequest, options: { wait?: number; idempotencyKey?: string } = {}) {
    const body: Record<string, unknown> = { message: request.message, data: request.data ?? null };
    const optional: Record<string, unknown> = {
      answer_schema: request.answerSchema,
      deadline_seconds: request.deadlineSeconds,
      default_answer: request.defaultAnswer,
      approvals_required: request.approvalsRequired,
    };
    for (const [name, value] of Object.entries(optional)) if (value !== undefined) body[name] = value;
    if (request.assignees?.length) body.assignees = request.assignees;
    return await this.post<Approval>("/api/approvals", body, options, "/api/approvals/{}");
  }

  /** The approval; `wait` seconds (at most 30) for a decision while it is pending. */
  async getApproval(approvalId: number, options: { wait?: number } = {}): Promise<Approval> {
    return await this.request<Approval>("GET", `/api/approvals/${approvalId}`, { wait: options.wait });
  }

  async cancelApproval(approvalId: number, options: { idempotencyKey?: string } = {}): Promise<Approval> {
    const path = `/api/approvals/${approvalId}/cancel`;
    return await this.post<Approval>(path, {}, options, "/api/approvals/{}");
  }

  /** Hold until the approval is decided; rejects with TimedOut after `timeoutSeconds`. */
  async waitForApproval(approvalId: number, options: { timeoutSeconds?: number } = {}): Promise<Approval> {
    const deadline = deadlineOf(options.timeoutSeconds);
    for (;;) {
      const approval = await this.getApproval(approvalId, { wait: left(deadline) });
      if (approval.status !== "pending") return approval;
      if (deadline !== null && Date.now() >= deadline) throw new TimedOut(approvalId);
    }
  }

  /**
   * Ask the team and wait until it decides: resolves with the answer when approved; rejects
   * with Rejected (the reason) when rejected, expired, cancelled or failed, or TimedOut after
   * `timeoutSeconds` (the approval stays pending unless `cancelOnTimeout`).
   */
  async requestApproval(
    request: ApprovalRequest,
    options: { timeoutSeconds?: number; cancelOnTimeout?: boolean; idempotencyKey?: string } = {},
  ): Promise<unknown> {
    const deadline = deadlineOf(options.timeoutSeconds);
    let approval = await this.createApproval(request, {
      wait: left(deadline),
      idempotencyKey: options.idempotencyKey,
    });
    try {
      if (approval.status === "pending") {
        const remaining = deadline === null ? undefined : Math.max(0, (deadline - Date.now()) / 1000);
        approval = await this.waitForApproval(approval.id, { timeoutSeconds: remaining });
      }
    } catch (error) {
      if (!(error instanceof TimedOut && options.cancelOnTimeout)) throw error;
      try {
        await this.cancelApproval(approval.id);
        throw error;
      } catch (refused) {
        // Decided just before the cancel (409): the decision stands, and is the answer.
        if (!(refused instanceof ApiError && refused.status === 409)) throw refused;
        approval = await this.getApproval(approval.id);
        if (approval.status === "pending") throw error;
      }
    }
    if (approval.status !== "approved") throw new Rejected(approval.reason, approval.status, approval);
    return approval.answer;
  }

  // Runs and interrupts

  async startRun(
    action: string,
    input: unknown,
    options: { consumer?: string; wait?: number; idempotencyKey?: string } = {},
  ): Promise<Run> {
    const body: Record<string, unknown> = { action, input };
    if (options.consumer) body.consumer = options.consumer;
    return await this.post<Run>("/api/runs", body, options);
  }

  async getRun(runId: number, options: { wait?: number } = {}): Promise<Run> {
    return await this.request<Run>("GET", `/api/runs/${runId}`, { wait: options.wait });
  }

  async cancelRun(runId: number, options: { idempotencyKey?: string } = {}): Promise<Run> {
    return await this.post<Run>(`/api/runs/${runId}/cancel`, {}, options);
  }

  async resume(
    interruptId: number,
    data: unknown,
    options: { wait?: number; idempotencyKey?: string } = {},
  ): Promise<Run> {
    return await this.post<Run>(`/api/interrupts/${interruptId}/resume`, { data }, options);
  }

  async reject(
    interruptId: number,
    reason: string,
    options: { wait?: number; idempotencyKey?: string } = {},
  ): Promise<Run> {
    return await this.post<Run>(`/api/interrupts/${interruptId}/reject`, { reason }, options);
  }

  /** The team's runs, newest first, every page: `for await (const run of client.runs())`. */
  runs(filters: Record<string, string | number | undefined> = {}): AsyncIterable<RunSummary> {
    return this.pages("/api/runs", filters) as AsyncIterable<RunSummary>;
  }

  /** The team's interrupts (`{ status: "pending" }`: the open questions), every page. */
  interrupts(filters: Record<string, string | number | undefined> = {}): AsyncIterable<InterruptSummary> {
    return this.pages("/api/interrupts", filters) as AsyncIterable<InterruptSummary>;
  }

  // HTTP

  private async post<T = Record<string, unknown>>(
    path: string,
    body: unknown,
    options: { wait?: number; idempotencyKey?: string },
    then = "/api/runs/{}",
  ): Promise<T> {
    const key = options.idempotencyKey || globalThis.crypto.randomUUID();
    try {
      return await this.request<T>("POST", path, { body, wait: options.wait, key });
    } catch (error) {
      // The first attempt's change was made and its answer lost with its server: read it.
      if (error instanceof ApiError && error.status === 409 && typeof error.body.run_id === "number") {
        return await this.request<T>("GET", then.replace("{}", String(error.body.run_id)));
      }
      throw error;
    }
  }

  private async request<T = Record<string, unknown>>(method: string, path: string, call: Call = {}): Promise<T> {
    const url = new URL(this.baseUrl + path);
    for (const [name, value] of Object.entries(call.params ?? {})) {
      if (value !== undefined && value !== "") url.searchParams.set(name, String(value));
    }
    const headers: Record<string, string> = { Authorization: `Bearer ${this.token}`, Accept: "application/json" };
    if (call.body !== undefined) headers["Content-Type"] = "application/json";
    if (call.key) headers["Idempotency-Key"] = call.key;
    if (call.wait && call.wait > 0) headers.Prefer = `wait=${Math.max(1, Math.min(Math.floor(call.wait), MAX_WAIT_SECONDS))}`;
    const body = call.body === undefined ? undefined : JSON.stringify(call.body);
    // While the first attempt is being answered (held by its wait), retries are told so.
    const patience = Date.now() + IN_USE_PATIENCE_SECONDS * 1000;
    const limit = ((call.wait ?? 0) + ATTEMPT_MARGIN_SECONDS) * 1000; // a hung connection ends
    let delay = 500;
    for (let attempt = 1; ; attempt++) {
      let response: Response;
      try {
        response = await this.fetch(url, { method, headers, body, signal: AbortSignal.timeout(limit) });
      } catch (error) {
        if (attempt >= this.attempts || (method === "POST" && !call.key)) throw error;
        await sleep(delay);
        delay = Math.min(delay * 2, 8000);
        continue;
      }
      if (response.status === 409 && response.headers.has("Retry-After") && Date.now() < patience) {
        await sleep(Math.max(1000, retryAfter(response)));
        continue;
      }
      if (!RETRIED.has(response.status) || attempt >= this.attempts) return (await bodyOf(response)) as T;
      await sleep(Math.max(delay, retryAfter(response)));
      delay = Math.min(delay * 2, 8000);
    }
  }

  private async *pages(path: string, filters: Record<string, string | number | undefined>) {
    let after = "";
    for (;;) {
      const page = await this.request("GET", path, { params: { ...filters, ...(after ? { after } : {}) } });
      yield* page.items as unknown[];
      after = String(page.next ?? "");
      if (!after) return;
    }
  }
}

async function bodyOf(response: Response): Promise<Record<string, unknown>> {
  const text = await response.text();
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    body = { detail: text };
  }
  if (typeof body !== "object" || body === null || Array.isArray(body)) body = { detail: body };
  const record = body as Record<string, unknown>;
  if (response.status >= 400) throw new ApiError(response.status, record.detail, record);
  return record;
}

function retryAfter(response: Response): number {
  const seconds = Number(response.headers.get("Retry-After") ?? "0");
  return Number.isFinite(seconds) ? Math.min(seconds, 30) * 1000 : 0;
}

function deadlineOf(timeoutSeconds: number | undefined): number | null {
  return timeoutSeconds === undefined ? null : Date.now() + timeoutSeconds * 1000;
}

/** Seconds to ask the server to wait: up to its limit, and no longer than the caller's. */
function left(deadline: number | null): number {
  if (deadline === null) return MAX_WAIT_SECONDS;
  return Math.max(0, Math.min((deadline - Date.now()) / 1000, MAX_WAIT_SECONDS));
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

// Webhooks (Standard Webhooks: https://www.standardwebhooks.com)

/** A delivery that does not verify: no signature matches, or its timestamp is too far off. */
export class WebhookVerificationError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "WebhookVerificationError";
  }
}

const TOLERANCE_SECONDS = 5 * 60;

/**
 * Check a webhook delivery as Standard Webhooks specifies: `webhook-signature` holds an
 * HMAC-SHA256 (key: the secret after `whsec_`, base64) of `${id}.${timestamp}.${body}`, and the
 * timestamp is within five minutes. Resolves with the parsed payload; rejects with
 * WebhookVerificationError. `body` is the raw request body, exactly as received.
 */
export async function verifyWebhook(
  secret: string,
  headers: Record<string, string | string[] | undefined> | Headers,
  body: string,
  now: Date = new Date(),
): Promise<unknown> {
  const header = (name: string): string => {
    const value =
      headers instanceof Headers
        ? headers.get(name)
        : Object.entries(headers).find(([key]) => key.toLowerCase() === name)?.[1];
    const one = Array.isArray(value) ? value[0] : value;
    if (!one) throw new WebhookVerificationError(`missing the ${name} header`);
    return one;
  };
  const id = header("webhook-id");
  const timestamp = header("webhook-timestamp");
  const signatures = header("webhook-signature");
  const sent = Number(timestamp);
  if (!/^\d+$/.test(timestamp) || Math.abs(now.getTime() / 1000 - sent) > TOLERANCE_SECONDS) {
    throw new WebhookVerificationError("the webhook-timestamp is too far from now");
  }
  const key = await globalThis.crypto.subtle.importKey(
    "raw",
    fromBase64(secret.startsWith("whsec_") ? secret.slice("whsec_".length) : secret),
    { name: "HMAC", hash: "SHA-256" },
    false,
    ["verify"],
  );
  const signed = new TextEncoder().encode(`${id}.${timestamp}.${body}`);
  for (const each of signatures.split(" ")) {
    const [version, signature] = each.split(",", 2);
    if (version !== "v1" || !signature) continue;
    let given: Uint8Array<ArrayBuffer>;
    try {
      given = fromBase64(signature);
    } catch {
      continue;
    }
    // Web Crypto's verify compares in constant time.
    if (await globalThis.crypto.subtle.verify("HMAC", key, given, signed)) return JSON.parse(body);
  }
  throw new WebhookVerificationError("no signature matches");
}

function fromBase64(text: string): Uint8Array<ArrayBuffer> {
  const binary = atob(text);
  const bytes = new Uint8Array(new ArrayBuffer(binary.length));
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

// Approval receipts: a decision, signed by the server (EdDSA over Ed25519, a compact JWS)

/** A receipt that does not approve this call: why. */
export class InvalidReceipt extends Error {
  constructor(message: string) {
    super(message);
    this.name = "InvalidReceipt";
  }
}

/** What a valid receipt says. */
export interface Receipt {
  id: string;
  audience: string;
  team: string;
  action: string;
  run: number;
  interrupt: number;
  arguments_sha256: string;
  answer: unknown;
  approved_by: { name: string; at: string | null }[];
  decided_via: string;
  issuer: string;
  issued_at: number;
  expires_at: number;
}

export interface Jwk {
  kty: string;
  crv?: string;
  x?: string;
  kid?: string;
  alg?: string;
  use?: string;
}

export interface VerifyReceiptOptions {
  /** Whom it must be for: your own URL, as the team registered it for the MCP gateway. */
  audience?: string;
  /** The team's slug. At least one of audience and team is required. */
  team?: string;
  action?: string;
  issuer?: string;
  /** The ids of receipts acted on already: a receipt is good for one call. Added to when valid. */
  seen?: { has(id: string): boolean; add(id: string): unknown };
  now?: Date;
  leewaySeconds?: number;
}

/**
 * The JSON Canonicalization Scheme's form (RFC 8785) of a JSON value: keys sorted by their
 * UTF-16 code units, no spaces, numbers as JSON.stringify writes them. The server hashes a
 * call's arguments in this form; so does every client.
 */
export function canonicalJson(value: unknown): string {
  if (value === null || typeof value !== "object") {
    if (typeof value === "number" && !Number.isFinite(value)) {
      throw new TypeError("NaN and infinities have no JSON form");
    }
    const text = JSON.stringify(value);
    if (text === undefined) throw new TypeError(`not a JSON value: ${typeof value}`);
    return text;
  }
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  const entries = Object.keys(value)
    .sort()
    .map((key) => `${JSON.stringify(key)}:${canonicalJson((value as Record<string, unknown>)[key])}`);
  return `{${entries.join(",")}}`;
}

/** The SHA-256 (hex) of the arguments' canonical JSON: what a receipt binds them by. */
export async function argumentsSha256(args: unknown): Promise<string> {
  const digest = await globalThis.crypto.subtle.digest("SHA-256", new TextEncoder().encode(canonicalJson(args)));
  return Array.from(new Uint8Array(digest), (byte) => byte.toString(16).padStart(2, "0")).join("");
}

/** The server's public keys (its /.well-known/jwks.json). */
export async function fetchJwks(baseUrl: string): Promise<{ keys: Jwk[] }> {
  const response = await fetch(`${baseUrl.replace(/\/+$/, "")}/.well-known/jwks.json`);
  if (!response.ok) throw new Error(`${response.status} fetching the server's keys`);
  return (await response.json()) as { keys: Jwk[] };
}

function fromBase64Url(text: string): Uint8Array<ArrayBuffer> {
  if (!/^[A-Za-z0-9_-]*$/.test(text)) throw new InvalidReceipt("not a compact JWS");
  const padded = text.replace(/-/g, "+").replace(/_/g, "/") + "=".repeat((4 - (text.length % 4)) % 4);
  return fromBase64(padded);
}

/**
 * Check offline that `receipt` approves a call with exactly `args`, for you (`audience`, your URL
 * as the team registered it, or `team`, at least one), and where given this action and issuer:
 * signed by one of `jwks`' keys, not expired, not in `seen` (then added to it). Resolves with what
 * it says; rejects with InvalidReceipt saying why not. Every team's receipts are signed with the
 * site's keys: without audience or team, one made for another team's server would pass.
 */
export async function verifyReceipt(
  receipt: string,
  jwks: { keys: Jwk[] },
  args: unknown,
  options: VerifyReceiptOptions = {},
): Promise<Receipt> {
  if (options.audience === undefined && options.team === undefined) {
    throw new TypeError("say whom the receipt must be for: audience (your URL) or team");
  }
  const parts = receipt.split(".");
  if (parts.length !== 3) throw new InvalidReceipt("not a compact JWS");
  const [headerPart, payloadPart, signaturePart] = parts as [string, string, string];
  const decode = (part: string): Record<string, unknown> => {
    try {
      return JSON.parse(new TextDecoder().decode(fromBase64Url(part))) as Record<string, unknown>;
    } catch (error) {
      if (error instanceof InvalidReceipt) throw error;
      throw new InvalidReceipt("not a compact JWS");
    }
  };
  const header = decode(headerPart);
  if (header.alg !== "Ed25519" && header.alg !== "EdDSA") {
    throw new InvalidReceipt(`not signed with Ed25519 (alg ${String(header.alg)})`);
  }
  if (header.typ !== "grundlag-receipt+jwt") throw new InvalidReceipt("not an approval receipt");
  const jwk = jwks.keys.find((key) => key.kid === header.kid && key.kty === "OKP" && key.crv === "Ed25519");
  if (!jwk?.x) {
    throw new InvalidReceipt(`not signed by the server's keys (no key ${String(header.kid)}: fetch them again)`);
  }
  const key = await globalThis.crypto.subtle.importKey(
    "jwk",
    { kty: "OKP", crv: "Ed25519", x: jwk.x },
    { name: "Ed25519" },
    false,
    ["verify"],
  );
  const signed = new TextEncoder().encode(`${headerPart}.${payloadPart}`);
  if (!(await globalThis.crypto.subtle.verify({ name: "Ed25519" }, key, fromBase64Url(signaturePart), signed))) {
    throw new InvalidReceipt("not signed by the server's keys: the signature does not match");
  }
  const claims = decode(payloadPart);
  const said: Receipt = {
    id: String(claims.jti),
    audience: String(claims.aud),
    team: String(claims.team),
    action: String(claims.action),
    run: Number(claims.run),
    interrupt: Number(claims.interrupt),
    arguments_sha256: String(claims.arguments_sha256),
    answer: claims.answer,
    approved_by: claims.approved_by as Receipt["approved_by"],
    decided_via: String(claims.decided_via ?? ""),
    issuer: String(claims.iss),
    issued_at: Number(claims.iat),
    expires_at: Number(claims.exp),
  };
  const now = (options.now ?? new Date()).getTime() / 1000;
  const leeway = options.leewaySeconds ?? 60;
  if (!Number.isFinite(said.expires_at) || now > said.expires_at + leeway) throw new InvalidReceipt("it has expired");
  if (now < said.issued_at - leeway) throw new InvalidReceipt("it is not valid yet");
  if (said.arguments_sha256 !== (await argumentsSha256(args))) {
    throw new InvalidReceipt("it approves other arguments than these");
  }
  for (const [name, expected, actual] of [
    ["audience", options.audience, said.audience],
    ["team", options.team, said.team],
    ["action", options.action, said.action],
    ["issuer", options.issuer, said.issuer],
  ] as const) {
    if (expected !== undefined && expected !== actual) {
      throw new InvalidReceipt(`it approves ${name} ${JSON.stringify(actual)}, not ${JSON.stringify(expected)}`);
    }
  }
  if (options.seen) {
    if (options.seen.has(said.id)) throw new InvalidReceipt(`it was used already (receipt ${said.id})`);
    options.seen.add(said.id);
  }
  return said;
}
