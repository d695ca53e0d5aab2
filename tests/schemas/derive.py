#!/usr/bin/env python3
"""Derive the wire JSON Schemas in tests/schemas/ from the pinned official SDKs.

Each schema is pydantic's JSON Schema (draft 2020-12, self-contained, `$defs` only) of one
typed model of the pinned `openai` / `anthropic` Python SDKs (versions in
tests/clients/requirements.txt), tightened by OVERLAY below: the Python SDKs declare both
"optional" and "required but nullable" properties as `Optional[X] = None`, so the raw schema
accepts a missing key where the API reference promises one, and `null` where it promises a
value. OVERLAY restores those facts from the published references (the TypeScript SDKs'
declaration files, whose `name: T` / `name?: T` / `| null` spell them out, and the Open
Responses specification for the Responses object).

    .cache/venv/bin/python tests/schemas/derive.py           # (re)write the schema files
    .cache/venv/bin/python tests/schemas/derive.py --check   # exit 1 if a file is stale

Output is deterministic (json.dumps(indent=1, sort_keys=True) plus a newline), so `--check`
compares bytes.
"""

from __future__ import annotations

import argparse
import copy
import importlib.metadata
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable

import pydantic

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gemini_protos  # noqa: E402  (the Gemini API's schemas)

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE.parent / "clients" / "requirements.txt"
DRAFT = "https://json-schema.org/draft/2020-12/schema"

# pydantic's validation mode: `required` lists exactly the fields without a default. (For these
# SDK models the serialization mode gives the same output, as json_schema_serialization_defaults_
# required is not set; validation is the mode whose `required` means "has no default".)
MODE = "validation"

# The references the overlay follows (fixed strings so the output does not depend on what happens
# to be installed next to the venv).
OPENAI_TS = "openai-node 6.49.0 (tests/clients/package.json)"
ANTHROPIC_TS = "@anthropic-ai/sdk 1.17.0 (npm)"
OPEN_RESPONSES = "Open Responses specification 2026-04-24 (ResponseResource)"

# --------------------------------------------------------------------------------------------
# Overlay: group -> {$def name (or the root model's title) -> rule}
#   "required": add to the object's `required` (the property keeps a null branch if it has one)
#   "not_null": remove the `{"type": "null"}` branch (and `default: null`) from the property
#   "add":      properties the SDK model lacks, added with the given schema (only if absent)
#   "replace":  properties whose SDK schema the reference widens, replaced by the given one
# Every named $def and property must exist in each schema the group is applied to (a renamed
# or vanished SDK field fails loudly instead of silently loosening the schema).
# --------------------------------------------------------------------------------------------
NUM = {"type": "number"}
INT = {"type": "integer"}
BOOL = {"type": "boolean"}

OVERLAY: dict[str, dict[str, dict[str, Any]]] = {
    # Chat Completions, non-streaming. Follows openai-node 6.49.0
    # resources/chat/completions/completions.d.ts (the OpenAI API reference's ChatCompletion).
    "chat.completion": {
        # ChatCompletion: `system_fingerprint?: string` and `usage?: CompletionUsage` are
        # optional but never null.
        "ChatCompletion": {
            "required": ["id", "choices", "created", "model", "object"],
            "not_null": ["system_fingerprint", "usage"],
        },
        # ChatCompletion.Choice: `logprobs: Choice.Logprobs | null` is required (nullable).
        "Choice": {"required": ["finish_reason", "index", "logprobs", "message"]},
        # ChatCompletionMessage: `content: string | null`, `refusal: string | null` required.
        # `annotations` is `annotations?: Array<Annotation>` in the d.ts; the product requires it
        # present (an empty array when there are none), following the issue that asked for it.
        # `tool_calls?: Array<...>` is optional, never null.
        "ChatCompletionMessage": {
            "required": ["role", "content", "refusal", "annotations"],
            "not_null": ["annotations", "tool_calls"],
        },
        "ChatCompletionMessageFunctionToolCall": {"required": ["id", "type", "function"]},
        "Function": {"required": ["name", "arguments"]},
        "ChatCompletionMessageCustomToolCall": {"required": ["id", "type", "custom"]},
        "Custom": {"required": ["name", "input"]},
    },
    # Chat Completions, streaming. Follows openai-node 6.49.0 completions.d.ts ChatCompletionChunk.
    "chat.completion.chunk": {
        # `usage?: CompletionUsage | null` stays optional and nullable.
        "ChatCompletionChunk": {
            "required": ["id", "choices", "created", "model", "object"],
            "not_null": ["system_fingerprint"],
        },
        # ChatCompletionChunk.Choice: `finish_reason: ... | null` required (nullable);
        # `logprobs?: ... | null` stays optional and nullable.
        "Choice": {"required": ["delta", "finish_reason", "index"]},
        # Choice.Delta: content/refusal are `?: string | null`; the rest `?: T` (never null).
        "ChoiceDelta": {"not_null": ["function_call", "role", "tool_calls"]},
        "ChoiceDeltaToolCall": {"required": ["index"], "not_null": ["id", "function", "type"]},
        "ChoiceDeltaToolCallFunction": {"not_null": ["arguments", "name"]},
        "ChoiceDeltaFunctionCall": {"not_null": ["arguments", "name"]},
    },
    # Shared by both Chat Completions objects. Follows openai-node 6.49.0 completions.d.ts
    # (CompletionUsage, ChatCompletionTokenLogprob, Choice.Logprobs).
    "chat.shared": {
        "CompletionUsage": {
            "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
            "not_null": ["completion_tokens_details", "prompt_tokens_details"],
        },
        "CompletionTokensDetails": {
            "not_null": [
                "accepted_prediction_tokens",
                "audio_tokens",
                "reasoning_tokens",
                "rejected_prediction_tokens",
            ]
        },
        "PromptTokensDetails": {"not_null": ["audio_tokens", "cache_write_tokens", "cached_tokens"]},
        # Choice.Logprobs: `content: ... | null; refusal: ... | null` both required.
        "ChoiceLogprobs": {"required": ["content", "refusal"]},
        # `bytes: Array<number> | null` required in both.
        "ChatCompletionTokenLogprob": {"required": ["token", "bytes", "logprob", "top_logprobs"]},
        "TopLogprob": {"required": ["token", "bytes", "logprob"]},
    },
    # Responses. The Response object follows the Open Responses specification 2026-04-24, whose
    # ResponseResource requires every property below; the output items and usage follow the same
    # specification (and agree with openai-node 6.49.0 resources/responses/responses.d.ts).
    "responses": {
        "Response": {
            "required": [
                "id", "object", "created_at", "completed_at", "status", "incomplete_details",
                "model", "previous_response_id", "instructions", "output", "error", "tools",
                "tool_choice", "truncation", "parallel_tool_calls", "text", "top_p",
                "presence_penalty", "frequency_penalty", "top_logprobs", "temperature",
                "reasoning", "user", "usage", "max_output_tokens", "max_tool_calls", "store",
                "background", "service_tier", "metadata", "safety_identifier",
                "prompt_cache_key",
            ],
            # Numbers, integers, booleans, strings and objects that are never null. `status` is
            # a required string enum in ResponseResource (not nullable). Nullable (kept):
            # completed_at, incomplete_details, previous_response_id, instructions, error,
            # reasoning, user, usage, max_output_tokens, max_tool_calls, safety_identifier,
            # prompt_cache_key.
            "not_null": [
                "status", "top_p", "temperature", "presence_penalty", "frequency_penalty",
                "top_logprobs", "truncation", "parallel_tool_calls", "store", "background",
                "service_tier", "text", "tools", "output", "metadata",
            ],
            # In ResponseResource, absent from the openai-python 3.57.0 Response model.
            "add": {
                "presence_penalty": {**NUM, "title": "Presence Penalty"},
                "frequency_penalty": {**NUM, "title": "Frequency Penalty"},
                "store": {**BOOL, "title": "Store"},
                "user": {"anyOf": [{"type": "string"}, {"type": "null"}], "title": "User"},
                "top_logprobs": {**INT, "title": "Top Logprobs"},
            },
        },
        # The Open Responses `Error` object's `code` is a string; the SDK's closed list of
        # OpenAI's own codes does not bind another implementation's (Turnstile's stable codes).
        "ResponseError": {"replace": {"code": {"type": "string", "title": "Code"}}},
        "ResponseOutputMessage": {"required": ["id", "type", "role", "status", "content"]},
        "ResponseOutputText": {"required": ["type", "text", "annotations"]},
        "ResponseFunctionToolCall": {"required": ["type", "call_id", "name", "arguments"]},
        "ResponseUsage": {
            "required": [
                "input_tokens", "input_tokens_details", "output_tokens",
                "output_tokens_details", "total_tokens",
            ]
        },
        "InputTokensDetails": {"required": ["cached_tokens"]},
        "OutputTokensDetails": {"required": ["reasoning_tokens"]},
    },
    # Messages. Follows @anthropic-ai/sdk 1.17.0 resources/messages/messages.d.ts (the Anthropic
    # Messages reference): every property declared without `?` is required, `| null` ones stay
    # nullable, and non-null ones lose the null branch the Python SDK gives them.
    "messages": {
        "Message": {
            "required": [
                "id", "container", "content", "diagnostics", "model", "role", "stop_details",
                "stop_reason", "stop_sequence", "type", "usage",
            ]
        },
        "TextBlock": {"required": ["citations", "text", "type"]},
        # `caller: DirectCaller | ServerToolCaller | ServerToolCaller20260120` is required and
        # not nullable; `toolset_name?: string | null` stays optional.
        "ToolUseBlock": {
            "required": ["id", "caller", "input", "name", "type"],
            "not_null": ["caller"],
        },
        "ThinkingBlock": {"required": ["signature", "thinking", "type"]},
        "RedactedThinkingBlock": {"required": ["data", "type"]},
        "Usage": {
            "required": [
                "cache_creation", "cache_creation_input_tokens", "cache_read_input_tokens",
                "inference_geo", "input_tokens", "output_tokens", "output_tokens_details",
                "server_tool_use", "service_tier", "speed",
            ]
        },
        # Sub-objects of Message / Usage, same d.ts.
        "Container": {"required": ["id", "expires_at", "skills"]},
        "Diagnostics": {"required": ["cache_miss_reason"]},
        "RefusalStopDetails": {"required": ["category", "explanation", "type"]},
        "ServerToolUsage": {"required": ["web_fetch_requests", "web_search_requests"]},
        "CacheCreation": {"required": ["ephemeral_1h_input_tokens", "ephemeral_5m_input_tokens"]},
        "OutputTokensDetails": {"required": ["thinking_tokens"]},
    },
    # Messages stream only (same d.ts): message_delta's `delta` and `usage`.
    "messages.stream": {
        "Delta": {"required": ["container", "stop_details", "stop_reason", "stop_sequence"]},
        "MessageDeltaUsage": {
            "required": [
                "cache_creation_input_tokens", "cache_read_input_tokens", "input_tokens",
                "output_tokens", "output_tokens_details", "server_tool_use",
            ]
        },
    },
}

# Open Responses: every streaming event carries `type` and `sequence_number`. Applied to every
# member of the responses.event root union.
RESPONSES_EVENT_REQUIRED = ["type", "sequence_number"]


# --------------------------------------------------------------------------------------------
# Schema surgery
# --------------------------------------------------------------------------------------------
class OverlayError(Exception):
    pass


NULL = {"type": "null"}


def resolve(root: dict, s: dict) -> dict:
    ref = s.get("$ref")
    if ref is None:
        return s
    m = re.fullmatch(r"#/\$defs/([^/]+)", ref)
    if not m or m.group(1) not in root.get("$defs", {}):
        raise OverlayError(f"unresolvable $ref {ref!r}")
    return root["$defs"][m.group(1)]


def may_be_null(root: dict, s: Any, seen: frozenset = frozenset()) -> bool:
    """Whether `null` could validate against s (conservative: True when unsure)."""
    if s is True or s == {}:
        return True
    if not isinstance(s, dict):
        return False
    if "$ref" in s:
        if s["$ref"] in seen:
            return False
        return may_be_null(root, resolve(root, s), seen | {s["$ref"]})
    for key in ("anyOf", "oneOf"):
        if key in s:
            return any(may_be_null(root, b, seen) for b in s[key])
    if "const" in s:
        return s["const"] is None
    if "enum" in s:
        return None in s["enum"]
    t = s.get("type")
    if t is None:
        return "allOf" not in s or all(may_be_null(root, b, seen) for b in s["allOf"])
    return t == "null" or (isinstance(t, list) and "null" in t)


def strip_null(root: dict, prop: dict, where: str) -> dict:
    out = {k: v for k, v in prop.items() if not (k == "default" and v is None)}
    if "anyOf" in out:
        branches = [b for b in out["anyOf"] if b != NULL]
        if not branches:
            raise OverlayError(f"{where}: only a null branch")
        del out["anyOf"]
        if len(branches) == 1 and not (set(branches[0]) & set(out)):
            out.update(branches[0])
        else:
            out["anyOf"] = branches
    elif isinstance(out.get("type"), list):
        out["type"] = [t for t in out["type"] if t != "null"]
    if "enum" in out:
        out["enum"] = [v for v in out["enum"] if v is not None]
    if may_be_null(root, out):
        raise OverlayError(f"{where}: still accepts null after removing the null branch: {out}")
    return out


def target(root: dict, name: str) -> dict:
    defs = root.get("$defs", {})
    if name in defs:
        return defs[name]
    if root.get("title") == name and "properties" in root:
        return root
    raise OverlayError(f"overlay names {name!r}, which is neither a $def nor the root")


def apply_rule(root: dict, name: str, rule: dict) -> None:
    unknown = set(rule) - {"required", "not_null", "add", "replace"}
    if unknown:
        raise OverlayError(f"{name}: unknown rule keys {sorted(unknown)}")
    obj = target(root, name)
    props = obj.setdefault("properties", {})
    for key, schema in rule.get("add", {}).items():
        if key not in props:
            props[key] = {
                **copy.deepcopy(schema),
                "description": "Added by the overlay of tests/schemas/derive.py: in the reference, "
                "absent from the SDK model.",
            }
    for key, schema in rule.get("replace", {}).items():
        if key not in props:
            raise OverlayError(f"{name}.{key}: replace names a property the schema lacks")
        props[key] = {
            **copy.deepcopy(schema),
            "description": "Replaced by the overlay of tests/schemas/derive.py (see the rule).",
        }
    for key in rule.get("not_null", []):
        if key not in props:
            raise OverlayError(f"{name}.{key}: not_null names a property the schema lacks")
        props[key] = strip_null(root, props[key], f"{name}.{key}")
    required = obj.setdefault("required", [])
    for key in rule.get("required", []):
        if key not in props:
            raise OverlayError(f"{name}.{key}: required names a property the schema lacks")
        if key not in required:
            required.append(key)
        props[key].pop("default", None)


def require_on_union_members(root: dict, keys: list[str]) -> None:
    members = root.get("anyOf") or root.get("oneOf")
    if not members:
        raise OverlayError("root is not a union")
    for member in members:
        apply_rule(root, member["$ref"].rsplit("/", 1)[1], {"required": keys})


# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------
def sdk_schema(tp: Any) -> dict:
    return pydantic.TypeAdapter(tp).json_schema(mode=MODE)


def openai_error() -> dict:
    # Hand-written: the OpenAI API reference's Error object (also openai-node 6.49.0
    # resources/shared.d.ts ErrorObject: `code: string | null; message: string;
    # param: string | null; type: string;`), wrapped as the API returns it: {"error": {...}}.
    nullable_str = {"anyOf": [{"type": "string"}, NULL]}
    return {
        "$defs": {
            "ErrorObject": {
                "additionalProperties": True,
                "properties": {
                    "code": {**nullable_str, "title": "Code"},
                    "message": {"title": "Message", "type": "string"},
                    "param": {**nullable_str, "title": "Param"},
                    "type": {"title": "Type", "type": "string"},
                },
                "required": ["message", "type", "param", "code"],
                "title": "ErrorObject",
                "type": "object",
            }
        },
        "additionalProperties": True,
        "properties": {"error": {"$ref": "#/$defs/ErrorObject"}},
        "required": ["error"],
        "title": "ErrorResponse",
        "type": "object",
    }


def anthropic_error() -> tuple[dict, str]:
    import anthropic.types as t

    if hasattr(t, "ErrorResponse"):
        schema = sdk_schema(t.ErrorResponse)
        # Anthropic's errors reference (and Claude Code's gateway protocol) answer a body over
        # the size limit with 413 `request_too_large`, a type the SDK's union leaves out.
        defs = schema["$defs"]
        too_large = copy.deepcopy(defs["InvalidRequestErrorObject"])
        too_large["title"] = "RequestTooLargeErrorObject"
        too_large["properties"]["type"]["const"] = "request_too_large"
        defs["RequestTooLargeErrorObject"] = too_large
        union = schema["properties"]["error"]["anyOf"]
        union.append({"$ref": "#/$defs/RequestTooLargeErrorObject"})
        return schema, "anthropic.types.ErrorResponse (+ request_too_large)"
    nullable_str = {"anyOf": [{"type": "string"}, NULL], "default": None}
    return (
        {
            "$defs": {
                "ErrorObject": {
                    "additionalProperties": True,
                    "properties": {
                        "message": {"title": "Message", "type": "string"},
                        "type": {"title": "Type", "type": "string"},
                    },
                    "required": ["type", "message"],
                    "title": "ErrorObject",
                    "type": "object",
                }
            },
            "additionalProperties": True,
            "properties": {
                "error": {"$ref": "#/$defs/ErrorObject"},
                "request_id": {**nullable_str, "title": "Request Id"},
                "type": {"const": "error", "title": "Type", "type": "string"},
            },
            "required": ["type", "error"],
            "title": "ErrorResponse",
            "type": "object",
        },
        "hand-written (the SDK has no ErrorResponse)",
    )


def versions() -> dict[str, str]:
    return {
        "openai": importlib.metadata.version("openai"),
        "anthropic": importlib.metadata.version("anthropic"),
        "google-ai-generativelanguage": importlib.metadata.version("google-ai-generativelanguage"),
    }


def build() -> dict[str, dict]:
    from anthropic.types import Message, RawMessageStreamEvent
    from openai.types.chat import ChatCompletion, ChatCompletionChunk
    from openai.types.responses import Response, ResponseStreamEvent

    v = versions()
    oa = f"openai-python {v['openai']}"
    an = f"anthropic-sdk-python {v['anthropic']}"
    how = (
        f"pydantic TypeAdapter(...).json_schema(mode={MODE!r}), tightened by the OVERLAY "
        "table of tests/schemas/derive.py"
    )
    regen = "Generated; do not edit. Regenerate: .cache/venv/bin/python tests/schemas/derive.py."

    specs: list[tuple[str, Callable[[], dict], str, list[str], bool]] = [
        (
            "chat.completion.json",
            lambda: sdk_schema(ChatCompletion),
            f"{oa} openai.types.chat.ChatCompletion via {how}, following {OPENAI_TS} "
            "resources/chat/completions/completions.d.ts (OpenAI API reference); "
            "ChatCompletionMessage.annotations is required by the product.",
            ["chat.completion", "chat.shared"],
            False,
        ),
        (
            "chat.completion.chunk.json",
            lambda: sdk_schema(ChatCompletionChunk),
            f"{oa} openai.types.chat.ChatCompletionChunk via {how}, following {OPENAI_TS} "
            "resources/chat/completions/completions.d.ts (OpenAI API reference).",
            ["chat.completion.chunk", "chat.shared"],
            False,
        ),
        (
            "responses.response.json",
            lambda: sdk_schema(Response),
            f"{oa} openai.types.responses.Response via {how}, following the {OPEN_RESPONSES}.",
            ["responses"],
            False,
        ),
        (
            "responses.event.json",
            lambda: sdk_schema(ResponseStreamEvent),
            f"{oa} openai.types.responses.ResponseStreamEvent via {how}, following the "
            f"{OPEN_RESPONSES}; every event requires type and sequence_number.",
            ["responses"],
            True,
        ),
        (
            "messages.message.json",
            lambda: sdk_schema(Message),
            f"{an} anthropic.types.Message via {how}, following {ANTHROPIC_TS} "
            "resources/messages/messages.d.ts (Anthropic Messages reference).",
            ["messages"],
            False,
        ),
        (
            "messages.event.json",
            lambda: sdk_schema(RawMessageStreamEvent),
            f"{an} anthropic.types.RawMessageStreamEvent via {how}, following {ANTHROPIC_TS} "
            "resources/messages/messages.d.ts (Anthropic Messages reference).",
            ["messages", "messages.stream"],
            False,
        ),
    ]

    out: dict[str, dict] = {}
    for filename, make, source, groups, events in specs:
        schema = make()
        for group in groups:
            for name, rule in OVERLAY[group].items():
                try:
                    apply_rule(schema, name, rule)
                except OverlayError as e:
                    raise OverlayError(f"{filename} [{group}] {e}") from None
        if events:
            require_on_union_members(schema, RESPONSES_EVENT_REQUIRED)
        out[filename] = finish(schema, source, regen)

    err, err_src = anthropic_error()
    if err_src.startswith("anthropic."):
        err_src = f"{an} {err_src} via pydantic TypeAdapter(...).json_schema(mode={MODE!r})"
    out["messages.error.json"] = finish(
        err,
        f"{err_src}, no overlay (request_id stays optional and nullable, as in the Python SDK). "
        "The Anthropic Messages error envelope {type: 'error', error: {type, message}}.",
        regen,
    )
    out["openai.error.json"] = finish(
        openai_error(),
        "Hand-written from the OpenAI API reference's Error object ({error: {message, type, "
        f"param, code}}, all four required, param and code nullable; {OPENAI_TS} "
        "resources/shared.d.ts ErrorObject agrees).",
        regen,
    )
    out.update(gemini_protos.schemas(lambda schema, source: finish(schema, source, regen)))
    return out


def finish(schema: dict, source: str, regen: str) -> dict:
    check_refs(schema)
    return {"$comment": f"{source} {regen}", "$schema": DRAFT, **schema}


def check_refs(schema: Any, root: dict | None = None) -> None:
    """Every $ref must be internal (#/$defs/...) and resolve."""
    root = schema if root is None else root
    if isinstance(schema, dict):
        if "$ref" in schema:
            resolve(root, schema)
        for v in schema.values():
            check_refs(v, root)
    elif isinstance(schema, list):
        for v in schema:
            check_refs(v, root)


def render(schema: dict) -> str:
    return json.dumps(schema, indent=1, sort_keys=True) + "\n"


def check_pins() -> None:
    pins = {}
    for line in REQUIREMENTS.read_text().splitlines():
        m = re.fullmatch(r"\s*(openai|anthropic|google-ai-generativelanguage)==(\S+)\s*", line)
        if m:
            pins[m.group(1)] = m.group(2)
    have = versions()
    bad = [f"{k} {have[k]} installed, {v} pinned" for k, v in pins.items() if have[k] != v]
    if bad:
        sys.exit(f"derive.py: the SDKs are not the pinned ones ({'; '.join(bad)}); "
                 f"install tests/clients/requirements.txt")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="regenerate in memory; exit 1 if a committed file differs")
    args = ap.parse_args()
    check_pins()
    try:
        schemas = build()
    except OverlayError as e:
        print(f"derive.py: overlay does not apply: {e}", file=sys.stderr)
        return 2
    stale = []
    for name, schema in schemas.items():
        path = HERE / name
        text = render(schema)
        if args.check:
            if not path.exists():
                stale.append(f"{name}: missing")
            elif path.read_text() != text:
                stale.append(f"{name}: differs from the derived schema")
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(HERE.parent.parent)} ({len(text)} bytes)")
    if stale:
        for s in stale:
            print(f"derive.py --check: tests/schemas/{s}", file=sys.stderr)
        print("derive.py --check: regenerate with .cache/venv/bin/python tests/schemas/derive.py",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
