"""Drives a running Turnstile with the official `anthropic` Python package (Messages API).

Env: TURNSTILE_URL (base URL WITHOUT /v1; the SDK adds it), TURNSTILE_KEY (alice),
TURNSTILE_OTHER_KEY (bob). Exits non-zero on the first failed check; prints ALL OK at the end.

Note: this SDK version sends `api_key=` as `Authorization: Bearer`, not as `x-api-key`;
the x-api-key header is exercised explicitly below.
"""
import itertools
import os

import anthropic
from anthropic import Anthropic

URL = os.environ["TURNSTILE_URL"]
KEY = os.environ["TURNSTILE_KEY"]
client = Anthropic(base_url=URL, api_key=KEY, max_retries=0, timeout=30)
other = Anthropic(base_url=URL, api_key=os.environ["TURNSTILE_OTHER_KEY"], max_retries=0, timeout=30)

TOOLS = [{
    "name": "read_file",
    "description": "Read a file",
    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
}]


def check(cond, msg):
    if not cond:
        raise SystemExit(f"FAIL: {msg}")


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


def expect_error(cls, what, fn):
    """Runs fn, which must raise the APIStatusError subclass cls; returns the exception."""
    try:
        r = fn()
    except anthropic.APIStatusError as e:
        check(isinstance(e, cls), f"{what}: expected {cls.__name__}, got {type(e).__name__} {e.status_code} {e.body}")
        return e
    raise SystemExit(f"FAIL: {what} was accepted: {r}")


def check_error(e, etype, code=None):
    """The body is {"type":"error","error":{"type":etype,"message":...}}; code prefixes the message."""
    body = e.body
    check(isinstance(body, dict) and body.get("type") == "error", f"error body not an Anthropic error: {body}")
    err = body.get("error") or {}
    if etype is not None:
        check(err.get("type") == etype, f"error.type {err.get('type')!r} != {etype!r}: {body}")
    check(isinstance(err.get("type"), str) and isinstance(err.get("message"), str), f"error fields: {body}")
    if code is not None:
        check(err["message"].startswith(code + ":"), f"message does not start with {code!r}: {body}")
        got = e.response.headers.get("x-turnstile-error-code")
        check(got == code, f"x-turnstile-error-code {got!r} != {code!r}")


def user(text):
    return {"role": "user", "content": text}


def tool_use_block(message):
    blocks = [b for b in message.content if b.type == "tool_use"]
    check(len(blocks) == 1, f"expected one tool_use block: {message}")
    b = blocks[0]
    check(b.id.startswith("srct-"), f"tool_use id {b.id!r} lacks srct- prefix")
    check(b.name == "read_file", f"tool name {b.name!r}")
    return b


def tool_result(block, content):
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block.id, "content": content}]}


# 1. Plain, non-streaming.
r = client.messages.create(model="echo", max_tokens=100, messages=[user("hello sdk")])
check(r.type == "message" and r.role == "assistant", f"type/role: {r}")
check(r.id.startswith("msg_"), f"id {r.id!r} lacks msg_ prefix")
check(r.content and r.content[0].type == "text", f"content[0]: {r.content}")
check("You said: hello sdk" in r.content[0].text, f"text: {r.content[0].text!r}")
check(r.stop_reason == "end_turn", f"stop_reason {r.stop_reason!r}")
check(type(r.usage.input_tokens) is int and type(r.usage.output_tokens) is int, f"usage: {r.usage}")
check(r.content[0].citations is None and r.usage.service_tier == "standard", f"full shape: {r}")
check(r.usage.cache_creation is not None and r.usage.server_tool_use is None, f"usage: {r.usage}")

# 2. System prompt as a string and as text blocks with cache_control.
r = client.messages.create(model="echo", max_tokens=100, system="Be brief.", messages=[user("sys str")])
check("You said: sys str" in text_of(r), f"system string: {r}")
r = client.messages.create(
    model="echo", max_tokens=100, messages=[user("sys blocks")],
    system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}])
check("You said: sys blocks" in text_of(r), f"system blocks: {r}")

# 3. Streaming: the helper, then the raw event order.
with client.messages.stream(model="echo", max_tokens=100, messages=[user("streamed")]) as s:
    streamed = "".join(s.text_stream)
    final = s.get_final_message()
check("You said: streamed" in streamed, f"text_stream: {streamed!r}")
check(text_of(final) == streamed, f"final {text_of(final)!r} != streamed {streamed!r}")
check(final.stop_reason == "end_turn" and final.id.startswith("msg_"), f"final message: {final}")

events = [e for e in client.messages.create(
    model="echo", max_tokens=100, messages=[user("raw stream")], stream=True) if e.type != "ping"]
types = [e.type for e in events]
check(types[0] == "message_start", f"first event: {types}")
check(types[-1] == "message_stop" and types[-2] == "message_delta", f"last events: {types}")
check(events[-2].delta.stop_reason == "end_turn", f"message_delta: {events[-2]}")
open_blocks, seen, raw_text = set(), set(), ""
for e in events:
    if e.type == "content_block_start":
        check(e.index not in open_blocks and e.index not in seen, f"block {e.index} started twice: {types}")
        open_blocks.add(e.index)
        seen.add(e.index)
    elif e.type == "content_block_delta":
        check(e.index in open_blocks, f"delta for block {e.index} outside start/stop: {types}")
        raw_text += getattr(e.delta, "text", "") or ""
    elif e.type == "content_block_stop":
        check(e.index in open_blocks, f"stop for unopened block {e.index}: {types}")
        open_blocks.remove(e.index)
check(seen and not open_blocks, f"unbalanced content blocks: {types}")
check("You said: raw stream" in raw_text, f"raw text: {raw_text!r}")

# 4. Tool round trip through the held turn, non-streaming.
messages = [user("please read /tmp/notes.txt")]
r = client.messages.create(model="tool", max_tokens=100, messages=messages, tools=TOOLS)
check(r.stop_reason == "tool_use", f"stop_reason {r.stop_reason!r}: {r}")
block = tool_use_block(r)
check(block.input == {"path": "/tmp/notes.txt"}, f"tool input {block.input!r}")
messages = messages + [{"role": "assistant", "content": r.content}, tool_result(block, "SECRET-42")]
r2 = client.messages.create(model="tool", max_tokens=100, messages=messages, tools=TOOLS)
check("Tool result: SECRET-42" in text_of(r2), f"continuation text: {r2}")
check(r2.stop_reason == "end_turn", f"continuation stop_reason {r2.stop_reason!r}")
check(r2.id == r.id + "_1", f"continuation id {r2.id!r} is not the first id {r.id!r} + '_1'")

# 5. Replay of the same continuation: 409.
e = expect_error(anthropic.ConflictError, "replay", lambda: client.messages.create(
    model="tool", max_tokens=100, messages=messages, tools=TOOLS))
check(e.status_code == 409, f"replay status {e.status_code}")
check_error(e, None, "continuation_already_resolved")

# 6. A foreign principal cannot resume (404), and its attempt consumes nothing.
messages = [user("please read /tmp/foreign.txt")]
r = client.messages.create(model="tool", max_tokens=100, messages=messages, tools=TOOLS)
block = tool_use_block(r)
messages = messages + [{"role": "assistant", "content": r.content}, tool_result(block, "X")]
e = expect_error(anthropic.NotFoundError, "foreign resume", lambda: other.messages.create(
    model="tool", max_tokens=100, messages=messages, tools=TOOLS))
check(e.status_code == 404, f"foreign status {e.status_code}")
check_error(e, None, "continuation_not_found")
r2 = client.messages.create(model="tool", max_tokens=100, messages=messages, tools=TOOLS)
check("Tool result: X" in text_of(r2), f"owner resume after foreign attempt: {r2}")

# 7. Tool round trip with the streaming helper.
messages = [user("please read /tmp/notes.txt")]
with client.messages.stream(model="tool", max_tokens=100, messages=messages, tools=TOOLS) as s:
    final = s.get_final_message()
check(final.stop_reason == "tool_use", f"streamed stop_reason {final.stop_reason!r}")
block = tool_use_block(final)
check(isinstance(block.input, dict) and block.input == {"path": "/tmp/notes.txt"}, f"streamed input {block.input!r}")
messages = messages + [{"role": "assistant", "content": final.content}, tool_result(block, "STREAMED-SECRET")]
with client.messages.stream(model="tool", max_tokens=100, messages=messages, tools=TOOLS) as s:
    streamed = "".join(s.text_stream)
    final2 = s.get_final_message()
check("Tool result: STREAMED-SECRET" in streamed, f"streamed continuation: {streamed!r}")
check("Tool result:" in text_of(final2) and final2.stop_reason == "end_turn", f"streamed final: {final2}")

# 8. Parallel tool calls answered in one user message.
messages = [user("please read /tmp/par.txt")]
r = client.messages.create(model="parallel", max_tokens=100, messages=messages, tools=TOOLS)
check(r.stop_reason == "tool_use", f"parallel stop_reason {r.stop_reason!r}")
blocks = [b for b in r.content if b.type == "tool_use"]
check(len(blocks) == 2, f"expected two tool_use blocks: {r.content}")
b1, b2 = blocks
check(b1.id != b2.id and all(b.id.startswith("srct-") for b in blocks), f"parallel ids {b1.id!r} {b2.id!r}")
check(str(b1.input.get("path")).endswith(" #1") and str(b2.input.get("path")).endswith(" #2"),
      f"parallel inputs {b1.input!r} {b2.input!r}")
messages = messages + [{"role": "assistant", "content": r.content}, {"role": "user", "content": [
    {"type": "tool_result", "tool_use_id": b1.id, "content": "R1"},
    {"type": "tool_result", "tool_use_id": b2.id, "content": [{"type": "text", "text": "R2"}], "is_error": False},
]}]
r2 = client.messages.create(model="parallel", max_tokens=100, messages=messages, tools=TOOLS)
check(text_of(r2) == "Results: R1 | R2", f"parallel result {text_of(r2)!r}")
check(r2.id == r.id + "_1", f"parallel continuation id {r2.id!r} is not {r.id!r} + '_1'")

# 9. Error classes and bodies.
bad = Anthropic(base_url=URL, api_key="wrong", max_retries=0, timeout=30)
e = expect_error(anthropic.AuthenticationError, "bad key", lambda: bad.messages.create(
    model="echo", max_tokens=100, messages=[user("x")]))
check(e.status_code == 401, f"bad key status {e.status_code}")
check_error(e, "authentication_error")
check(e.response.headers.get("x-should-retry") == "false", "a 401 must say it is not worth retrying")
# A model the caller may not use is 400, as Claude Code's gateway protocol says.
e = expect_error(anthropic.BadRequestError, "unknown model", lambda: client.messages.create(
    model="no-such-model", max_tokens=100, messages=[user("x")]))
check_error(e, "invalid_request_error")
e = expect_error(anthropic.BadRequestError, "empty messages", lambda: client.messages.create(
    model="echo", max_tokens=100, messages=[]))
check(e.status_code == 400, f"empty messages status {e.status_code}")
check_error(e, "invalid_request_error")

# 10. Auth: auth_token= (Bearer) and an explicit x-api-key header with Authorization omitted.
bearer = Anthropic(base_url=URL, api_key=None, auth_token=KEY, max_retries=0, timeout=30)
r = bearer.messages.create(model="echo", max_tokens=100, messages=[user("bearer")])
check("You said: bearer" in text_of(r), f"bearer auth: {r}")
r = client.messages.create(model="echo", max_tokens=100, messages=[user("x-api-key")],
                           extra_headers={"Authorization": anthropic.omit, "X-Api-Key": KEY})
check("You said: x-api-key" in text_of(r), f"x-api-key auth: {r}")

# 11. Token counting.
n = client.messages.count_tokens(model="echo", messages=[user("count these tokens")])
check(type(n.input_tokens) is int and n.input_tokens > 0, f"count_tokens: {n}")

# 12. Models list (iteration auto-paginates; bounded in case has_more/last_id loop).
models = list(itertools.islice(client.models.list(), 500))
ids = [m.id for m in models]
check(len(ids) == len(set(ids)), f"models list repeats ids (pagination loop?): {ids[:10]}")
check("echo" in ids and "tool" in ids, f"model ids: {ids}")
check(all(m.type == "model" for m in models), f"model types: {[m.type for m in models]}")

print("ALL OK")
