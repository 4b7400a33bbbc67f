"""Fields of OpenAI's and vLLM's request bodies that this server does not support, by name.

A key a client chose is text it wrote (content), so an error about an unknown field never echoes
it. A name listed here is not the client's text: it is one of this fixed list, so an error may
name it and say what to use instead. Anything else is only counted. docs/api.md lists the fields
that are supported.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from traceless.http.errors import ApiError, bad_request

REFERENCE = "docs/api.md"

# name -> why it is refused, or what to use instead ("" when there is nothing more to say)
KNOWN_UNSUPPORTED: Mapping[str, str] = MappingProxyType(
    {
        # OpenAI
        "metadata": "nothing about a request is stored",
        "store": "nothing about a request is stored",
        "service_tier": "",
        "prompt_cache_key": "use 'cache_salt' to share a cached prefix between your requests",
        "prompt_cache_retention": "",
        "safety_identifier": "",
        "modalities": "text only",
        "audio": "text only",
        "prediction": "",
        "reasoning_effort": "",
        "verbosity": "",
        "web_search_options": "",
        "functions": "use 'tools'",
        "function_call": "use 'tool_choice'",
        # vLLM's sampling and request extensions
        "min_tokens": "",
        "use_beam_search": "",
        "length_penalty": "",
        "include_stop_str_in_output": "",
        "skip_special_tokens": "",
        "spaces_between_special_tokens": "",
        "truncate_prompt_tokens": "",
        "allowed_token_ids": "use 'logit_bias'",
        "bad_words": "use 'logit_bias'",
        "priority": "requests run first come, first served",
        "request_id": "",
        "return_tokens_as_token_ids": "",
        "return_token_ids": "",
        "prompt_embeds": "",
        "kv_transfer_params": "",
        "vllm_xargs": "",
        "logits_processors": "",
        "mm_processor_kwargs": "text only",
        "documents": "",
        "add_generation_prompt": "",
        "continue_final_message": "",
        "add_special_tokens": "",
        "chat_template": "the server's --chat-template is used",
        "chat_template_kwargs": "the server's chat template is rendered as it is",
        "guided_json": "use 'response_format' or 'structured_outputs'",
        "guided_regex": "use 'structured_outputs'",
        "guided_choice": "use 'structured_outputs'",
        "guided_grammar": "use 'structured_outputs'",
        "guided_decoding_backend": "",
        "guided_whitespace_pattern": "",
        "structural_tag": "",
    }
)
# fields of a chat message
KNOWN_MESSAGE_UNSUPPORTED: Mapping[str, str] = MappingProxyType(
    {
        "refusal": "",
        "audio": "text only",
        "function_call": "use 'tool_calls'",
        "reasoning_content": "",
        "reasoning": "",
        "annotations": "",
    }
)


def unknown_fields_error(
    unknown: Iterable[str], where: str | None = None, known: Mapping[str, str] = KNOWN_UNSUPPORTED
) -> ApiError:
    """A 400 naming the fields of `unknown` that are in `known` (the first one alphabetically as
    its param, with its hint) and counting the others. `known` may add names supported elsewhere
    (another endpoint's fields: their hint says so)."""
    unknown = set(unknown)
    named = sorted(unknown & set(known))
    others = len(unknown) - len(named)
    place = f" in '{where}'" if where else ""
    if not named:
        return bad_request(
            f"the request has {others} unknown field(s){place}; the supported fields are listed in {REFERENCE}",
            where,
            "unsupported_parameter",
        )
    first = named[0]
    hint = f" ({known[first]})" if known[first] else ""
    parts = [f"'{first}'{place} is not supported by this server{hint}"]
    if len(named) > 1:
        parts.append("neither are " + ", ".join(f"'{n}'" for n in named[1:]))
    if others:
        parts.append(f"the request also has {others} other unknown field(s)")
    return bad_request(
        "; ".join(parts) + f"; the supported fields are listed in {REFERENCE}",
        f"{where}.{first}" if where else first,
        "unsupported_parameter",
    )
