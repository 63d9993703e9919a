"""The whole OpenAI chat request is honoured or refused (issue #39), driven by the official ``openai`` client against
the running server: system messages and earlier turns reach the prompt, ``tools`` come back as ``tool_calls``,
``response_format`` answers parse and validate, ``stop`` / ``seed`` / ``logit_bias`` work, unsupported fields are 400s naming them,
and assistant replies are never mounted."""

from __future__ import annotations

import json


import jsonschema
import openai
import pytest
from server_helpers import Server, run_cli, start_server, stop_server

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
ANSWER_SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                                  "age": {"enum": [1, 2, 3]}, "pet": {"type": "boolean"}},
                 "required": ["name", "age", "pet"], "additionalProperties": False}


@pytest.fixture(scope="module")
def server(tmp_path_factory, wide_model_dir):
    """A server whose tiny model reads 4,096 positions: the tool instructions alone are ~700 of its byte tokens,
    more than the shared fixture's 512-position model holds."""
    path = tmp_path_factory.mktemp("served-wide") / "store"
    key = run_cli("keys", "add", "--path", str(path), "--user", "u1").stdout.strip()
    proc, url = start_server(path, wide_model_dir, "--model-id", "tiny-llama")
    yield Server(url=url, path=path, key_u1=key, key_u2=key, proc=proc)
    stop_server(proc)


def _client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.key_u1, max_retries=0, timeout=120)


def _ask(client, messages, **kw):
    kw.setdefault("max_tokens", 4)
    return client.chat.completions.create(model="tiny-llama", user="u1", messages=messages,
                                          extra_body={"agentmem": {"remember": False, "mode": "text"}}, **kw)


def test_system_messages_and_earlier_turns_reach_the_prompt(server):
    client = _client(server)
    question = [{"role": "user", "content": "Which city?"}]
    system = "You are Zorblax, a terse travel agent. Always answer with one city name."
    plain = _ask(client, question)
    with_system = _ask(client, [{"role": "system", "content": system}, *question])
    earlier = [{"role": "user", "content": "I want to travel in May."},
               {"role": "assistant", "content": "Where to?"}]
    with_history = _ask(client, [{"role": "system", "content": system}, *earlier, *question])
    # the system text and the earlier turns are in the prompt the model read (no longer silently dropped)
    assert with_system.usage.prompt_tokens >= plain.usage.prompt_tokens + 15
    assert with_history.usage.prompt_tokens >= with_system.usage.prompt_tokens + 10


def test_a_forced_tool_call_comes_back_as_tool_calls(server):
    client = _client(server)
    r = _ask(client, [{"role": "user", "content": "What is the weather in Oslo?"}], max_tokens=200,
             tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    # the call and the tool's result go back in (the tiny tokenizer is byte-level: a character is a token)
    asked = [{"role": "user", "content": "What is the weather in Oslo?"}]
    follow = _ask(client, [*asked, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                           {"role": "tool", "tool_call_id": call.id, "content": "12 degrees and rain"}],
                  tools=[WEATHER], tool_choice="none")
    written = len(call.function.arguments) + len("Tool get_weather returned: 12 degrees and rain")
    assert follow.choices[0].message.tool_calls is None
    assert follow.usage.prompt_tokens >= _ask(client, asked).usage.prompt_tokens + written


def test_an_agent_loop_remembers_its_tool_results_with_their_calls(server):
    """With ``remember`` on (the default), the request that brings a tool's result back adds the result, with its
    call's name and arguments, and the final answer to the user's memories; the question is not stored twice."""
    client = _client(server)
    question = [{"role": "user", "content": "Is it raining in Bergen?"}]
    ask = dict(model="tiny-llama", user="u1", max_tokens=200, tools=[WEATHER],
               extra_body={"agentmem": {"mode": "text"}})
    first = client.chat.completions.create(
        messages=question, tool_choice={"type": "function", "function": {"name": "get_weather"}}, **ask)
    call = first.choices[0].message.tool_calls[0]
    ask["max_tokens"] = 6
    final = client.chat.completions.create(
        messages=[*question, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                  {"role": "tool", "tool_call_id": call.id, "content": "heavy rain, 7 degrees"}],
        tool_choice="none", **ask)
    answer = final.choices[0].message.content
    with server.client(server.key_u1) as c:
        stored = c.get("/v1/memories", params={"user_id": "u1", "limit": 100}).json()["memories"]
    tools = [m for m in stored if m["kind"] == "tool"]
    assert [(m["speaker"], m["text"]) for m in tools] == [
        ("get_weather", f"called with {json.dumps(json.loads(call.function.arguments), sort_keys=True)}, "
                        "returned: heavy rain, 7 degrees")]
    assert [m["text"] for m in stored if m["role"] == "user"].count("Is it raining in Bergen?") == 1
    if answer.strip():
        assert answer.strip() in [m["text"] for m in stored if m["role"] == "assistant"]


def test_a_pasted_document_is_remembered_as_parts(server):
    """A user message longer than ``message_max_words`` (150) is stored as numbered parts, each searchable and
    mountable on its own, not as one memory only its beginning is embedded for."""
    client = _client(server)
    pasted = "Notes from the meeting:\n\n" + " ".join(f"Item {i}: the budget line {i} stays as it was." for i in range(40))
    client.chat.completions.create(model="tiny-llama", user="u1", max_tokens=2,
                                   messages=[{"role": "user", "content": pasted}],
                                   extra_body={"agentmem": {"mode": "text"}})
    with server.client(server.key_u1) as c:
        stored = c.get("/v1/memories", params={"user_id": "u1", "limit": 100}).json()
    parts = [m for m in stored["memories"] if m["role"] == "user" and "budget line" in m["text"]]
    assert len(parts) == 3 and [m["metadata"]["document"]["part"] for m in parts] == [1, 2, 3]
    assert " ".join(m["text"] for m in parts).split() == pasted.split()


def test_a_json_schema_answer_parses_and_validates(server):
    client = _client(server)
    r = _ask(client, [{"role": "user", "content": "Describe me as JSON."}], max_tokens=64,
             response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": ANSWER_SCHEMA}})
    jsonschema.validate(json.loads(r.choices[0].message.content), ANSWER_SCHEMA)
    obj = _ask(client, [{"role": "user", "content": "Any JSON object."}], max_tokens=64,
               response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "stop" and obj.choices[0].message.content.lstrip().startswith("{")


def test_stop_ends_the_answer_and_seed_repeats_a_sampled_one(server):
    client = _client(server)
    # a random model writes stray bytes: stop at a printable ASCII character of the answer's second half
    for text in ("Tell me a long story.", "Go on.", "And then?", "What next?", "Say more."):
        question = [{"role": "user", "content": text}]
        whole = _ask(client, question, max_tokens=24).choices[0].message.content
        stop = next((c for c in whole[len(whole) // 2:] if c.isascii() and c.isalnum()), None)
        if stop is not None:
            break
    assert stop is not None, whole
    cut = _ask(client, question, max_tokens=24, stop=[stop])
    assert cut.choices[0].message.content == whole[:whole.index(stop)]
    assert cut.choices[0].finish_reason == "stop" and cut.usage.completion_tokens < 24
    sampled = [_ask(client, question, max_tokens=12, temperature=1.0, seed=7).choices[0].message.content
               for _ in range(2)]
    assert sampled[0] == sampled[1]


def test_logit_bias_forces_or_bans_tokens(server):
    from agentmem.kv.testing import tiny_tokenizer  # the served model's tokenizer (one token per byte)

    tokenizer, client = tiny_tokenizer(), _client(server)
    question = [{"role": "user", "content": "Tell me a story."}]
    (x,) = tokenizer.encode("x", add_special_tokens=False)
    forced = _ask(client, question, max_tokens=6, logit_bias={str(x): 100})
    assert forced.choices[0].message.content == "xxxxxx"
    printable = [chr(c) for c in range(32, 127)]  # stray bytes do not round-trip through the text: check these
    plain = _ask(client, question, max_tokens=12).choices[0].message.content
    assert any(c in printable for c in plain), plain
    ban = {str(t): -100 for c in printable for t in tokenizer.encode(c, add_special_tokens=False)}
    other = _ask(client, question, max_tokens=12, logit_bias=ban).choices[0].message.content
    assert other and not any(c in printable for c in other), other


@pytest.mark.parametrize("extra, field", [
    ({"logprobs": True}, "logprobs"), ({"frequency_penalty": 0.5}, "frequency_penalty"),
    ({"n": 2}, "n"), ({"audio": {"voice": "alloy"}}, "audio"),
    ({"response_format": {"type": "xml"}}, "response_format"), ({"tool_choice": "required"}, "tool_choice"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"logit_bias": {"5": 101}}, "logit_bias"), ({"logit_bias": {"999999": -100}}, "logit_bias"),
    ({"logit_bias": {"x": 1}}, "logit_bias"),
])
def test_unsupported_fields_are_400s_naming_them(server, extra, field):
    with pytest.raises(openai.BadRequestError) as err:
        _ask(_client(server), [{"role": "user", "content": "hi"}], **extra)
    assert field in str(err.value)


def test_a_session_refuses_what_it_cannot_keep(server):
    with pytest.raises(openai.BadRequestError, match="system"):
        _client(server).chat.completions.create(
            model="x", user="u1", max_tokens=2, extra_headers={"X-AgentMem-Session": "oa-sys"},
            messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        _client(server).chat.completions.create(
            model="x", user="u1", max_tokens=2, extra_headers={"X-AgentMem-Session": "oa-bias"},
            messages=[{"role": "user", "content": "hi"}], logit_bias={"5": -100})


def test_assistant_replies_are_recalled_but_never_mounted(server):
    with server.client(server.key_u1) as c:
        said = c.post("/v1/memories", json={"text": "Your parrot is called Polly.", "user_id": "u1",
                                            "role": "assistant"}).json()["id"]
        c.post("/v1/memories", json={"text": "My parrot squawks at night.", "user_id": "u1", "role": "user"})
        recalled = c.post("/v1/memories/recall", json={"query": "What is my parrot called?", "user_id": "u1", "k": 10}).json()
    assert said in [h["id"] for h in recalled["hits"]]  # stored and recallable ...
    r = _ask(_client(server), [{"role": "user", "content": "What is my parrot called?"}])
    ext = r.model_extra["agentmem"]
    assert said not in [m["id"] for m in ext["mounted"]] + [h["id"] for h in ext["recalled"]]  # ... never mounted
    assert ext["recalled"] and ext["mount_min_score"] == 0.3


def test_an_older_statement_a_newer_memory_contradicts_is_reported_as_dropped_not_mounted(server):
    jobs = ["I'm employed as a chef.", "I finished reading a thriller novel.", "I study Arabic in the evenings.",
            "I go to the gym on Mondays.", "I planted tomatoes on the balcony.", "I got promoted, I'm a teacher now."]
    with server.client(server.key_u1) as c:
        ids = [c.post("/v1/memories", json={"text": t, "user_id": "u1", "role": "user"}).json()["id"] for t in jobs]
    ext = _ask(_client(server), [{"role": "user", "content": "What is my job?"}]).model_extra["agentmem"]
    assert ids[-1] in [m["id"] for m in ext["mounted"]]
    assert ids[0] not in [m["id"] for m in ext["mounted"]]
    assert [d["reason"] for d in ext["dropped"] if d["id"] == ids[0]] == [
        f"an older statement a newer recalled memory contradicts ({ids[-1]})"]


def test_memories_below_the_mount_threshold_are_reported_as_dropped_with_why(server):
    with server.client(server.key_u1) as c:
        c.post("/v1/memories", json={"text": "My parrot is called Kiwi.", "user_id": "u1", "role": "user"})
        c.post("/v1/memories", json={"text": "The quarterly tax form is due in April.", "user_id": "u1",
                                     "role": "user"})
    r = _ask(_client(server), [{"role": "user", "content": "What is my parrot called?"}])
    ext = r.model_extra["agentmem"]
    below = [d for d in ext["dropped"] if "below the mount threshold" in d["reason"]]
    assert below, ext  # the unrelated memory was recalled, and the reply says why it was not mounted
    assert all(d["score"] < ext["mount_min_score"] for d in below)
    assert not {d["id"] for d in below} & {m["id"] for m in ext["mounted"]}
