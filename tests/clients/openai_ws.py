"""Drives a running Turnstile's Responses WebSocket mode with the official `openai` Python package
(`client.responses.connect()`): strict event order and sequence numbers, sequential
`response.create`s continuing the conversation on one socket, a held client-tool turn answered
on the socket, bad frames and a second `response.create` mid-stream answered with `error`
events (the socket carries on), a held turn continued on a new socket after the first closed,
and a socket closed while its leg runs.

Env: TURNSTILE_URL (base URL ending in /v1), TURNSTILE_KEY, TURNSTILE_OTHER_KEY.
Exits non-zero on the first failed check; prints ALL OK at the end.
"""
import json
import os

from openai import OpenAI
from websockets.exceptions import InvalidStatus

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
    }
]
TERMINAL = ("response.completed", "response.failed", "error")


def collect(conn):
    """Every event of one response, up to and including its terminal event."""
    events = []
    while True:
        e = conn.recv()
        events.append(e)
        if e.type in TERMINAL:
            return events


def check_order(events):
    """The SSE grammar, frame by frame: created, in_progress, items opened and closed one at a
    time (each event in between belongs to the open item), completed; sequence numbers 0..n-1."""
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"], kinds
    assert kinds[-1] == "response.completed", kinds
    assert [e.sequence_number for e in events] == list(range(len(events))), kinds
    open_index = None
    for e in events[2:-1]:
        if e.type == "response.output_item.added":
            assert open_index is None, kinds
            open_index = e.output_index
        elif e.type == "response.output_item.done":
            assert open_index == e.output_index, kinds
            open_index = None
        else:
            assert open_index is not None and e.output_index == open_index, kinds
    assert open_index is None, kinds
    done = events[-1].response
    assert done.status == "completed" and done.id == events[0].response.id, done
    return done


def text_of(events):
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


def create(conn, **body):
    conn.send({"type": "response.create", **body})


# A credential is checked before the upgrade: the handshake is refused with 401.
try:
    with other.with_options(api_key="sk-wrong").responses.connect(max_retries=0) as conn:
        conn.recv()
    raise SystemExit("an unknown key was upgraded")
except InvalidStatus as e:
    assert e.response.status_code == 401, e

with client.responses.connect(max_retries=0) as conn:
    # Plain.
    create(conn, model="echo", input="hi socket")
    ev = collect(conn)
    first = check_order(ev)
    assert text_of(ev) == "You said: hi socket", ev
    assert first.usage.total_tokens == 15, first.usage

    # A second response.create on the same socket continues by reference.
    create(conn, model="echo", previous_response_id=first.id,
           input=[{"role": "user", "content": "and again"}])
    ev = collect(conn)
    check_order(ev)
    assert text_of(ev) == "You said: and again", ev

    # A held client-tool turn on the socket.
    create(conn, model="tool", input="read /tmp/ws.txt", tools=TOOLS)
    ev = collect(conn)
    held = check_order(ev)
    calls = [o for o in held.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].call_id.startswith("srct-"), held.output
    assert json.loads(calls[0].arguments) == {"path": "/tmp/ws.txt"}

    # Bad frames are answered with error events; the socket and the held turn carry on.
    conn._connection.send("{not json")
    e = conn.recv()
    assert e.type == "error" and e.status == 400 and e.error.code == "invalid_request", e
    conn._connection.send(json.dumps({"type": "response.cancel"}))
    e = conn.recv()
    assert e.type == "error" and e.error.param == "type", e
    create(conn, model="tool", input=[])
    e = conn.recv()
    assert e.type == "error" and e.error.code == "invalid_request", e

    # The held turn answered on the socket: the same response, the result reached it.
    out = [{"type": "function_call_output", "call_id": calls[0].call_id, "output": "WS-SECRET"}]
    create(conn, model="tool", previous_response_id=held.id, input=out, tools=TOOLS)
    ev = collect(conn)
    done = check_order(ev)
    assert text_of(ev) == "Tool result: WS-SECRET", ev
    assert done.id == held.id, (done.id, held.id)

    # The same answer again: 409 as an error event, nothing changes.
    replay = [{"role": "user", "content": "read /tmp/ws.txt"}]
    replay += [o.model_dump(exclude_none=True) for o in held.output] + out
    create(conn, model="tool", input=replay, tools=TOOLS)
    e = conn.recv()
    assert e.type == "error" and e.status == 409, e
    assert e.error.code == "continuation_already_resolved", e

    # A second response.create while one streams: an error event, and the first finishes.
    create(conn, model="slow", input="delay=800 slowly")
    create(conn, model="echo", input="too soon")
    ev = collect(conn)
    assert ev[-1].type == "error", [x.type for x in ev]
    assert ev[-1].error.code == "invalid_request" and "in progress" in ev[-1].error.message, ev[-1]
    ev = ev[:-1] + collect(conn)
    check_order(ev)
    assert text_of(ev) == "You said: delay=800 slowly", ev

    # A held turn, then the socket closes: the turn is still held.
    create(conn, model="tool", input="read /tmp/later.txt", tools=TOOLS)
    later = check_order(collect(conn))
later_call = [o for o in later.output if o.type == "function_call"][0]

# Another principal cannot continue it, on a socket of its own.
with other.responses.connect(max_retries=0) as conn:
    out = [{"type": "function_call_output", "call_id": later_call.call_id, "output": "x"}]
    create(conn, model="tool", previous_response_id=later.id, input=out, tools=TOOLS)
    e = conn.recv()
    assert e.type == "error" and e.status == 404, e

# The owner continues it on a new socket.
with client.responses.connect(max_retries=0) as conn:
    out = [{"type": "function_call_output", "call_id": later_call.call_id, "output": "LATER"}]
    create(conn, model="tool", previous_response_id=later.id, input=out, tools=TOOLS)
    ev = collect(conn)
    check_order(ev)
    assert text_of(ev) == "Tool result: LATER", ev

    # A socket closed while its leg runs: the leg is interrupted (the test reads the log).
    create(conn, model="hang", input="hang on")
    e = conn.recv()
    assert e.type == "response.created", e

print("ALL OK")
