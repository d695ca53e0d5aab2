"""One client-tool round trip through Turnstile in front of the real Codex app-server, driven
by the official `openai` Python package.

Env: TURNSTILE_URL (base URL ending in /v1), TURNSTILE_KEY, TURNSTILE_MODEL, TOOL_RESULT (the
exact text the client's tool returns). The first leg is non-streaming, the resume streams.
Prints one JSON line with what the client saw, then ALL OK; exits non-zero on a failed check.
"""
import json
import os

from openai import OpenAI

client = OpenAI(base_url=os.environ["TURNSTILE_URL"], api_key=os.environ["TURNSTILE_KEY"],
                max_retries=0, timeout=60)
MODEL = os.environ["TURNSTILE_MODEL"]
RESULT = os.environ["TOOL_RESULT"]
TOOLS = [{
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file from the user's machine",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
}]

messages = [{"role": "user", "content": "Please read /work/notes.txt"}]
r = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
assert r.choices[0].finish_reason == "tool_calls", r
calls = r.choices[0].message.tool_calls
assert len(calls) == 1, calls
call = calls[0]
assert call.id.startswith("srct-") and len(call.id) == 37, call.id
assert call.function.name == "read_file", call
assert json.loads(call.function.arguments) == {"path": "/work/notes.txt"}, call.function.arguments

messages.append(r.choices[0].message.model_dump(exclude_none=True))
messages.append({"role": "tool", "tool_call_id": call.id, "content": RESULT})
text = ""
usage = None
finish = None
for c in client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, stream=True,
                                         stream_options={"include_usage": True}):
    if c.usage is not None:
        usage = c.usage.model_dump()
    if c.choices:
        text += c.choices[0].delta.content or ""
        finish = c.choices[0].finish_reason or finish
assert finish == "stop", finish

print(json.dumps({"first_id": r.id, "call_id": call.id, "first_usage": r.usage.model_dump(),
                  "text": text, "usage": usage}))
print("ALL OK")
