"""Tool calls on chat completions: the request's `tools` and `tool_choice`, the grammar that forces
a call, and the parser that finds calls in the model's output.

    tool_choice   none      tools are rendered, the output is plain content
                  auto      the model decides; calls are parsed from its output
                  required  the output is one or more calls (one with parallel_tool_calls false)
                  {"type": "function", "function": {"name": ...}}   exactly one call of that function

Calls are written the Hermes way (Qwen2.5 and most open chat models):
    <tool_call>\\n{"name": "...", "arguments": {...}}\\n</tool_call>
SmolLM2's way (its template, templates/smollm2-tools.jinja), a list in one block:
    <tool_call>[\\n{"name": "...", "arguments": {...}},\\n...\\n]</tool_call>
or Llama 3.1's (a bare JSON object, several joined by "; ").
`required` and named choices are enforced by a grammar (structured outputs), so the name is one of
the tools and the arguments validate against its `parameters` schema. Messages name fields, never
values: a tool's name, description and schema are content.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, cast

from traceless.http.errors import bad_request
from traceless.structured.spec import StructuredKind, StructuredOutput

MAX_TOOLS = 64
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")  # OpenAI's rule for function names
START, END = "<tool_call>", "</tool_call>"


class ToolFormat(Enum):
    HERMES = "hermes"
    SMOLLM2 = "smollm2"
    LLAMA3_JSON = "llama3_json"


def tool_format(template: str | None) -> ToolFormat:
    """The call format of the model whose chat template this is (Hermes unless it is SmolLM2's list
    or Llama 3's)."""
    if template is not None and "<tool_call>[" in template:
        return ToolFormat.SMOLLM2
    if (
        template is not None
        and "<tool_call>" not in template
        and ("<|python_tag|>" in template or "ipython" in template)
    ):
        return ToolFormat.LLAMA3_JSON
    return ToolFormat.HERMES


@dataclass(frozen=True, slots=True)
class ToolRequest:
    tools: list[dict]  # OpenAI tool objects as given (rendered by the chat template)
    choice: str  # "none" | "auto" | "required" | "named"
    named: str | None = None
    parallel: bool = True
    format: ToolFormat = ToolFormat.HERMES

    @property
    def parses_calls(self) -> bool:
        return self.choice != "none"

    def __repr__(self) -> str:
        return f"ToolRequest(tools={len(self.tools)}, choice={self.choice})"


def parse_tools(tools: Any, choice: Any, parallel: Any, fmt: ToolFormat = ToolFormat.HERMES) -> ToolRequest | None:
    if tools is None or tools == []:
        if choice not in (None, "none") or parallel is not None:
            raise bad_request("'tool_choice' and 'parallel_tool_calls' need 'tools'", "tool_choice")
        return None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise bad_request(f"'tools' must be a list of at most {MAX_TOOLS} tools", "tools")
    names = [_tool(i, t) for i, t in enumerate(tools)]
    if len(set(names)) != len(names):
        raise bad_request("'tools' names the same function twice", "tools")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_request("'parallel_tool_calls' must be a boolean", "parallel_tool_calls")
    par = True if parallel is None else parallel
    if choice is None:
        return ToolRequest(tools, "auto", None, par, fmt)
    if choice in ("none", "auto", "required"):
        return ToolRequest(tools, choice, None, par, fmt)
    if (
        isinstance(choice, dict)
        and set(choice) == {"type", "function"}
        and choice["type"] == "function"
        and isinstance(choice["function"], dict)
        and set(choice["function"]) == {"name"}
    ):
        name = choice["function"]["name"]
        if name not in names:
            raise bad_request("'tool_choice' names a function that is not in 'tools'", "tool_choice")
        return ToolRequest(tools, "named", name, par, fmt)
    raise bad_request(
        "'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": {\"name\": ...}}",
        "tool_choice",
    )


def _tool(i: int, t: Any) -> str:
    where = f"tools[{i}]"
    if not isinstance(t, dict) or t.get("type") != "function" or set(t) != {"type", "function"}:
        raise bad_request(f'\'{where}\' must be {{"type": "function", "function": {{...}}}}', where)
    f = t["function"]
    if not isinstance(f, dict) or set(f) - {"name", "description", "parameters", "strict"}:
        raise bad_request(f"'{where}.function' takes 'name', 'description', 'parameters' and 'strict'", where)
    if not isinstance(f.get("name"), str) or not _NAME.match(f["name"]):
        raise bad_request(f"'{where}.function.name' must be 1-64 letters, digits, '_', '.' or '-'", where)
    if f.get("description") is not None and not isinstance(f["description"], str):
        raise bad_request(f"'{where}.function.description' must be a string", where)
    if f.get("parameters") is not None and not isinstance(f["parameters"], dict):
        raise bad_request(f"'{where}.function.parameters' must be a JSON Schema object", where)
    if f.get("strict") is not None and not isinstance(f["strict"], bool):
        raise bad_request(f"'{where}.function.strict' must be a boolean", where)
    return f["name"]


def _call_schema(function: dict, args_key: str) -> dict:
    params = function.get("parameters") or {"type": "object", "properties": {}}
    return {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, args_key: params},
        "required": ["name", args_key],
        "additionalProperties": False,
    }


def forced_call_grammar(req: ToolRequest) -> StructuredOutput | None:
    """The grammar of `required` / named choices (None for none / auto)."""
    if req.choice not in ("required", "named"):
        return None
    functions = [t["function"] for t in req.tools if req.choice == "required" or t["function"]["name"] == req.named]
    llama = req.format is ToolFormat.LLAMA3_JSON
    schemas = [_call_schema(f, "parameters" if llama else "arguments") for f in functions]
    schema: dict = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    schema["x-guidance"] = {"whitespace_flexible": False}
    body = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    many = req.choice == "required" and req.parallel
    if llama:
        lark = "start: call" + (' ("; " call)*' if many else "") + f"\ncall: %json {body}\n"
    elif req.format is ToolFormat.SMOLLM2:
        lark = (
            f'start: "{START}[\\n" call' + (' (",\\n" call)*' if many else "") + f' "\\n]{END}"\ncall: %json {body}\n'
        )
    else:
        lark = "start: call" + (' ("\\n" call)*' if many else "") + f'\ncall: "{START}\\n" %json {body} "\\n{END}"\n'
    return StructuredOutput(StructuredKind.GRAMMAR, lark)


# --- parsing the output -----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it

    def as_dict(self, index: int | None = None) -> dict:
        d: dict = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            d["index"] = index
        return d


def _calls(body: str) -> list[ToolCall] | None:
    """A block's calls: one object (Hermes) or a list of them (SmolLM2; [] is no call)."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return None
    objs = obj if isinstance(obj, list) else [obj]
    calls = [_one(o) for o in objs]
    return None if any(c is None for c in calls) else cast(list[ToolCall], calls)


def _one(obj: Any) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if not isinstance(args, dict):
        return None
    return ToolCall(
        f"call_{uuid.uuid4().hex[:24]}", obj["name"], json.dumps(args, separators=(",", ":"), ensure_ascii=False)
    )


@dataclass(slots=True)
class HermesParser:
    """Incremental: feed() text as it is generated and get (content, calls) that are final. Text
    that may start a call is held back until it is known; a call is released once it closes. A
    block that does not parse as a call stays content, as the model wrote it."""

    buffer: str = ""
    calls: list[ToolCall] = field(default_factory=list)

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self.buffer += text
        content, found = [], []
        while True:
            start = self.buffer.find(START)
            if start < 0:
                keep = _partial_suffix(self.buffer, START)
                content.append(self.buffer[: len(self.buffer) - keep])
                self.buffer = self.buffer[len(self.buffer) - keep :]
                break
            content.append(self.buffer[:start])
            end = self.buffer.find(END, start)
            if end < 0:
                self.buffer = self.buffer[start:]
                break
            block = self.buffer[start : end + len(END)]
            self.buffer = self.buffer[end + len(END) :]
            calls = _calls(block[len(START) : -len(END)])
            if calls is None:
                content.append(block)
            else:
                found.extend(calls)
        self.calls.extend(found)
        text_out = "".join(content)
        if self.calls and not text_out.strip():
            text_out = ""  # whitespace between calls is not content
        return text_out, found

    def finish(self) -> str:
        """The held-back text once the output has ended (an unclosed block is content)."""
        rest, self.buffer = self.buffer, ""
        return rest


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of marker."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


@dataclass(slots=True)
class Llama3JsonParser:
    """Llama 3.1 JSON calls: an output whose first non-blank text is "{" (or the python tag) is
    held until it ends, then read as calls joined by ";"; anything else is content, streamed.
    An output that starts like a call but does not parse as calls is content, as written."""

    buffer: str = ""
    holding: bool | None = None  # None: undecided (only blanks so far)
    calls: list[ToolCall] = field(default_factory=list)

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        if self.holding is False:
            return text, []
        self.buffer += text
        head = self.buffer.lstrip()
        if not head or _PYTHON_TAG.startswith(head):
            return "", []
        self.holding = head.startswith("{") or head.startswith(_PYTHON_TAG)
        if self.holding:
            return "", []
        out, self.buffer = self.buffer, ""
        return out, []

    def finish(self) -> str:
        """Held text that is not calls (the calls, if it is, are in `finish_calls`)."""
        return self._end()[0]

    def finish_calls(self) -> tuple[str, list[ToolCall]]:
        return self._end()

    def _end(self) -> tuple[str, list[ToolCall]]:
        text, self.buffer = self.buffer, ""
        if not self.holding:
            return text, []
        calls = _llama_calls(text.strip().removeprefix(_PYTHON_TAG))
        if calls is None:
            return text, []
        self.calls.extend(calls)
        return "", calls


_PYTHON_TAG = "<|python_tag|>"


def _llama_calls(text: str) -> list[ToolCall] | None:
    decoder, calls, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        try:
            obj, i = decoder.raw_decode(text, i)
        except (ValueError, RecursionError):
            return None
        call = _one(obj)
        if call is None:
            return None
        calls.append(call)
        rest = text[i:].lstrip()
        if not rest:
            return calls
        if not rest.startswith(";"):
            return None
        i = len(text) - len(rest) + 1


ToolParser = HermesParser | Llama3JsonParser


def new_parser(fmt: ToolFormat) -> ToolParser:
    return Llama3JsonParser() if fmt is ToolFormat.LLAMA3_JSON else HermesParser()


def finish_parser(parser: ToolParser) -> tuple[str, list[ToolCall]]:
    """The text held back at the end of the output, and any calls it completes."""
    if isinstance(parser, Llama3JsonParser):
        return parser.finish_calls()
    return parser.finish(), []


def parse_all(text: str, fmt: ToolFormat = ToolFormat.HERMES) -> tuple[str, list[ToolCall]]:
    """A whole output: its content (None-able by the caller when empty) and its calls."""
    p = new_parser(fmt)
    content, calls = p.feed(text)
    rest, more = finish_parser(p)
    return content + rest, calls + more


def for_template(messages: list[dict], template: str | None) -> list[dict]:
    """A template that does not read `tool_calls` gets each assistant call written into the
    message's content the way the model wrote it (a Hermes block), so the conversation keeps it."""
    if template is None or "tool_calls" in template:
        return messages
    out = []
    for m in messages:
        if m.get("tool_calls"):
            blocks = "".join(
                f"{START}\n"
                + json.dumps(
                    {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}, ensure_ascii=False
                )
                + f"\n{END}"
                for c in m["tool_calls"]
            )
            m = {"role": m["role"], "content": m["content"] + blocks}
        out.append(m)
    return out


def check_template(req: ToolRequest, template: str | None) -> None:
    """`auto` needs a template that shows the model its tools (required and named choices are
    enforced by a grammar, whatever the template shows)."""
    if req.choice == "auto" and (template is None or "tools" not in template):
        raise bad_request(
            "this model's chat template does not render tools: use tool_choice 'required' or a "
            "named function (enforced by a grammar), or 'none'",
            "tool_choice",
        )
