"""Drives a running Turnstile's Managed Agents API with the official `anthropic` Python package
(`client.beta.agents`, `environments`, `sessions`, `sessions.events`), strict response
validation on: every object must parse as the SDK's own types.

Env: TURNSTILE_URL (base URL without /v1), TURNSTILE_KEY (alice), TURNSTILE_OTHER_KEY (bob),
MANAGED_MODEL (a model whose agent calls the client tool `read_file` for the prompt; default
`tool`, the demo backend), MANAGED_PROMPT / MANAGED_INPUT (JSON) / MANAGED_RESULT / MANAGED_SAID
(what is asked, the call it makes, the result sent and a part of the final text; defaults fit
the demo), MANAGED_PART (`all`; `roundtrip`, the held call on any backend kind; `budget`, on
MANAGED_PRICED, a priced model; `release`, the kept thread released when idle; `confirm`,
backend tools under always_ask (see part_confirm); `hold` /
`after_restart` for the restart test, which share state through MANAGED_STATE, a file path;
`bound`, a result over the stored-bytes bound; `expire`, a hold that expires; `cluster` / `cluster_taken`, two replicas, the second at MANAGED_OTHER_URL).
Prints ALL OK at the end.
"""
import json
import os

import anthropic
import httpx
from anthropic import Anthropic

URL = os.environ["TURNSTILE_URL"]
KEY = os.environ["TURNSTILE_KEY"]
MODEL = os.environ.get("MANAGED_MODEL", "tool")
PART = os.environ.get("MANAGED_PART", "all")
PROMPT = os.environ.get("MANAGED_PROMPT", "read /etc/hostname")
INPUT = json.loads(os.environ.get("MANAGED_INPUT", '{"path": "/etc/hostname"}'))
RESULT = os.environ.get("MANAGED_RESULT", "HOSTNAME-42")
SAID = os.environ.get("MANAGED_SAID", "Tool result: HOSTNAME-42")
BETA = {"anthropic-beta": "managed-agents-2026-04-01"}
client = Anthropic(base_url=URL, api_key=KEY, max_retries=0, timeout=60, _strict_response_validation=True)
other = Anthropic(base_url=URL, api_key=os.environ["TURNSTILE_OTHER_KEY"], max_retries=0, timeout=60,
                  _strict_response_validation=True)
READ_FILE = {
    "type": "custom",
    "name": "read_file",
    "description": "Read a file",
    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
}


def check(cond, msg):
    if not cond:
        raise SystemExit(f"FAIL: {msg}")


def expect_error(cls, what, fn, status=None):
    try:
        fn()
    except anthropic.APIStatusError as e:
        check(isinstance(e, cls), f"{what}: {type(e).__name__} {e.status_code} {e.body}")
        check(status is None or e.status_code == status, f"{what}: status {e.status_code}")
        check(e.body["type"] == "error" and e.body["error"]["message"], f"{what}: envelope {e.body}")
        return e
    raise SystemExit(f"FAIL: {what}: no error")


def until_idle(session_id, send=None, c=None):
    """Streams the session's events (sending `send` once the stream is open) until it goes
    idle; returns the events seen. `c`: the client (by default the first replica's)."""
    c = c or client
    seen = []
    with c.beta.sessions.events.stream(session_id) as stream:
        if send is not None:
            c.beta.sessions.events.send(session_id, events=send)
        for event in stream:
            seen.append(event)
            if event.type == "session.status_idle":
                return seen
    raise SystemExit(f"FAIL: the stream ended before idle: {[e.type for e in seen]}")


def setup():
    env = client.beta.environments.create(name="work")
    check(env.type == "environment" and env.config.type == "cloud", env)
    agent = client.beta.agents.create(
        name="reader", model=MODEL, system="Be brief.",
        tools=[READ_FILE, {"type": "agent_toolset_20260401"}],
    )
    check(agent.version == 1 and agent.model.id == MODEL, agent)
    check([t.type for t in agent.tools] == ["custom", "agent_toolset_20260401"], agent.tools)
    check(agent.tools[1].default_config.permission_policy.type == "always_allow", agent.tools[1])
    session = client.beta.sessions.create(agent=agent.id, environment_id=env.id, title="t1")
    check(session.status == "idle" and session.agent.id == agent.id and session.title == "t1", session)
    return env, agent, session


def hold(session, c=None):
    """A message; the stream shows the held custom tool use and requires_action."""
    seen = until_idle(session.id, [{"type": "user.message", "content": [{"type": "text", "text": PROMPT}]}], c)
    types = [e.type for e in seen]
    check(types[0] == "user.message" and "session.status_running" in types, types)
    uses = [e for e in seen if e.type == "agent.custom_tool_use"]
    check(len(uses) == 1 and uses[0].name == "read_file" and uses[0].input == INPUT, (uses, seen))
    idle = seen[-1]
    check(idle.stop_reason.type == "requires_action" and idle.stop_reason.event_ids == [uses[0].id], idle)
    check(not uses[0].id.startswith("srct-"), "the event id is not the continuation token")
    return uses[0]


def answer(session, use, c=None):
    """The result resumes the same held turn, once: the agent ends its turn with it; a
    duplicate is 409."""
    c = c or client
    result = [{"type": "user.custom_tool_result", "custom_tool_use_id": use.id,
               "content": [{"type": "text", "text": RESULT}]}]
    seen = until_idle(session.id, result, c)
    types = [e.type for e in seen]
    check(types[0] == "user.custom_tool_result" and types[1] == "session.status_running", types)
    check(seen[-1].stop_reason.type == "end_turn", seen[-1])
    said = "".join(b.text for e in seen if e.type == "agent.message" for b in e.content)
    check(SAID in said, said)
    e = expect_error(anthropic.ConflictError, "duplicate result",
                     lambda: c.beta.sessions.events.send(session.id, events=result), 409)
    check("already" in e.body["error"]["message"], e.body)
    return seen


def part_roundtrip():
    env, agent, session = setup()
    use = hold(session)
    expect_error(anthropic.NotFoundError, "foreign session", lambda: other.beta.sessions.events.send(session.id, events=[
        {"type": "user.custom_tool_result", "custom_tool_use_id": use.id, "content": []}]), 404)
    answer(session, use)
    check(client.beta.sessions.retrieve(session.id).status == "idle", "idle")
    client.beta.sessions.delete(session.id)
    print("ALL OK")


def main():
    env, agent, session = setup()
    use = hold(session)
    # Another principal: the session, its events and a result are 404, exactly as unknown.
    for fn in (
        lambda: other.beta.sessions.retrieve(session.id),
        lambda: other.beta.sessions.events.list(session.id),
        lambda: other.beta.sessions.events.send(session.id, events=[
            {"type": "user.custom_tool_result", "custom_tool_use_id": use.id, "content": [{"type": "text", "text": "x"}]}]),
        lambda: other.beta.agents.retrieve(agent.id),
        lambda: other.beta.environments.retrieve(env.id),
    ):
        expect_error(anthropic.NotFoundError, "foreign object", fn, 404)
    # A use the session does not wait on: 404, nothing consumed.
    expect_error(anthropic.NotFoundError, "unknown use", lambda: client.beta.sessions.events.send(session.id, events=[
        {"type": "user.custom_tool_result", "custom_tool_use_id": "sevt_nope", "content": []}]), 404)
    seen = answer(session, use)
    ends = [e for e in seen if e.type == "span.model_request_end"]
    check(ends and ends[0].model_usage.output_tokens > 0, ends)
    # A second turn on the same session keeps its conversation.
    seen = until_idle(session.id, [{"type": "user.message", "content": [{"type": "text", "text": "read /etc/motd"}]}])
    check(seen[-1].stop_reason.type == "requires_action", [x.type for x in seen])
    again = [e for e in seen if e.type == "agent.custom_tool_use"]
    check(len(again) == 1 and again[0].id != use.id, again)
    seen = until_idle(session.id, [{"type": "user.custom_tool_result", "custom_tool_use_id": again[0].id,
                                    "content": [{"type": "text", "text": "MOTD"}]}])
    check(seen[-1].stop_reason.type == "end_turn", [x.type for x in seen])
    # The whole history pages back, in order, filtered by type too.
    events = list(client.beta.sessions.events.list(session.id, limit=2))
    ids = [x.id for x in events]
    check(len(ids) == len(set(ids)) and len(ids) >= 12, ids)
    check(events[0].type == "user.message" and events[-1].type == "session.status_idle", [x.type for x in events])
    messages = list(client.beta.sessions.events.list(session.id, types=["user.message"]))
    check(len(messages) == 2, messages)
    newest = client.beta.sessions.events.list(session.id, order="desc", limit=1)
    check(newest.data[0].id == ids[-1], newest)
    got = client.beta.sessions.retrieve(session.id)
    check(got.status == "idle" and got.usage.output_tokens > 0, got.usage)
    reconnect(session.id, ids)
    versions(agent)
    refused(agent, env)
    listing(session)
    interrupt(session)
    client.beta.sessions.delete(session.id)
    expect_error(anthropic.NotFoundError, "deleted session", lambda: client.beta.sessions.retrieve(session.id), 404)
    print("ALL OK")


def reconnect(session_id, ids):
    """A stream reopened with Last-Event-ID gets every event after it, none twice."""
    headers = {**BETA, "authorization": f"Bearer {KEY}", "last-event-id": ids[2]}
    got = []
    with httpx.stream("GET", f"{URL}/v1/sessions/{session_id}/events/stream", headers=headers, timeout=30) as r:
        check(r.status_code == 200, r.status_code)
        for line in r.iter_lines():
            if line.startswith("id: "):
                got.append(line[4:])
                if got[-1] == ids[-1]:
                    break
    check(got == ids[3:], (got, ids))


def interrupt(session):
    """A held turn withdrawn by user.interrupt: the session is idle and the use answers 410."""
    use = hold(session)
    seen = until_idle(session.id, [{"type": "user.interrupt"}])
    check([e.type for e in seen] == ["user.interrupt", "session.status_idle"], [e.type for e in seen])
    check(seen[-1].stop_reason.type == "end_turn", seen[-1])
    expect_error(anthropic.APIStatusError, "result after interrupt", lambda: client.beta.sessions.events.send(
        session.id, events=[{"type": "user.custom_tool_result", "custom_tool_use_id": use.id, "content": []}]), 410)
    check(client.beta.sessions.retrieve(session.id).status == "idle", "idle after interrupt")


def versions(agent):
    updated = client.beta.agents.update(agent.id, version=1, system="Be very brief.")
    check(updated.version == 2 and updated.system == "Be very brief.", updated)
    expect_error(anthropic.ConflictError, "stale version",
                 lambda: client.beta.agents.update(agent.id, version=1, name="x"), 409)
    check(client.beta.agents.retrieve(agent.id, version=1).system == "Be brief.", "version 1 kept")
    check([a.version for a in client.beta.agents.versions.list(agent.id)] == [2, 1], "versions")


def refused(agent, env):
    """What Turnstile does not have is 400 naming the field, never ignored."""
    cases = [
        ("mcp_servers", lambda: client.beta.agents.create(name="m", model=MODEL, mcp_servers=[
            {"type": "url", "name": "gh", "url": "https://mcp.example.com"}])),
        ("skills", lambda: client.beta.agents.create(name="s", model=MODEL, skills=[
            {"type": "anthropic", "skill_id": "xlsx"}])),
        ("tools[0].type", lambda: client.beta.agents.create(name="t", model=MODEL, tools=[
            {"type": "mcp_toolset", "mcp_server_name": "gh"}])),
        ("tools[0].default_config.permission_policy", lambda: client.beta.agents.create(name="a", model=MODEL, tools=[
            {"type": "agent_toolset_20260401", "default_config": {"permission_policy": {"type": "auto"}}}])),
        ("tools[0].configs", lambda: client.beta.agents.create(name="r", model=MODEL, tools=[
            {"type": "agent_toolset_20260401", "configs": [{"name": "read", "enabled": False}]}])),
        ("resources", lambda: client.beta.sessions.create(agent=agent.id, environment_id=env.id, resources=[
            {"type": "file", "file_id": "file_1"}])),
        ("vault_ids", lambda: client.beta.sessions.create(agent=agent.id, environment_id=env.id, vault_ids=["v1"])),
        ("config.packages", lambda: client.beta.environments.create(name="p", config={
            "type": "cloud", "packages": {"pip": ["requests"]}})),
    ]
    for field, fn in cases:
        e = expect_error(anthropic.BadRequestError, field, fn, 400)
        check(f"`{field}`" in e.body["error"]["message"], e.body)
    # As on the Messages routes: an unknown model and a denied one are one 400.
    e = expect_error(anthropic.BadRequestError, "unknown model",
                     lambda: client.beta.agents.create(name="x", model="no-such-model"), 400)
    check("no-such-model" in e.body["error"]["message"], e.body)
    r = httpx.get(f"{URL}/v1/agents", headers={"authorization": f"Bearer {KEY}"})
    check(r.status_code == 400 and "anthropic-beta" in r.json()["error"]["message"], r.text)


def listing(session):
    first = client.beta.sessions.create(agent=session.agent.id, environment_id=session.environment_id)
    page = client.beta.sessions.list(limit=1)
    check(len(page.data) == 1 and page.data[0].id == first.id and page.next_page, page)
    every = [s.id for s in client.beta.sessions.list(limit=1)]
    check(every[:2] == [first.id, session.id], every)
    check([s.id for s in other.beta.sessions.list()] == [], "bob sees none")
    archived = client.beta.sessions.archive(first.id)
    check(archived.archived_at is not None, archived)
    listed = [s.id for s in client.beta.sessions.list()]
    check(first.id not in listed and session.id in listed, "archived ones are not listed")
    check(first.id in [s.id for s in client.beta.sessions.list(include_archived=True)], "unless asked for")
    expect_error(anthropic.BadRequestError, "archived session", lambda: client.beta.sessions.events.send(
        first.id, events=[{"type": "user.message", "content": [{"type": "text", "text": "x"}]}]), 400)


def limit(cents):
    return {"type": "limit", "max_list_cost": {"amount": str(cents), "currency": "USD"}}


def part_budget():
    """MANAGED_PRICED names a priced model that calls `read_file` three times, each answer
    followed by a $1 model request: a session's budget withdraws the held use once spent,
    refuses the next turn, and lets the session go on when raised."""
    priced = os.environ["MANAGED_PRICED"]
    env = client.beta.environments.create(name="budgeted")
    cheap = client.beta.agents.create(name="unpriced", model=MODEL, tools=[READ_FILE])
    e = expect_error(anthropic.BadRequestError, "unpriced model", lambda: client.beta.sessions.create(
        agent=cheap.id, environment_id=env.id, budget=limit(100)), 400)
    check("model_not_budgetable" in e.body["error"]["message"], e.body)
    expect_error(anthropic.BadRequestError, "bad amount", lambda: client.beta.sessions.create(
        agent=cheap.id, environment_id=env.id, budget=limit("007")), 400)
    agent = client.beta.agents.create(name="priced", model=priced, tools=[READ_FILE])
    session = client.beta.sessions.create(agent=agent.id, environment_id=env.id, budget=limit(50))
    check(session.budget.max_list_cost.amount == "50" and session.usage.list_cost.amount == "0", session)
    ask = [{"type": "user.message", "content": [{"type": "text", "text": "read /a"}]}]
    seen = until_idle(session.id, ask)
    uses = [e for e in seen if e.type == "agent.custom_tool_use"]
    check(seen[-1].stop_reason.type == "requires_action" and len(uses) == 1, [e.type for e in seen])
    # The first result costs a $1 request, over the 50 cents: the next held use is withdrawn.
    seen = until_idle(session.id, [{"type": "user.custom_tool_result", "custom_tool_use_id": uses[0].id,
                                    "content": [{"type": "text", "text": "A"}]}])
    uses = [e for e in seen if e.type == "agent.custom_tool_use"]
    check(seen[-1].stop_reason.type == "budget_reached" and len(uses) == 1, [e.type for e in seen])
    got = client.beta.sessions.retrieve(session.id)
    # (The withdrawn turn may still report what its interrupted request cost.)
    check(got.status == "idle" and int(got.usage.list_cost.amount) >= 100, got.usage)
    expect_error(anthropic.APIStatusError, "result after the budget", lambda: client.beta.sessions.events.send(
        session.id, events=[{"type": "user.custom_tool_result", "custom_tool_use_id": uses[0].id, "content": []}]), 410)
    # A spent budget starts no turn: no model request.
    seen = until_idle(session.id, ask)
    check([e.type for e in seen] == ["user.message", "session.error", "session.status_idle"], [e.type for e in seen])
    check(seen[1].error.type == "billing_error" and seen[-1].stop_reason.type == "budget_reached", seen)
    # A budget is only raised above what was spent; then the session goes on.
    e = expect_error(anthropic.BadRequestError, "lowered budget",
                     lambda: client.beta.sessions.update(session.id, budget=limit(50)), 400)
    check("budget_not_raised" in e.body["error"]["message"], e.body)
    raised = client.beta.sessions.update(session.id, budget=limit(500))
    check(raised.budget.max_list_cost.amount == "500", raised)
    seen = until_idle(session.id, ask)
    check(seen[-1].stop_reason.type == "requires_action", [e.type for e in seen])
    # Removed, it cannot come back.
    check(client.beta.sessions.update(session.id, budget=None).budget is None, "removed")
    expect_error(anthropic.BadRequestError, "re-added budget",
                 lambda: client.beta.sessions.update(session.id, budget=limit(900)), 400)
    print("ALL OK")


def metric(name):
    r = httpx.get(f"{URL}/metrics", headers={"authorization": f"Bearer {KEY}"})
    check(r.status_code == 200, r.text)
    return sum(float(line.split()[-1]) for line in r.text.splitlines() if line.startswith(name))


def part_release():
    """Under `[continuity] idle_ttl_seconds = 1`: a session's next turn continues its kept
    backend thread; idle past the TTL, the thread is released and the next turn runs on a
    fresh one from the transcript."""
    import time
    env, agent, session = setup()
    answer(session, hold(session))
    hits = metric("turnstile_continuity_hits_total")
    answer(session, hold(session))
    check(metric("turnstile_continuity_hits_total") == hits + 1, "the kept thread carried on")
    released = 'turnstile_continuity_released_total{reason="ttl"}'
    deadline = time.monotonic() + 30
    while metric(released) < 1:
        check(time.monotonic() < deadline, "the idle thread was never released")
        time.sleep(0.2)
    misses = metric("turnstile_continuity_misses_total")
    answer(session, hold(session))
    check(metric("turnstile_continuity_misses_total") == misses + 1, "a fresh thread")
    check(metric("turnstile_continuity_hits_total") == hits + 1, "no kept thread")
    print("ALL OK")


def said_in(seen):
    return "".join(b.text for e in seen if e.type == "agent.message" for b in e.content)


def ask_tool(session, text):
    """A message whose turn runs a backend tool under always_ask: the tool use waits."""
    seen = until_idle(session.id, [{"type": "user.message", "content": [{"type": "text", "text": text}]}])
    uses = [e for e in seen if e.type == "agent.tool_use"]
    check(len(uses) == 1 and uses[0].name == "bash" and uses[0].evaluated_permission == "ask", seen)
    check(uses[0].evaluation.type == "always_ask", uses[0])
    idle = seen[-1]
    check(idle.stop_reason.type == "requires_action" and idle.stop_reason.event_ids == [uses[0].id], idle)
    check(client.beta.sessions.retrieve(session.id).status == "idle", "idle while it waits")
    return uses[0]


def part_confirm():
    """MANAGED_MODEL allows commands in its TOML policy; the agent's toolset asks for `bash`:
    the session waits on a tool confirmation of the one approval queue, allowed then denied
    (MANAGED_ALLOWED / MANAGED_DENIED in what the agent says after; MANAGED_DENY_SEEN=1: the
    deny_message reaches the model). MANAGED_DENY_MODEL, when set, denies commands in its
    TOML policy: the toolset's always_allow does not widen it."""
    env = client.beta.environments.create(name="confirm")
    toolset = {"type": "agent_toolset_20260401",
               "configs": [{"name": "bash", "permission_policy": {"type": "always_ask"}}]}
    agent = client.beta.agents.create(name="asker", model=MODEL, tools=[toolset])
    check(agent.tools[0].configs[0].permission_policy.type == "always_ask", agent.tools)
    session = client.beta.sessions.create(agent=agent.id, environment_id=env.id)
    use = ask_tool(session, PROMPT)
    # The same approval the console and /v1/approvals show.
    headers = {"authorization": f"Bearer {KEY}"}
    pending = httpx.get(f"{URL}/v1/approvals", headers=headers, params={"state": "pending"}).json()["data"]
    check(len(pending) == 1 and pending[0]["kind"] == "command", pending)
    confirm = lambda result, **more: [{"type": "user.tool_confirmation", "tool_use_id": use.id, "result": result, **more}]
    expect_error(anthropic.NotFoundError, "foreign confirmation",
                 lambda: other.beta.sessions.events.send(session.id, events=confirm("allow")), 404)
    expect_error(anthropic.BadRequestError, "deny_message with allow", lambda: client.beta.sessions.events.send(
        session.id, events=confirm("allow", deny_message="x")), 400)
    seen = until_idle(session.id, confirm("allow"))
    types = [e.type for e in seen]
    check(types[:2] == ["user.tool_confirmation", "session.status_running"], types)
    check(seen[-1].stop_reason.type == "end_turn", types)
    check(os.environ["MANAGED_ALLOWED"] in said_in(seen), said_in(seen))
    # The use ran: its result follows, naming it.
    results = [e for e in seen if e.type == "agent.tool_result"]
    check(len(results) == 1 and results[0].tool_use_id == use.id and not results[0].is_error, seen)
    check(types.index("agent.tool_result") < types.index("session.status_idle"), types)
    expect_error(anthropic.ConflictError, "second confirmation",
                 lambda: client.beta.sessions.events.send(session.id, events=confirm("deny")), 409)
    decided = httpx.get(f"{URL}/v1/approvals/{pending[0]['id']}", headers=headers).json()
    check(decided["state"] == "approved", decided)
    # Denied, with a message for the model (a new session: a fresh conversation).
    session = client.beta.sessions.create(agent=agent.id, environment_id=env.id)
    use = ask_tool(session, PROMPT)
    expect_error(anthropic.BadRequestError, "a deny_message over 1000 characters", lambda: client.beta.sessions.events.send(
        session.id, events=confirm("deny", deny_message="x" * 1001)), 400)
    seen = until_idle(session.id, confirm("deny", deny_message="not on a friday"))
    check(seen[-1].stop_reason.type == "end_turn", [e.type for e in seen])
    said = said_in(seen)
    check(os.environ["MANAGED_DENIED"] in said, said)
    # A result the agent reports for the declined use is an error.
    declined = [e for e in seen if e.type == "agent.tool_result"]
    check(all(e.tool_use_id == use.id and e.is_error for e in declined), declined)
    if os.environ.get("MANAGED_DENY_SEEN") == "1":
        check("not on a friday" in said, said)
    denied = httpx.get(f"{URL}/v1/approvals", headers=headers, params={"state": "denied"}).json()["data"]
    check(len(denied) == 1 and denied[0]["decision_reason"] == "not on a friday", denied)
    deny_model = os.environ.get("MANAGED_DENY_MODEL")
    if deny_model:
        widened = client.beta.agents.create(name="wide", model=deny_model,
                                            tools=[{"type": "agent_toolset_20260401"}])
        s2 = client.beta.sessions.create(agent=widened.id, environment_id=env.id)
        seen = until_idle(s2.id, [{"type": "user.message", "content": [{"type": "text", "text": PROMPT}]}])
        uses = [e for e in seen if e.type == "agent.tool_use"]
        check(len(uses) == 1 and uses[0].evaluated_permission == "deny" and uses[0].evaluation is None, seen)
        check(seen[-1].stop_reason.type == "end_turn", [e.type for e in seen])
    print("ALL OK")


def part_hold():
    env, agent, session = setup()
    use = hold(session)
    n = len(list(client.beta.sessions.events.list(session.id)))
    with open(os.environ["MANAGED_STATE"], "w") as f:
        json.dump({"session": session.id, "use": use.id, "events": n}, f)
    print("ALL OK")


def part_after_restart():
    with open(os.environ["MANAGED_STATE"]) as f:
        state = json.load(f)
    before = list(client.beta.sessions.events.list(state["session"]))
    check(len(before) >= state["events"], (len(before), state))
    # The held turn went with the process: its result is 410, and the session says why.
    result = [{"type": "user.custom_tool_result", "custom_tool_use_id": state["use"], "content": []}]
    expect_error(anthropic.APIStatusError, "result after restart",
                 lambda: client.beta.sessions.events.send(state["session"], events=result), 410)
    after = list(client.beta.sessions.events.list(state["session"]))
    check([e.id for e in after[:state["events"]]] == [e.id for e in before[:state["events"]]], "history intact")
    tail = [e.type for e in after[state["events"]:]]
    check(tail == ["session.error", "session.status_idle"], tail)
    check(after[-1].stop_reason.type == "retries_exhausted", after[-1])
    # The session goes on: a new message runs a fresh turn from the transcript.
    seen = until_idle(state["session"], [{"type": "user.message", "content": [{"type": "text", "text": "again"}]}])
    check(seen[-1].stop_reason.type in ("end_turn", "requires_action"), [e.type for e in seen])
    print("ALL OK")


def part_bound():
    """A result too big for what is left of the principal's stored event bytes is 429 before
    the held turn is claimed: the same use then takes a smaller result."""
    env, agent, session = setup()
    use = hold(session)
    big = [{"type": "user.custom_tool_result", "custom_tool_use_id": use.id,
            "content": [{"type": "text", "text": "x" * 40000}]}]
    expect_error(anthropic.RateLimitError, "a result over the bound",
                 lambda: client.beta.sessions.events.send(session.id, events=big), 429)
    answer(session, use)
    print("ALL OK")


def part_expire():
    """A held turn not answered before its execution's deadline expires by itself: the session
    says so and goes idle (`retries_exhausted`), and the use then answers 410."""
    env, agent, session = setup()
    seen = []
    with client.beta.sessions.events.stream(session.id) as stream:
        client.beta.sessions.events.send(session.id, events=[
            {"type": "user.message", "content": [{"type": "text", "text": PROMPT}]}])
        for event in stream:
            seen.append(event)
            if event.type == "session.status_idle" and event.stop_reason.type != "requires_action":
                break
    types = [e.type for e in seen]
    check(types[-2:] == ["session.error", "session.status_idle"], types)
    check(seen[-1].stop_reason.type == "retries_exhausted", seen[-1])
    use = [e for e in seen if e.type == "agent.custom_tool_use"][0]
    result = [{"type": "user.custom_tool_result", "custom_tool_use_id": use.id, "content": []}]
    expect_error(anthropic.APIStatusError, "result after expiry",
                 lambda: client.beta.sessions.events.send(session.id, events=result), 410)
    check(client.beta.sessions.retrieve(session.id).status == "idle", "idle")
    print("ALL OK")


def replica_b():
    return Anthropic(base_url=os.environ["MANAGED_OTHER_URL"], api_key=KEY, max_retries=0, timeout=60,
                     _strict_response_validation=True)


def part_cluster():
    """Two replicas: a session runs on the one it was made on (A). Through B, its stream, the
    message and the result are relayed to A, where the held turn resumes once; the history
    reads the same on both. A second session is left held on A for `cluster_taken`."""
    b = replica_b()
    env, agent, session = setup()
    use = hold(session, b)
    other_b = Anthropic(base_url=os.environ["MANAGED_OTHER_URL"], api_key=os.environ["TURNSTILE_OTHER_KEY"],
                        max_retries=0, timeout=60, _strict_response_validation=True)
    result = [{"type": "user.custom_tool_result", "custom_tool_use_id": use.id, "content": []}]
    expect_error(anthropic.NotFoundError, "foreign session on B",
                 lambda: other_b.beta.sessions.events.send(session.id, events=result), 404)
    answer(session, use, b)
    expect_error(anthropic.ConflictError, "duplicate result on A",
                 lambda: client.beta.sessions.events.send(session.id, events=result), 409)
    on_a = [e.id for e in client.beta.sessions.events.list(session.id)]
    on_b = [e.id for e in b.beta.sessions.events.list(session.id)]
    check(on_a == on_b and len(on_a) > 6, (on_a, on_b))
    check(b.beta.sessions.retrieve(session.id).status == "idle", "idle on B")
    held = client.beta.sessions.create(agent=agent.id, environment_id=env.id)
    use = hold(held)
    with open(os.environ["MANAGED_STATE"], "w") as f:
        json.dump({"session": held.id, "use": use.id}, f)
    print("ALL OK")


def part_cluster_taken():
    """A, which held the session, is gone: B takes the session over once A's lease lapses.
    The held use answers 410, the session says why, and its next turn runs on B."""
    b = replica_b()
    with open(os.environ["MANAGED_STATE"]) as f:
        state = json.load(f)
    result = [{"type": "user.custom_tool_result", "custom_tool_use_id": state["use"], "content": []}]
    expect_error(anthropic.APIStatusError, "result after the owner is gone",
                 lambda: b.beta.sessions.events.send(state["session"], events=result), 410)
    after = [e.type for e in b.beta.sessions.events.list(state["session"])]
    check(after[-2:] == ["session.error", "session.status_idle"], after)
    seen = until_idle(state["session"], [{"type": "user.message", "content": [{"type": "text", "text": PROMPT}]}], b)
    check(seen[-1].stop_reason.type == "requires_action", [e.type for e in seen])
    print("ALL OK")


{"all": main, "roundtrip": part_roundtrip, "budget": part_budget, "release": part_release, "confirm": part_confirm, "hold": part_hold, "after_restart": part_after_restart,
 "bound": part_bound, "expire": part_expire, "cluster": part_cluster, "cluster_taken": part_cluster_taken}[PART]()
