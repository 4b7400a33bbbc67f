"""The structured-output fields of an OpenAI request body, parsed to a StructuredOutput.

    response_format      {"type": "text"} | {"type": "json_object"}
                         | {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}
    structured_outputs   (vLLM's extension) exactly one of
                         {"json": schema} {"json_object": true} {"regex": "..."} {"choice": ["a", "b"]}
                         {"grammar": "..."}   (Lark, or GBNF as llama.cpp writes it)

The output always follows the schema (strict or not): decoding is constrained, not prompted.
Messages name the fields, never the values (a schema is content).
"""

from __future__ import annotations

import json
from typing import Any

from traceless.errors import InvalidRequestError
from traceless.http.body import decode_json
from traceless.http.errors import bad_request
from traceless.structured.spec import StructuredKind, StructuredOutput

_JSON_SCHEMA_KEYS = {"name", "schema", "strict"}
_STRUCTURED_KEYS = {
    "json": StructuredKind.JSON_SCHEMA,
    "json_object": StructuredKind.JSON_OBJECT,
    "regex": StructuredKind.REGEX,
    "choice": StructuredKind.CHOICE,
    "grammar": StructuredKind.GRAMMAR,
}


def _spec(name: str, kind: StructuredKind, source: str = "") -> StructuredOutput:
    try:
        return StructuredOutput(kind, source)
    except InvalidRequestError as exc:
        raise bad_request(str(exc), name) from None


def _schema_text(name: str, schema: Any) -> str:
    if not isinstance(schema, (dict, bool)):
        raise bad_request(f"'{name}' must be a JSON Schema object", name)
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


def response_format(name: str, v: Any) -> StructuredOutput | None:
    if not isinstance(v, dict) or not isinstance(v.get("type"), str):
        raise bad_request("'response_format' must be an object with a 'type'", name)
    kind = v["type"]
    if kind == "text" and set(v) == {"type"}:
        return None
    if kind == "json_object" and set(v) == {"type"}:
        return _spec(name, StructuredKind.JSON_OBJECT)
    if kind == "json_schema" and set(v) == {"type", "json_schema"}:
        js = v["json_schema"]
        where = "response_format.json_schema"
        if not isinstance(js, dict) or set(js) - _JSON_SCHEMA_KEYS:
            raise bad_request(f"'{where}' must be an object with 'name', 'schema' and optionally 'strict'", where)
        if not isinstance(js.get("name"), str) or not js["name"]:
            raise bad_request(f"'{where}.name' must be a non-empty string", where)
        if "strict" in js and not isinstance(js["strict"], bool) and js["strict"] is not None:
            raise bad_request(f"'{where}.strict' must be a boolean", where)
        if "schema" not in js:
            raise bad_request(f"'{where}.schema' is required", where, "missing_required_parameter")
        return _spec(name, StructuredKind.JSON_SCHEMA, _schema_text(f"{where}.schema", js["schema"]))
    raise bad_request(
        '\'response_format\' must be {"type": "text"}, {"type": "json_object"} or '
        '{"type": "json_schema", "json_schema": {...}}',
        name,
        "unsupported_parameter",
    )


def structured_outputs(name: str, v: Any) -> StructuredOutput:
    if not isinstance(v, dict) or len(v) != 1 or next(iter(v)) not in _STRUCTURED_KEYS:
        raise bad_request(
            "'structured_outputs' must have exactly one of 'json', 'json_object', 'regex', 'choice' or 'grammar'", name
        )
    key, value = next(iter(v.items()))
    where = f"{name}.{key}"
    kind = _STRUCTURED_KEYS[key]
    if kind is StructuredKind.JSON_OBJECT:
        if value is not True:
            raise bad_request(f"'{where}' must be true", where)
        return _spec(name, kind)
    if kind is StructuredKind.JSON_SCHEMA:
        if isinstance(value, str):
            try:
                value = decode_json(value)
            except ValueError:
                raise bad_request(f"'{where}' must be a JSON Schema (an object, or its JSON text)", where) from None
        return _spec(name, kind, _schema_text(where, value))
    if kind is StructuredKind.CHOICE:
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise bad_request(f"'{where}' must be a non-empty list of non-empty strings", where)
        return _spec(name, kind, json.dumps(value, ensure_ascii=False))
    if not isinstance(value, str) or not value:
        raise bad_request(f"'{where}' must be a non-empty string", where)
    return _spec(name, kind, value)
