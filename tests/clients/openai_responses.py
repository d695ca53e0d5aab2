"""Drives a running Turnstile's Responses API with the official `openai` Python package:
`responses.create` and the `responses.stream` helper, plain and through held tool calls
(function and custom tools) in both continuation styles, and the error classes.

Env: TURNSTILE_URL (base URL ending in /v1), TURNSTILE_KEY, TURNSTILE_OTHER_KEY.
Exits non-zero on the first failed check; prints ALL OK at the end.
"""
import json
import os

import openai
from openai import OpenAI
from openai.types.responses import Response

URL = os.environ["TURNSTILE_URL"]
client = OpenAI(base_url=URL, api_key=os.environ["TURNSTILE_KEY"], max_retries=0, timeout=30)
other = OpenAI(base_url=URL, api_key=os.environ["TURNSTILE_OTHER_KEY"], max_retries=0, timeout=30)

TOOLS = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a file",
        "strict": False,
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
    {"type": "custom", "name": "apply_patch", "description": "Apply a patch"},
]


def strict(raw):
    """The body validates against the SDK's own model, not just its lenient constructor."""
    return Response.model_validate(json.loads(raw.text))


# Plain, non-streaming, validated strictly.
raw = client.responses.with_raw_response.create(model="echo", input="hi sdk")
r = strict(raw)
assert r.output_text == "You said: hi sdk", r
assert r.status == "completed" and r.object == "response"
assert r.usage.total_tokens == 15, r.usage
assert r.id.startswith("resp_")

# Plain, streamed through the stream helper (it checks the event order itself).
with client.responses.stream(model="echo", input=[{"role": "user", "content": "streamed"}]) as s:
    deltas = "".join(e.delta for e in s if e.type == "response.output_text.delta")
    final = s.get_final_response()
assert deltas == "You said: streamed", deltas
assert final.output_text == deltas, final
assert final.usage.output_tokens == 5, final.usage

# A function call through the held turn, streamed; answered with the whole input again.
inp = [{"role": "user", "content": "read /tmp/sdk.txt"}]
with client.responses.stream(model="tool", input=inp, tools=TOOLS, store=False) as s:
    first = s.get_final_response()
calls = [o for o in first.output if o.type == "function_call"]
assert len(calls) == 1, first.output
call = calls[0]
assert call.call_id.startswith("srct-") and len(call.call_id) == 37, call
assert call.name == "read_file" and json.loads(call.arguments) == {"path": "/tmp/sdk.txt"}
again = inp + [o.model_dump(exclude_none=True) for o in first.output]
again.append({"type": "function_call_output", "call_id": call.call_id, "output": "SDK-SECRET"})
with client.responses.stream(model="tool", input=again, tools=TOOLS, store=False) as s:
    done = s.get_final_response()
assert done.output_text == "Tool result: SDK-SECRET", done
assert done.id == first.id

# Replay: 409 raises ConflictError.
try:
    client.responses.create(model="tool", input=again, tools=TOOLS)
    raise SystemExit("replay was accepted")
except openai.ConflictError as e:
    assert e.code == "continuation_already_resolved", e.body

# A custom tool, answered by reference (`previous_response_id` and the output only).
r = strict(client.responses.with_raw_response.create(
    model="tool", input="tool=apply_patch arg=PATCH-1", tools=TOOLS))
custom = [o for o in r.output if o.type == "custom_tool_call"]
assert len(custom) == 1 and custom[0].input == "PATCH-1", r.output
out = [{"type": "custom_tool_call_output", "call_id": custom[0].call_id, "output": "applied"}]

# Another client naming that response: 404, nothing consumed.
try:
    other.responses.create(model="tool", previous_response_id=r.id, input=out, tools=TOOLS)
    raise SystemExit("foreign reference was accepted")
except openai.NotFoundError as e:
    assert e.code == "continuation_not_found", e.body

r2 = strict(client.responses.with_raw_response.create(
    model="tool", previous_response_id=r.id, input=out, tools=TOOLS))
assert r2.output_text == "Tool result: applied", r2

# Bad requests are 400 with the OpenAI error shape.
try:
    client.responses.create(model="echo", input=[])
    raise SystemExit("empty input was accepted")
except openai.BadRequestError as e:
    assert e.code == "invalid_request", e.body

print("ALL OK")
