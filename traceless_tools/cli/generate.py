"""`traceless chat` and `traceless run` (argument parsing only)."""

from __future__ import annotations

import argparse
import sys

from traceless.cli.engine_args import add_engine_args, config_errors, engine_options

DEMO_QUESTIONS = (
    "What is the capital of France?",
    "Give me three tips for writing clear code.",
)


def register(sub: argparse._SubParsersAction) -> None:
    chat = sub.add_parser(
        "chat",
        help="chat with a model in the terminal (offline engine; answers stream as they "
        "come; Ctrl-C ends an answer, Ctrl-C at the prompt ends the chat)",
    )
    add_engine_args(chat)
    chat.add_argument("--max-tokens", type=int, default=256, help="longest answer, in tokens")
    chat.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")
    chat.set_defaults(handler=_chat)
    run = sub.add_parser("run", help="the main job: a short demo chat on the default model")
    add_engine_args(run)
    run.set_defaults(handler=_run)


def _load(args):
    from traceless.entrypoints.llm import LLM

    print("loading model ...", file=sys.stderr)
    with config_errors():
        return LLM(args.model, dtype=args.dtype, **engine_options(args))


def _answer(llm, history: list[dict], params) -> str:
    out = llm.chat(history, params, use_tqdm=False)[0].outputs[0]
    return out.text


def _chat(args: argparse.Namespace) -> int:
    from traceless.sampling_params import SamplingParams
    from traceless_tools.cli.chat import converse

    llm = _load(args)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)
    return converse(llm, params, sys.stdin.isatty())


def _run(args: argparse.Namespace) -> int:
    from traceless.sampling_params import SamplingParams

    llm = _load(args)
    params = SamplingParams(temperature=0.0, max_tokens=128)
    for q in DEMO_QUESTIONS:
        print(f"you> {q}")
        print(f"assistant> {_answer(llm, [{'role': 'user', 'content': q}], params)}\n", flush=True)
    llm.engine.check_integrity()
    print("done: every KV block is free and zero, no request state is retained.")
    return 0
