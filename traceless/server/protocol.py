"""Parse and validate OpenAI request bodies strictly.

Every field a body may carry is declared here; anything else gets a 400 that counts the unknown
fields and names only those on the fixed list of OpenAI's and vLLM's fields in known_fields.py (a
key a client chose is text it wrote: content, never echoed). Fields the server
understands but does not implement are accepted only with their "off" value, so nothing is ever
accepted and ignored. Structured outputs (`response_format`, `structured_outputs`) are parsed in
structured_request.py, tools in tools.py. `user` is validated and dropped: it is never stored or used.

One request buys at most MAX_CHOICES engine requests: n completions of each of its prompts,
n * len(prompts) <= MAX_CHOICES (so n <= 8 with one prompt, 8 prompts with n = 1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from traceless.errors import InvalidRequestError
from traceless.http.body import decode_json
from traceless.http.errors import ApiError, bad_request
from traceless.sampling_params import OutputKind, SamplingParams
from traceless.server.known_fields import KNOWN_MESSAGE_UNSUPPORTED, KNOWN_UNSUPPORTED, unknown_fields_error
from traceless.server.structured_request import response_format, structured_outputs
from traceless.server.tools import ToolFormat, ToolRequest, forced_call_grammar, parse_tools
from traceless.structured.spec import StructuredOutput

Validator = Callable[[str, Any], Any]
MAX_COMPLETION_LOGPROBS = 5
MAX_CHOICES = 8  # engine requests one HTTP request may start: n * number of prompts


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def string(name, v):
    if not isinstance(v, str):
        raise bad_request(f"'{name}' must be a string", name)
    return v


def boolean(name, v):
    if not isinstance(v, bool):
        raise bad_request(f"'{name}' must be a boolean", name)
    return v


def integer(name, v):
    if not _is_int(v):
        raise bad_request(f"'{name}' must be an integer", name)
    return v


def number(name, v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise bad_request(f"'{name}' must be a number", name)
    return v


def stop(name, v):
    if isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v)):
        return v
    raise bad_request(f"'{name}' must be a string or a list of strings", name)


def int_list(name, v):
    if isinstance(v, list) and all(_is_int(t) for t in v):
        return v
    raise bad_request(f"'{name}' must be a list of integers", name)


def stream_options(name, v):
    if not isinstance(v, dict) or set(v) - {"include_usage"}:
        raise bad_request("'stream_options' supports only 'include_usage'", name)
    return bool(boolean("stream_options.include_usage", v.get("include_usage", False)))


def only(value_ok: Callable[[Any], bool], what: str) -> Validator:
    """A field we recognise but do not implement: only its 'off' value is accepted."""

    def check(name, v):
        if not value_ok(v):
            raise bad_request(f"'{name}' is not supported by this server ({what})", name, "unsupported_parameter")
        return None

    return check


SAMPLING_FIELDS: dict[str, Validator] = {
    "max_tokens": integer,
    "temperature": number,
    "top_p": number,
    "n": integer,
    "stream": boolean,
    "stream_options": stream_options,
    "stop": stop,
    "presence_penalty": number,
    "frequency_penalty": number,
    "seed": integer,
    "user": string,
    "logit_bias": lambda name, v: _logit_bias(name, v),
    # vLLM extensions
    "cache_salt": lambda name, v: _salt(name, v),
    "top_k": integer,
    "min_p": number,
    "repetition_penalty": number,
    "ignore_eos": boolean,
    "stop_token_ids": int_list,
}
COMPLETION_FIELDS: dict[str, Validator] = {
    **SAMPLING_FIELDS,
    "model": string,
    "prompt": lambda n, v: v,
    "logprobs": integer,
    "echo": boolean,
    "prompt_logprobs": integer,  # prompt_logprobs: a vLLM extension
    "best_of": only(lambda v: v in (1,), "best_of must be 1"),
    "suffix": only(lambda v: v in ("",), "suffix must be empty"),
    "response_format": response_format,
    "structured_outputs": structured_outputs,
}
CHAT_FIELDS: dict[str, Validator] = {
    **SAMPLING_FIELDS,
    "model": string,
    "messages": lambda n, v: v,
    "max_completion_tokens": integer,
    "logprobs": boolean,
    "top_logprobs": integer,
    "response_format": response_format,
    "structured_outputs": structured_outputs,
    "tools": lambda n, v: v,
    "tool_choice": lambda n, v: v,
    "parallel_tool_calls": lambda n, v: v,  # tools.py
}
_CHAT_ONLY = {name: "a /v1/chat/completions field" for name in set(CHAT_FIELDS) - set(COMPLETION_FIELDS)}
_COMPLETION_ONLY = {name: "a /v1/completions field" for name in set(COMPLETION_FIELDS) - set(CHAT_FIELDS)}


def _logit_bias(name, v) -> dict[int, float]:
    """JSON object keys are strings: each must spell a token id (the vocabulary bound and the
    bias range are checked by SamplingParams and the engine)."""
    if not isinstance(v, dict):
        raise bad_request(f"'{name}' must be an object mapping token ids to numbers", name)
    out = {}
    for key, bias in v.items():
        if not isinstance(key, str) or not key.isascii() or not key.isdigit() or len(key) > 12:
            raise bad_request(f"'{name}' keys must be token ids (non-negative integers)", name)
        out[int(key)] = number(name, bias)
    return out


def _salt(name, v):
    from traceless.engine.prefix_cache import check_salt

    try:
        return check_salt(v)
    except InvalidRequestError as exc:
        raise bad_request(str(exc), name) from None


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    model: str
    prompts: list[str | list[int]]  # completions: one or more prompts; chat: one rendered conversation
    params: SamplingParams  # n and max_tokens as requested; max_tokens None = up to the context
    stream: bool
    include_usage: bool
    logprobs: int | None  # completions: top-N; chat: top_logprobs when logprobs is true
    cache_salt: str | None = None  # prefix-cache isolation domain (a client secret)
    echo: bool = False  # completions: the prompt (and, with logprobs, its logprobs) leads each choice
    prompt_logprobs: int | None = None  # completions (vLLM): top-N of every prompt position, per choice
    tools: ToolRequest | None = None  # chat: the tools offered and how a call is chosen


def _fields(
    body: Any, spec: dict[str, Validator], required: tuple[str, ...], elsewhere: dict[str, str] | None = None
) -> dict[str, Any]:
    """`elsewhere`: fields of another endpoint, named (with where they belong) when sent here."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    unknown = set(body) - set(spec)
    if unknown:
        raise unknown_fields_error(unknown, known={**KNOWN_UNSUPPORTED, **(elsewhere or {})})
    for name in required:
        if body.get(name) is None:
            raise bad_request(f"'{name}' is required", name, "missing_required_parameter")
    return {k: spec[k](k, v) for k, v in body.items() if v is not None}


def _structured(f: dict[str, Any]) -> StructuredOutput | None:
    if f.get("response_format") is not None and f.get("structured_outputs") is not None:
        raise bad_request("give 'response_format' or 'structured_outputs', not both", "structured_outputs")
    return f.get("response_format") or f.get("structured_outputs")


def _sampling(
    f: dict[str, Any],
    max_tokens: int | None,
    logprobs: int | None,
    prompt_logprobs: int | None = None,
    structured: StructuredOutput | None = None,
) -> SamplingParams:
    if f.get("stream_options") is not None and not f.get("stream", False):
        raise bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options")
    kw = {
        k: f[k]
        for k in (
            "temperature",
            "top_p",
            "n",
            "stop",
            "presence_penalty",
            "frequency_penalty",
            "seed",
            "top_k",
            "min_p",
            "repetition_penalty",
            "ignore_eos",
            "stop_token_ids",
            "logit_bias",
        )
        if k in f
    }
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            output_kind=OutputKind.DELTA,
            structured=structured,
            **kw,
        )
    except InvalidRequestError as exc:
        raise bad_request(str(exc), str(exc).split(" ", 1)[0]) from None


def _check_choices(num_prompts: int, n: int) -> None:
    """One request buys at most MAX_CHOICES engine requests (checked before any work is done)."""
    if num_prompts > MAX_CHOICES:
        raise ApiError(400, f"'prompt' may list at most {MAX_CHOICES} prompts", param="prompt", code="too_many_choices")
    if n * num_prompts > MAX_CHOICES:
        raise ApiError(
            400, f"'n' times the number of prompts may be at most {MAX_CHOICES}", param="n", code="too_many_choices"
        )


def parse_completion(body: Any) -> ParsedRequest:
    f = _fields(body, COMPLETION_FIELDS, ("model", "prompt"), _CHAT_ONLY)
    prompt = f["prompt"]
    prompts: list[str | list[int]]
    if isinstance(prompt, str):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = list(prompt)
    elif (
        isinstance(prompt, list) and prompt and all(isinstance(p, list) and all(_is_int(t) for t in p) for p in prompt)
    ):
        prompts = list(prompt)
    else:
        raise bad_request(
            "'prompt' must be a string, a list of strings, a list of token ids or a list of such lists", "prompt"
        )
    logprobs = f.get("logprobs")
    if logprobs is not None and not 0 <= logprobs <= MAX_COMPLETION_LOGPROBS:
        raise bad_request(f"'logprobs' must be between 0 and {MAX_COMPLETION_LOGPROBS}", "logprobs")
    echo = f.get("echo", False)
    prompt_logprobs = f.get("prompt_logprobs")
    if prompt_logprobs is not None and not 0 <= prompt_logprobs <= MAX_COMPLETION_LOGPROBS:
        raise bad_request(f"'prompt_logprobs' must be between 0 and {MAX_COMPLETION_LOGPROBS}", "prompt_logprobs")
    # echo with logprobs needs the prompt's logprobs too, with as many alternatives as the output's
    engine_prompt_lps = prompt_logprobs
    if echo and logprobs is not None:
        engine_prompt_lps = max(logprobs, prompt_logprobs or 0)
    params = _sampling(f, f.get("max_tokens", 16), logprobs, engine_prompt_lps, _structured(f))
    _check_choices(len(prompts), params.n)
    return ParsedRequest(
        f["model"],
        prompts,
        params,
        f.get("stream", False),
        f.get("stream_options", False),
        logprobs,
        f.get("cache_salt"),
        echo,
        prompt_logprobs,
    )


def parse_chat(
    body: Any, render: Callable[[list[dict], list[dict] | None], str], tool_format: ToolFormat = ToolFormat.HERMES
) -> ParsedRequest:
    f = _fields(body, CHAT_FIELDS, ("model", "messages"), _COMPLETION_ONLY)
    tools = parse_tools(f.get("tools"), f.get("tool_choice"), f.get("parallel_tool_calls"), tool_format)
    structured = _structured(f)
    forced = forced_call_grammar(tools) if tools is not None else None
    if forced is not None and structured is not None:
        raise bad_request("a required or named 'tool_choice' cannot be combined with 'response_format'", "tool_choice")
    if "max_tokens" in f and "max_completion_tokens" in f:
        raise bad_request("give 'max_tokens' or 'max_completion_tokens', not both", "max_completion_tokens")
    top = f.get("top_logprobs")
    if top is not None and not f.get("logprobs"):
        raise bad_request("'top_logprobs' requires 'logprobs': true", "top_logprobs")
    logprobs = (top or 0) if f.get("logprobs") else None
    params = _sampling(
        f, f.get("max_completion_tokens", f.get("max_tokens")), logprobs, structured=forced or structured
    )
    _check_choices(1, params.n)
    prompt = render(messages(f["messages"]), tools.tools if tools is not None else None)
    return ParsedRequest(
        f["model"],
        [prompt],
        params,
        f.get("stream", False),
        f.get("stream_options", False),
        logprobs,
        f.get("cache_salt"),
        tools=tools,
    )


_ROLES = ("system", "developer", "user", "assistant", "tool")


def messages(raw: Any) -> list[dict]:
    if not isinstance(raw, list) or not raw:
        raise bad_request("'messages' must be a non-empty list", "messages")
    return [_message(m, f"messages[{i}]") for i, m in enumerate(raw)]


def _message(m: Any, where: str) -> dict:
    """One message as the chat template takes it (developer is system; tool calls' arguments parsed)."""
    role = _checked_role(m, where)
    msg: dict[str, Any] = {"role": "system" if role == "developer" else role}
    if m.get("tool_calls"):
        msg["tool_calls"] = _tool_calls(m["tool_calls"], where)
        msg["content"] = _content(m["content"], where) if m.get("content") is not None else ""
    else:
        msg["content"] = _content(m.get("content"), where)
    if role == "tool":
        msg["tool_call_id"] = m["tool_call_id"]
    return msg


def _checked_role(m: Any, where: str) -> str:
    """The role of message `m`, once its fields are known and fit that role."""
    if not isinstance(m, dict):
        raise bad_request(f"'{where}' must be an object", where)
    extra = set(m) - {"role", "content", "name", "tool_calls", "tool_call_id"}
    if extra:
        raise unknown_fields_error(extra, where, KNOWN_MESSAGE_UNSUPPORTED)
    if m.get("name") is not None:
        raise bad_request(f"'{where}.name' is not supported", where, "unsupported_parameter")
    role = m.get("role")
    if role not in _ROLES:
        raise bad_request(f"'{where}.role' must be one of {', '.join(_ROLES)}", where)
    if m.get("tool_calls") is not None and role != "assistant":
        raise bad_request(f"'{where}.tool_calls' is only allowed on assistant messages", where)
    if (m.get("tool_call_id") is not None) != (role == "tool") or (
        role == "tool" and not isinstance(m["tool_call_id"], str)
    ):
        raise bad_request(f"'{where}.tool_call_id' (a string) is required on tool messages, and only there", where)
    return role


def _tool_calls(calls: Any, where: str) -> list[dict]:
    """An assistant message's calls, with their arguments parsed (chat templates render them as JSON)."""
    if not isinstance(calls, list):
        raise bad_request(f"'{where}.tool_calls' must be a list", where)
    out = []
    for c in calls:
        f = c.get("function") if isinstance(c, dict) else None
        if (
            not isinstance(c, dict)
            or set(c) - {"id", "type", "function"}
            or c.get("type") != "function"
            or not isinstance(f, dict)
            or set(f) != {"name", "arguments"}
            or not isinstance(f["name"], str)
            or not isinstance(f["arguments"], str)
            or not isinstance(c.get("id"), str)
        ):
            raise bad_request(
                f'\'{where}.tool_calls\' entries must be {{"id", "type": "function", '
                '"function": {"name", "arguments"}}',
                where,
            )
        try:
            args = decode_json(f["arguments"])
        except ValueError:
            raise bad_request(f"'{where}.tool_calls' arguments must be JSON text", where) from None
        out.append({"id": c["id"], "type": "function", "function": {"name": f["name"], "arguments": args}})
    return out


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad_request(f"'{where}.content' parts must be text parts", where, "unsupported_parameter")
            parts.append(part["text"])
        return "".join(parts)
    raise bad_request(f"'{where}.content' must be a string or a list of text parts", where)


# --- /tokenize and /detokenize (vLLM's shape) --------------------------------------------------
TOKENIZE_FIELDS: dict[str, Validator] = {
    "model": string,
    "prompt": string,
    "add_special_tokens": boolean,
    "return_token_strs": boolean,
    "messages": lambda n, v: v,
    "add_generation_prompt": boolean,
}
DETOKENIZE_FIELDS: dict[str, Validator] = {"model": string, "tokens": int_list}


@dataclass(frozen=True, slots=True)
class TokenizeRequest:
    model: str | None
    prompt: str | None  # a completion prompt, or None for a conversation
    messages: list[dict] | None
    add_special_tokens: bool
    add_generation_prompt: bool
    return_token_strs: bool


def parse_tokenize(body: Any) -> TokenizeRequest:
    """vLLM's two forms: {"prompt": ...} (add_special_tokens defaults to true) or {"messages": ...}
    (rendered by the chat template, add_special_tokens defaults to false)."""
    f = _fields(body, TOKENIZE_FIELDS, ())
    if ("prompt" in f) == ("messages" in f):
        raise bad_request("give exactly one of 'prompt' and 'messages'", "prompt")
    chat = "messages" in f
    if not chat and "add_generation_prompt" in f:
        raise bad_request("'add_generation_prompt' applies to 'messages' only", "add_generation_prompt")
    return TokenizeRequest(
        f.get("model"),
        f.get("prompt"),
        messages(f["messages"]) if chat else None,
        f.get("add_special_tokens", not chat),
        f.get("add_generation_prompt", True),
        f.get("return_token_strs", False),
    )


def parse_detokenize(body: Any, vocab_size: int) -> tuple[str | None, list[int]]:
    f = _fields(body, DETOKENIZE_FIELDS, ("tokens",))
    if any(t < 0 or t >= vocab_size for t in f["tokens"]):
        raise bad_request(f"'tokens' must be token ids in [0, {vocab_size})", "tokens")
    return f.get("model"), f["tokens"]
