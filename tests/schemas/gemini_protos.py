"""The Gemini API's wire schemas for derive.py: JSON Schema (2020-12) of v1beta messages from
the protobuf descriptors of the pinned `google-ai-generativelanguage` (the protos Google's
discovery document is generated from; no registry ships the document), under the proto3 JSON
mapping: lowerCamel `json_name`s, int64 as strings, bytes as base64, enums by name,
`Struct`/`Value` as any JSON. Proto3 has no required fields and Google's encoder omits
defaults, so only what the reference promises every answer has is required (REQUIRED); every
object is closed (`additionalProperties: false`), so a misspelt or invented field fails. The
error envelope is not a proto message: it is written from the API design guide's "Errors"
page (`{"error": {"code", "message", "status", "details"}}`, `status` a `google.rpc.Code`
name)."""

from __future__ import annotations

import importlib.metadata

B64 = r"^[A-Za-z0-9+/_-]*={0,2}$"
WKT = {
    "google.protobuf.Struct": {"type": "object"},
    "google.protobuf.Value": {},
    "google.protobuf.ListValue": {"type": "array"},
    "google.protobuf.Timestamp": {"type": "string", "format": "date-time"},
    "google.protobuf.Duration": {"type": "string", "pattern": r"^-?\d+(\.\d+)?s$"},
    "google.protobuf.FieldMask": {"type": "string"},
    "google.protobuf.Any": {"type": "object", "properties": {"@type": {"type": "string"}}},
}

# What every answer of the reference carries ($def name -> properties).
REQUIRED = {
    "GenerateContentResponse": ["candidates"],
    "Candidate": ["content"],
    "Content": ["parts", "role"],
    "FunctionCall": ["name"],
    "Model": ["name", "supportedGenerationMethods"],
    "ListModelsResponse": ["models"],
    "CountTokensResponse": ["totalTokens"],
}

CODES = [
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
    "UNAUTHENTICATED",
]


def scalar(F, t: int) -> dict:
    return {
        F.TYPE_DOUBLE: {"type": "number"}, F.TYPE_FLOAT: {"type": "number"},
        F.TYPE_INT32: {"type": "integer"}, F.TYPE_SINT32: {"type": "integer"},
        F.TYPE_SFIXED32: {"type": "integer"},
        F.TYPE_UINT32: {"type": "integer", "minimum": 0},
        F.TYPE_FIXED32: {"type": "integer", "minimum": 0},
        F.TYPE_INT64: {"type": "string", "pattern": r"^-?\d+$"},
        F.TYPE_SINT64: {"type": "string", "pattern": r"^-?\d+$"},
        F.TYPE_SFIXED64: {"type": "string", "pattern": r"^-?\d+$"},
        F.TYPE_UINT64: {"type": "string", "pattern": r"^\d+$"},
        F.TYPE_FIXED64: {"type": "string", "pattern": r"^\d+$"},
        F.TYPE_BOOL: {"type": "boolean"}, F.TYPE_STRING: {"type": "string"},
        F.TYPE_BYTES: {"type": "string", "pattern": B64},
    }[t]


def def_name(desc) -> str:
    # GenerateContentResponse.UsageMetadata -> GenerateContentResponseUsageMetadata
    return desc.full_name.split("generativelanguage.v1beta.", 1)[-1].replace(".", "")


def field_schema(F, f, defs: dict) -> dict:
    if f.type == F.TYPE_MESSAGE:
        if f.message_type.GetOptions().map_entry:
            value = f.message_type.fields_by_name["value"]
            s = {"type": "object", "additionalProperties": field_schema(F, value, defs)}
            return s
        full = f.message_type.full_name
        s = dict(WKT[full]) if full in WKT else {"$ref": "#/$defs/" + add(F, f.message_type, defs)}
    elif f.type == F.TYPE_ENUM:
        s = {"type": "string", "enum": [v.name for v in f.enum_type.values]}
    else:
        s = scalar(F, f.type)
    return {"type": "array", "items": s} if f.is_repeated else s


def add(F, desc, defs: dict) -> str:
    name = def_name(desc)
    if name in defs:
        return name
    defs[name] = {}  # reserved: messages may be recursive
    props = {f.json_name: field_schema(F, f, defs) for f in desc.fields}
    obj = {"type": "object", "properties": props, "additionalProperties": False}
    required = REQUIRED.get(name)
    if required:
        missing = [r for r in required if r not in props]
        if missing:
            raise SystemExit(f"google.py: {name} has no {missing} in the pinned protos")
        obj["required"] = required
    defs[name] = obj
    return name


def message(root: str) -> dict:
    from google.ai import generativelanguage_v1beta as gl
    from google.protobuf.descriptor import FieldDescriptor as F

    defs: dict = {}
    name = add(F, getattr(gl, root).pb().DESCRIPTOR, defs)
    return {"$ref": "#/$defs/" + name, "$defs": dict(sorted(defs.items()))}


def error() -> dict:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["error"],
        "properties": {"error": {
            "type": "object",
            "additionalProperties": False,
            "required": ["code", "message", "status"],
            "properties": {
                "code": {"type": "integer", "minimum": 400, "maximum": 599},
                "message": {"type": "string"},
                "status": {"type": "string", "enum": CODES},
                "details": {"type": "array", "items": {
                    "type": "object", "required": ["@type"],
                    "properties": {"@type": {"type": "string",
                                             "pattern": r"^type\.googleapis\.com/"}}}},
            },
        }},
    }


def schemas(finish) -> dict[str, dict]:
    """The Gemini schemas by file name, each passed through `finish(schema, source)`."""
    version = importlib.metadata.version("google-ai-generativelanguage")
    src = (f"google-ai-generativelanguage {version} google.ai.generativelanguage.v1beta.{{}} "
           "protobuf descriptor, proto3 JSON mapping, closed objects, REQUIRED of "
           "tests/schemas/gemini_protos.py.")
    out = {}
    for file, root in [
        ("gemini.response.json", "GenerateContentResponse"),
        ("gemini.count_tokens.json", "CountTokensResponse"),
        ("gemini.models.json", "ListModelsResponse"),
        ("gemini.model.json", "Model"),
    ]:
        out[file] = finish(message(root), src.format(root))
    out["gemini.error.json"] = finish(
        error(),
        "Hand-written from Google's API design guide (Errors): {error: {code, message, "
        "status, details}}, status a google.rpc.Code name.",
    )
    return out
