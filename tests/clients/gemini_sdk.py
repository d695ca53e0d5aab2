"""The pinned google-genai package against the gateway's Gemini API surface: a manual
function-calling loop (not streamed, then streamed) through a held turn of the demo backend,
a replay (409 ABORTED), another principal's continuation (404), the caller's models paged,
one model, countTokens, an unknown model. Prints ALL OK.

TURNSTILE_URL is the gateway's root URL; TURNSTILE_KEY and TURNSTILE_OTHER_KEY are two
principals' keys.
"""

import os

from google import genai
from google.genai import errors, types

URL = os.environ["TURNSTILE_URL"]
KEY = os.environ["TURNSTILE_KEY"]
OTHER = os.environ["TURNSTILE_OTHER_KEY"]


def client(key):
    # No retry options: one attempt per call (an error test must not be retried).
    return genai.Client(
        api_key=key,
        http_options=types.HttpOptions(base_url=URL, api_version="v1beta", timeout=60_000),
    )


ai, other = client(KEY), client(OTHER)
READ_FILE = types.FunctionDeclaration(
    name="read_file",
    description="Reads a file.",
    parameters_json_schema={
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
    },
)
CONFIG = types.GenerateContentConfig(
    tools=[types.Tool(function_declarations=[READ_FILE])],
    automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
)


def user(text):
    return types.Content(role="user", parts=[types.Part(text=text)])


def answered(calls, output):
    """One user turn answering every call by its id."""
    return types.Content(
        role="user",
        parts=[
            types.Part(
                function_response=types.FunctionResponse(
                    id=c.id, name=c.name, response={"output": output}
                )
            )
            for c in calls
        ],
    )


def expect_error(call, code, status, prefix):
    try:
        call()
    except errors.ClientError as e:
        assert (e.code, e.status) == (code, status), (e.code, e.status, e.message)
        assert e.message.startswith(prefix), e.message
        return
    raise AssertionError(f"expected {code} {status}")


# Not streamed: the held call's id is a token; the answer resumes the same turn.
contents = [user("read /srv/notes.txt")]
first = ai.models.generate_content(model="tool", contents=contents, config=CONFIG)
calls = first.function_calls
assert calls and len(calls) == 1, first
call = calls[0]
assert call.id.startswith("srct-") and len(call.id) == 37, call.id
assert (call.name, call.args) == ("read_file", {"path": "/srv/notes.txt"}), call
assert first.candidates[0].finish_reason == types.FinishReason.STOP
contents += [first.candidates[0].content, answered(calls, "NOTES-1")]
final = ai.models.generate_content(model="tool", contents=contents, config=CONFIG)
assert final.text == "Tool result: NOTES-1", final.text
assert final.usage_metadata.total_token_count > 0, final.usage_metadata

# The same continuation again: Google's 409, the stable code first in the message.
expect_error(
    lambda: ai.models.generate_content(model="tool", contents=contents, config=CONFIG),
    409, "ABORTED", "continuation_already_resolved",
)

# Streamed: every part kept as it came, the calls gathered from the chunks.
contents = [user("read /srv/streamed.txt")]
parts, calls = [], []
for chunk in ai.models.generate_content_stream(model="tool", contents=contents, config=CONFIG):
    parts.extend(chunk.candidates[0].content.parts or [])
    calls.extend(chunk.function_calls or [])
assert len(calls) == 1 and calls[0].id.startswith("srct-"), calls
contents += [types.Content(role="model", parts=parts), answered(calls, "STREAMED-2")]

# Another principal sending the continuation: unknown to them (404), and nothing consumed.
expect_error(
    lambda: other.models.generate_content(model="tool", contents=contents, config=CONFIG),
    404, "NOT_FOUND", "continuation_not_found",
)
text = "".join(
    c.text or ""
    for c in ai.models.generate_content_stream(model="tool", contents=contents, config=CONFIG)
)
assert text == "Tool result: STREAMED-2", text

# The caller's models, one page of one at a time; one model; a token count.
names = [m.name for m in ai.models.list(config=types.ListModelsConfig(page_size=1))]
assert "models/tool" in names and "models/echo" in names and len(names) > 2, names
assert len(names) == len(set(names)), names
assert ai.models.get(model="tool").name == "models/tool"
assert ai.models.count_tokens(model="echo", contents="twelve bytes").total_tokens == 6
expect_error(
    lambda: ai.models.generate_content(model="does-not-exist", contents="x"),
    404, "NOT_FOUND", "model_not_found",
)
print("ALL OK")
