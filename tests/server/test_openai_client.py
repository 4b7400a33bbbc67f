"""The official openai client against a live server on loopback (real default model, float32)."""

import asyncio

import pytest

from traceless import SamplingParams

pytestmark = pytest.mark.slow

QUESTIONS = ["What is the capital of France?", "Name three colors of the rainbow.", "Write one sentence about cats."]


@pytest.fixture(scope="module")
def client(real_server):
    from openai import OpenAI

    return OpenAI(base_url=real_server.url + "/v1", api_key="unused")


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def test_chat_matches_the_offline_api_streaming_and_not(client, model, real_llm):
    for q in QUESTIONS:
        want = real_llm.chat(
            [{"role": "user", "content": q}], SamplingParams(temperature=0, max_tokens=40), use_tqdm=False
        )[0].outputs[0]
        got = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": q}], max_tokens=40, temperature=0
        )
        assert got.choices[0].message.content == want.text
        assert got.choices[0].finish_reason == want.finish_reason
        assert got.usage.completion_tokens == len(want.token_ids)
        stream = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": q}],
            max_tokens=40,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces, finish, usage = [], None, None
        for chunk in stream:
            if chunk.usage:
                usage = chunk.usage
            for ch in chunk.choices:
                pieces.append(ch.delta.content or "")
                finish = ch.finish_reason or finish
        assert "".join(pieces) == want.text and finish == want.finish_reason
        assert usage.completion_tokens == len(want.token_ids)


def test_completions_match_the_offline_api_streaming_and_not(client, model, real_llm):
    prompt = "The three primary colors are"
    want = real_llm.generate(prompt, SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)[0].outputs[0]
    got = client.completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0)
    assert got.choices[0].text == want.text
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0, stream=True)
        if c.choices
    )
    assert streamed == want.text


def test_logprobs_n_and_seed(client, model):
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=5,
        logprobs=True,
        top_logprobs=3,
        n=2,
        seed=11,
        temperature=1.0,
    )
    assert len(r.choices) == 2
    for ch in r.choices:
        assert len(ch.logprobs.content) == r.usage.completion_tokens // 2 or ch.logprobs.content
        for entry in ch.logprobs.content:
            assert len(entry.top_logprobs) == 3 and entry.logprob <= 0
    again = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=5, n=2, seed=11, temperature=1.0
    )
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]
    c = client.completions.create(model=model, prompt="Hello", max_tokens=4, logprobs=2, temperature=0)
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == 4 and len(lp.token_logprobs) == 4 and all(len(t) == 2 for t in lp.top_logprobs)
    assert "".join(lp.tokens) == c.choices[0].text


def test_32_concurrent_streaming_clients(real_server, model, real_llm):
    from openai import AsyncOpenAI

    prompts = [f"Count from {i} to {i + 5}:" for i in range(32)]
    want = [
        o.outputs[0].text
        for o in real_llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)
    ]
    # what each prompt gives when it runs alone through the server (batching must not change it)
    aclient = AsyncOpenAI(base_url=real_server.url + "/v1", api_key="unused", max_retries=0)

    async def one(p):
        stream = await aclient.completions.create(model=model, prompt=p, max_tokens=24, temperature=0, stream=True)
        text, finish = [], None
        async for chunk in stream:
            if chunk.choices:
                text.append(chunk.choices[0].text)
                finish = chunk.choices[0].finish_reason or finish
        return "".join(text), finish

    async def all_at_once():
        return await asyncio.gather(*(one(p) for p in prompts))

    results = asyncio.run(all_at_once())
    assert [t for t, _ in results] == want
    assert all(f in ("stop", "length") for _, f in results)
    real_server.check_integrity()


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a given city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city name"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def test_default_model_tool_round_trip(client, model):
    """The built-in model renders tools through its own format (templates/smollm2-tools.jinja):
    `auto` is accepted and its output parsed; a forced call validates; the tool's answer goes back
    with `auto` and the model answers."""
    import json

    import jsonschema

    messages = [{"role": "user", "content": "What's the weather in Paris?"}]
    auto = client.chat.completions.create(
        model=model, messages=messages, tools=[WEATHER], tool_choice="auto", max_tokens=48, temperature=0
    ).choices[0]
    # SmolLM2-135M decides for itself under `auto` (it answers in text here); whichever it does is well formed.
    assert (auto.finish_reason == "tool_calls") == bool(auto.message.tool_calls)
    assert auto.message.tool_calls or auto.message.content
    forced = client.chat.completions.create(
        model=model, messages=messages, tools=[WEATHER], tool_choice="required", max_tokens=48, temperature=0
    ).choices[0]
    assert forced.finish_reason == "tool_calls"
    (call,) = forced.message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    messages += [
        forced.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 degrees Celsius"},
    ]
    answer = client.chat.completions.create(
        model=model, messages=messages, tools=[WEATHER], tool_choice="auto", max_tokens=32, temperature=0
    ).choices[0]
    assert answer.finish_reason in ("stop", "length", "tool_calls")
    assert answer.message.content or answer.message.tool_calls
    streamed = client.chat.completions.create(
        model=model,
        messages=messages[:1],
        tools=[WEATHER],
        max_tokens=48,
        tool_choice="required",
        temperature=0,
        stream=True,
    )
    args, names = "", ""
    for chunk in streamed:
        for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            names += d.function.name or ""
            args += d.function.arguments or ""
    assert (names, args) == (call.function.name, call.function.arguments)
