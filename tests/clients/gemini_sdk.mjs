// The pinned @google/genai npm package against the gateway's Gemini API surface: a manual
// function-calling loop (not streamed, then streamed) through a held turn of the demo
// backend, a replay (409 ABORTED), another principal's continuation (404), the caller's
// models paged, one model, countTokens. Prints ALL OK.
//
// TURNSTILE_URL is the gateway's root URL; TURNSTILE_KEY and TURNSTILE_OTHER_KEY are two
// principals' keys.
import assert from 'node:assert/strict';
import { ApiError, GoogleGenAI, createPartFromFunctionResponse } from '@google/genai';

const client = (apiKey) =>
  // No retryOptions: one attempt per call.
  new GoogleGenAI({ apiKey, httpOptions: { baseUrl: process.env.TURNSTILE_URL, apiVersion: 'v1beta' } });
const ai = client(process.env.TURNSTILE_KEY);
const other = client(process.env.TURNSTILE_OTHER_KEY);
const config = {
  tools: [{ functionDeclarations: [{ name: 'read_file', description: 'Reads a file.',
    parametersJsonSchema: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] } }] }],
  automaticFunctionCalling: { disable: true },
};
const user = (text) => ({ role: 'user', parts: [{ text }] });
const answered = (calls, output) => ({
  role: 'user',
  parts: calls.map((c) => createPartFromFunctionResponse(c.id, c.name, { output })),
});

async function expectError(call, status, grpc, prefix) {
  try {
    await call();
  } catch (e) {
    assert.ok(e instanceof ApiError, String(e));
    assert.equal(e.status, status, e.message);
    const body = JSON.parse(e.message).error;
    assert.equal(body.status, grpc);
    assert.ok(body.message.startsWith(prefix), body.message);
    return;
  }
  assert.fail(`expected ${status} ${grpc}`);
}

// Not streamed.
let contents = [user('read /srv/notes.txt')];
const first = await ai.models.generateContent({ model: 'tool', contents, config });
const calls = first.functionCalls;
assert.equal(calls.length, 1);
assert.match(calls[0].id, /^srct-[0-9a-f]{32}$/);
assert.deepEqual([calls[0].name, calls[0].args], ['read_file', { path: '/srv/notes.txt' }]);
contents.push(first.candidates[0].content, answered(calls, 'NOTES-1'));
const final = await ai.models.generateContent({ model: 'tool', contents, config });
assert.equal(final.text, 'Tool result: NOTES-1');
await expectError(() => ai.models.generateContent({ model: 'tool', contents, config }),
  409, 'ABORTED', 'continuation_already_resolved');

// Streamed.
contents = [user('read /srv/streamed.txt')];
const parts = [];
const streamedCalls = [];
for await (const chunk of await ai.models.generateContentStream({ model: 'tool', contents, config })) {
  parts.push(...(chunk.candidates?.[0]?.content?.parts ?? []));
  streamedCalls.push(...(chunk.functionCalls ?? []));
}
assert.equal(streamedCalls.length, 1);
contents.push({ role: 'model', parts }, answered(streamedCalls, 'STREAMED-2'));
await expectError(() => other.models.generateContent({ model: 'tool', contents, config }),
  404, 'NOT_FOUND', 'continuation_not_found');
let text = '';
for await (const chunk of await ai.models.generateContentStream({ model: 'tool', contents, config })) {
  text += chunk.text ?? '';
}
assert.equal(text, 'Tool result: STREAMED-2');

// Models, one per page; one model; a token count.
const names = [];
for await (const m of await ai.models.list({ config: { pageSize: 1 } })) names.push(m.name);
assert.ok(names.includes('models/tool') && names.length > 2, String(names));
assert.equal(new Set(names).size, names.length);
assert.equal((await ai.models.get({ model: 'tool' })).name, 'models/tool');
assert.equal((await ai.models.countTokens({ model: 'echo', contents: 'twelve bytes' })).totalTokens, 6);
console.log('ALL OK');
