"""Drives a running Turnstile with the official `openai` Python package.

Env: TURNSTILE_URL (base URL ending in /v1), TURNSTILE_KEY, TURNSTILE_OTHER_KEY.
Exits non-zero on the first failed check; prints ALL OK at the end.
"""
import json
import os
import threading

import openai
from openai import OpenAI

URL = os.environ["TURNSTILE_URL"]
client = OpenAI(base_url=URL, api_key=os.environ["TURNSTILE_KEY"], max_retries=0, timeout=30)
other = OpenAI(base_url=URL, api_key=os.environ["TURNSTILE_OTHER_KEY"], max_retries=0, timeout=30)

TOOLS = [{
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
}]

# Plain, non-streaming.
r = client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "hi sdk"}])
assert r.choices[0].message.content == "You said: hi sdk", r
assert r.choices[0].finish_reason == "stop"
assert r.usage.total_tokens == 15

# Plain, streaming with usage.
chunks = list(client.chat.completions.create(
    model="echo", messages=[{"role": "user", "content": "streamed"}], stream=True,
    stream_options={"include_usage": True}))
text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
assert text == "You said: streamed", text
assert chunks[-1].usage.total_tokens == 15

# Models list.
ids = [m.id for m in client.models.list()]
assert "echo" in ids and "tool" in ids, ids

# Tool round trip through the held turn, non-streaming.
messages = [{"role": "user", "content": "read /tmp/sdk.txt"}]
r = client.chat.completions.create(model="tool", messages=messages, tools=TOOLS)
assert r.choices[0].finish_reason == "tool_calls", r
call = r.choices[0].message.tool_calls[0]
assert call.id.startswith("srct-") and len(call.id) == 37
assert json.loads(call.function.arguments) == {"path": "/tmp/sdk.txt"}
messages.append(r.choices[0].message.model_dump(exclude_none=True))
messages.append({"role": "tool", "tool_call_id": call.id, "content": "SDK-SECRET"})
r2 = client.chat.completions.create(model="tool", messages=messages, tools=TOOLS)
assert r2.choices[0].message.content == "Tool result: SDK-SECRET", r2

# Replay: 409 raises ConflictError.
try:
    client.chat.completions.create(model="tool", messages=messages, tools=TOOLS)
    raise SystemExit("replay was accepted")
except openai.ConflictError as e:
    assert e.code == "continuation_already_resolved", e.body

# Tool round trip with the streaming helper.
messages = [{"role": "user", "content": "read /tmp/stream.txt"}]
with client.chat.completions.stream(model="tool", messages=messages, tools=TOOLS) as s:
    final = s.get_final_completion()
assert final.choices[0].finish_reason == "tool_calls"
call = final.choices[0].message.tool_calls[0]
assert call.type == "function" and call.id.startswith("srct-")
messages.append({"role": "assistant", "content": None, "tool_calls": [
    {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": call.function.arguments}}]})
messages.append({"role": "tool", "tool_call_id": call.id, "content": [{"type": "text", "text": "STREAMED-SECRET"}]})
text = ""
for c in client.chat.completions.create(model="tool", messages=messages, tools=TOOLS, stream=True):
    if c.choices:
        text += c.choices[0].delta.content or ""
assert text == "Tool result: STREAMED-SECRET", text

# Error classes.
try:
    OpenAI(base_url=URL, api_key="wrong", max_retries=0).chat.completions.create(
        model="echo", messages=[{"role": "user", "content": "x"}])
    raise SystemExit("bad key accepted")
except openai.AuthenticationError as e:
    assert e.status_code == 401 and e.code == "invalid_api_key"
try:
    client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    raise SystemExit("unknown model accepted")
except openai.NotFoundError as e:
    assert e.code == "model_not_found"

# A foreign principal cannot resume: 404.
messages = [{"role": "user", "content": "read /tmp/x"}]
r = client.chat.completions.create(model="tool", messages=messages, tools=TOOLS)
call = r.choices[0].message.tool_calls[0]
messages.append(r.choices[0].message.model_dump(exclude_none=True))
messages.append({"role": "tool", "tool_call_id": call.id, "content": "X"})
try:
    other.chat.completions.create(model="tool", messages=messages, tools=TOOLS)
    raise SystemExit("foreign resume accepted")
except openai.NotFoundError as e:
    assert e.code == "continuation_not_found"
r = client.chat.completions.create(model="tool", messages=messages, tools=TOOLS)
assert r.choices[0].message.content == "Tool result: X"

# 429: held turns of one client pile up until a limit answers RateLimitError (the per-client
# pending limit or, with the test defaults, the backend's session pool: a held turn keeps its
# session). Last, since the held turns stay until shutdown.
held = 0
while True:
    try:
        r = other.chat.completions.create(
            model="tool", messages=[{"role": "user", "content": f"read /tmp/held{held}"}], tools=TOOLS)
        assert r.choices[0].finish_reason == "tool_calls", r
        held += 1
        assert held < 200, "no limit after 200 held turns"
    except openai.RateLimitError as e:
        assert e.status_code == 429 and e.code == "capacity_exhausted", e.body
        assert held > 0
        break

print("ALL OK")
