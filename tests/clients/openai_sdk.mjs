// Drives a running Turnstile with the official `openai` npm package (pinned in package.json,
// installed by `npm ci` into tests/clients/node_modules). Mirrors openai_sdk.py.
//
// Env: TURNSTILE_URL (base URL ending in /v1), TURNSTILE_KEY, TURNSTILE_OTHER_KEY. The gateway
// must run with `max_pending_per_client = 1` (the 429 check suspends two calls as OTHER_KEY).
// Exits non-zero on the first failed check; prints ALL OK at the end.
import assert from "node:assert/strict";

import OpenAI from "openai";

const URL = process.env.TURNSTILE_URL;
const opts = { baseURL: URL, maxRetries: 0, timeout: 30_000 };
const client = new OpenAI({ ...opts, apiKey: process.env.TURNSTILE_KEY });
const other = new OpenAI({ ...opts, apiKey: process.env.TURNSTILE_OTHER_KEY });

const TOOLS = [
  {
    type: "function",
    function: {
      name: "read_file",
      description: "Read a file",
      parameters: {
        type: "object",
        properties: { path: { type: "string" } },
        required: ["path"],
      },
    },
  },
];

/** Runs `f`, which must throw an instance of `cls` with this status and code. */
async function expectError(what, cls, status, code, f) {
  let err;
  try {
    await f();
  } catch (e) {
    err = e;
  }
  assert.ok(err, `${what}: was accepted`);
  assert.ok(
    err instanceof cls,
    `${what}: expected ${cls.name}, got ${err?.constructor?.name}: ${err}`,
  );
  assert.ok(err instanceof OpenAI.APIError, `${what}: not an APIError`);
  assert.equal(err.status, status, `${what}: status`);
  assert.equal(err.code, code, `${what}: code (${JSON.stringify(err.error)})`);
  assert.equal(err.error?.code, code, `${what}: inner error object`);
  assert.equal(typeof err.error?.message, "string", `${what}: message`);
  assert.ok("type" in err.error && "param" in err.error, `${what}: OpenAI error shape`);
  return err;
}

/** Concatenated content of a raw chunk stream. */
async function collect(stream) {
  let text = "";
  const chunks = [];
  for await (const c of stream) {
    chunks.push(c);
    if (c.choices.length) text += c.choices[0].delta.content ?? "";
  }
  return { text, chunks };
}

// Plain, non-streaming.
{
  const r = await client.chat.completions.create({
    model: "echo",
    messages: [{ role: "user", content: "hi sdk" }],
  });
  assert.equal(r.choices[0].message.content, "You said: hi sdk");
  assert.equal(r.choices[0].finish_reason, "stop");
  assert.equal(r.usage.total_tokens, 15);
  assert.ok(r.id && r.object === "chat.completion", JSON.stringify(r));
}

// Plain, streaming with usage.
{
  const { text, chunks } = await collect(
    await client.chat.completions.create({
      model: "echo",
      messages: [{ role: "user", content: "streamed" }],
      stream: true,
      stream_options: { include_usage: true },
    }),
  );
  assert.equal(text, "You said: streamed");
  const last = chunks.at(-1);
  assert.deepEqual(last.choices, []);
  assert.equal(last.usage.total_tokens, 15);
  const finish = chunks.filter((c) => c.choices[0]?.finish_reason);
  assert.equal(finish.length, 1);
  assert.equal(finish[0].choices[0].finish_reason, "stop");
  assert.equal(new Set(chunks.map((c) => c.id)).size, 1, "one id per stream");
}

// Models list.
{
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.ok(ids.includes("echo") && ids.includes("tool"), JSON.stringify(ids));
}

// Tool round trip through the held turn, non-streaming; then a replay is 409.
{
  const messages = [{ role: "user", content: "read /tmp/sdk.txt" }];
  const r = await client.chat.completions.create({ model: "tool", messages, tools: TOOLS });
  assert.equal(r.choices[0].finish_reason, "tool_calls", JSON.stringify(r));
  const call = r.choices[0].message.tool_calls[0];
  assert.ok(call.id.startsWith("srct-") && call.id.length === 37, call.id);
  assert.equal(call.type, "function");
  assert.deepEqual(JSON.parse(call.function.arguments), { path: "/tmp/sdk.txt" });
  messages.push(r.choices[0].message);
  messages.push({ role: "tool", tool_call_id: call.id, content: "SDK-SECRET" });
  const r2 = await client.chat.completions.create({ model: "tool", messages, tools: TOOLS });
  assert.equal(r2.choices[0].message.content, "Tool result: SDK-SECRET");
  assert.equal(r2.choices[0].finish_reason, "stop");

  await expectError("replay", OpenAI.ConflictError, 409, "continuation_already_resolved", () =>
    client.chat.completions.create({ model: "tool", messages, tools: TOOLS }),
  );
}

// Tool round trip with the streaming helper, resumed with array content through the helper.
{
  const messages = [{ role: "user", content: "read /tmp/stream.txt" }];
  const s = client.chat.completions.stream({ model: "tool", messages, tools: TOOLS });
  const final = await s.finalChatCompletion();
  assert.equal(final.choices[0].finish_reason, "tool_calls");
  const call = final.choices[0].message.tool_calls[0];
  assert.equal(call.type, "function");
  assert.ok(call.id.startsWith("srct-"), call.id);
  assert.deepEqual(JSON.parse(call.function.arguments), { path: "/tmp/stream.txt" });
  messages.push({
    role: "assistant",
    content: null,
    tool_calls: [
      {
        id: call.id,
        type: "function",
        function: { name: call.function.name, arguments: call.function.arguments },
      },
    ],
  });
  messages.push({
    role: "tool",
    tool_call_id: call.id,
    content: [{ type: "text", text: "STREAMED-SECRET" }],
  });
  const s2 = client.chat.completions.stream({
    model: "tool",
    messages,
    tools: TOOLS,
    stream_options: { include_usage: true },
  });
  let deltas = "";
  s2.on("content", (delta) => (deltas += delta));
  const done = await s2.finalChatCompletion();
  assert.equal(done.choices[0].message.content, "Tool result: STREAMED-SECRET");
  assert.equal(done.choices[0].finish_reason, "stop");
  assert.equal(deltas, "Tool result: STREAMED-SECRET");
  assert.ok(done.usage?.total_tokens > 0, JSON.stringify(done.usage));
}

// Error classes (also for stream requests, raised before any chunk).
{
  const bad = new OpenAI({ ...opts, apiKey: "wrong" });
  const hi = [{ role: "user", content: "x" }];
  await expectError("bad key", OpenAI.AuthenticationError, 401, "invalid_api_key", () =>
    bad.chat.completions.create({ model: "echo", messages: hi }),
  );
  await expectError("bad key, stream", OpenAI.AuthenticationError, 401, "invalid_api_key", () =>
    bad.chat.completions.create({ model: "echo", messages: hi, stream: true }),
  );
  await expectError("unknown model", OpenAI.NotFoundError, 404, "model_not_found", () =>
    client.chat.completions.create({ model: "nope", messages: hi }),
  );
  await expectError("unknown model, stream", OpenAI.NotFoundError, 404, "model_not_found", () =>
    client.chat.completions.create({ model: "nope", messages: hi, stream: true }),
  );
  await expectError("tool_choice required", OpenAI.BadRequestError, 400, "unsupported_tool_choice", () =>
    client.chat.completions.create({
      model: "tool",
      messages: hi,
      tools: TOOLS,
      tool_choice: "required",
    }),
  );
}

// A foreign principal cannot resume: 404; the owner still can.
{
  const messages = [{ role: "user", content: "read /tmp/x" }];
  const r = await client.chat.completions.create({ model: "tool", messages, tools: TOOLS });
  const call = r.choices[0].message.tool_calls[0];
  messages.push(r.choices[0].message);
  messages.push({ role: "tool", tool_call_id: call.id, content: "X" });
  await expectError("foreign resume", OpenAI.NotFoundError, 404, "continuation_not_found", () =>
    other.chat.completions.create({ model: "tool", messages, tools: TOOLS }),
  );
  const r2 = await client.chat.completions.create({ model: "tool", messages, tools: TOOLS });
  assert.equal(r2.choices[0].message.content, "Tool result: X");
}

// 429: with max_pending_per_client = 1, a second suspension of the same client is refused
// (plain and streaming); the first held call still resumes.
{
  const messages = [{ role: "user", content: "read /tmp/held.txt" }];
  const r = await other.chat.completions.create({ model: "tool", messages, tools: TOOLS });
  const call = r.choices[0].message.tool_calls[0];
  assert.ok(call.id.startsWith("srct-"), call.id);
  const more = [{ role: "user", content: "read /tmp/second.txt" }];
  await expectError("second suspension", OpenAI.RateLimitError, 429, "capacity_exhausted", () =>
    other.chat.completions.create({ model: "tool", messages: more, tools: TOOLS }),
  );
  await expectError(
    "second suspension, stream",
    OpenAI.RateLimitError,
    429,
    "capacity_exhausted",
    async () => {
      const s = await other.chat.completions.create({
        model: "tool",
        messages: more,
        tools: TOOLS,
        stream: true,
      });
      for await (const _ of s);
    },
  );
  messages.push(r.choices[0].message);
  messages.push({ role: "tool", tool_call_id: call.id, content: "HELD" });
  const r2 = await other.chat.completions.create({ model: "tool", messages, tools: TOOLS });
  assert.equal(r2.choices[0].message.content, "Tool result: HELD");
}

console.log("ALL OK");
