"""The scripted model: the matcher on its own, scenario files, and the HTTP server through the real
`openai` client (the same path production takes to a real LLM)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import pytest_asyncio

from countersign.runtime.config import SCRIPTED_MODEL_NAME
from countersign.scripted_model.scenario import Reply, ScenarioError, choose_reply, load_scenario
from countersign.scripted_model.server import Fault, ScriptedModelServer
from tests.fixtures.scripted_model import rules

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search_leads",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}

# --- the matcher, without a server ---------------------------------------------------------------------


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant_calls(*calls: tuple[str, str]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}
            for call_id, name in calls
        ],
    }


def tool(call_id: str, content: str, **extra: Any) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content, **extra}


def answer(scenario_rules: list[dict[str, Any]], messages: list[dict[str, Any]]) -> str | None:
    reply = choose_reply(rules(*scenario_rules), messages)
    return reply.content if reply else None


LEAD_RULES = [
    {"when": {"user_contains": "JANE"}, "reply": {"content": "searching"}},
    {"when": {"after_tool": "search_leads", "result_contains": "Jane.Doe@"}, "reply": {"content": "found"}},
    {"when": {"after_tool": "search_leads"}, "reply": {"content": "nothing"}},
    {"reply": {"content": "fallback"}},
]


def test_first_matching_rule_answers_and_user_contains_ignores_case() -> None:
    assert answer(LEAD_RULES, [{"role": "system", "content": "sys"}, user("find jane")]) == "searching"
    assert answer(LEAD_RULES, [user("hello")]) == "fallback"


def test_user_contains_a_list_needs_every_text() -> None:
    """The lead or city the user named picks the rule: Jane's score is not answered with John's."""
    scores: list[dict[str, Any]] = [
        {"when": {"user_contains": ["score", "jane"]}, "reply": {"content": "jane"}},
        {"when": {"user_contains": ["score", "john"]}, "reply": {"content": "john"}},
        {"reply": {"content": "fallback"}},
    ]
    assert answer(scores, [user("What is Jane Doe's SCORE?")]) == "jane"
    assert answer(scores, [user("john smith's score")]) == "john"
    assert answer(scores, [user("tell me about jane")]) == "fallback"


def test_rules_without_after_tool_only_answer_the_user() -> None:
    messages = [user("find jane"), assistant_calls(("c1", "get_lead")), tool("c1", "{}")]
    assert answer([{"reply": {"content": "to the user"}}], messages) is None


def test_after_tool_resolves_the_tool_by_call_id_and_result_contains_ignores_case() -> None:
    found = [
        user("find jane"),
        assistant_calls(("c1", "search_leads")),
        tool("c1", '{"email": "jane.doe@x"}'),
    ]
    assert answer(LEAD_RULES, found) == "found"
    empty = [user("find jane"), assistant_calls(("c1", "search_leads")), tool("c1", "[]")]
    assert answer(LEAD_RULES, empty) == "nothing"


def test_after_tool_accepts_the_tool_message_name() -> None:
    messages = [user("x"), tool("unknown-id", "{}", name="search_leads")]
    assert answer(LEAD_RULES, messages) == "nothing"


def test_with_parallel_calls_the_last_tool_result_decides() -> None:
    messages = [
        user("find jane"),
        assistant_calls(("c1", "search_leads"), ("c2", "get_lead")),
        tool("c1", "jane.doe@x"),
        tool("c2", "lead"),
    ]
    by_tool = [
        {"when": {"after_tool": "search_leads"}, "reply": {"content": "search"}},
        {"when": {"after_tool": "get_lead"}, "reply": {"content": "lead"}},
    ]
    assert answer(by_tool, messages) == "lead"


def test_turn_calls_counts_tool_results_since_the_latest_user_message() -> None:
    counted = [
        {"when": {"after_tool": "t", "turn_calls": n}, "reply": {"content": str(n)}} for n in (1, 2, 3)
    ]
    messages = [
        user("one"),
        assistant_calls(("a", "t")),
        tool("a", "r"),
        user("two"),
        assistant_calls(("b", "t")),
        tool("b", "r"),
        assistant_calls(("c", "t")),
        tool("c", "r"),
    ]
    assert answer(counted, messages) == "2"
    assert answer(counted, messages[:3]) == "1"


def test_user_contains_reads_the_latest_user_message_even_after_tools() -> None:
    scenario_rules = [{"when": {"after_tool": "t", "user_contains": "second"}, "reply": {"content": "yes"}}]
    messages = [user("first"), user("the SECOND one"), assistant_calls(("a", "t")), tool("a", "r")]
    assert answer(scenario_rules, messages) == "yes"
    assert answer(scenario_rules, [user("first"), assistant_calls(("a", "t")), tool("a", "r")]) is None


def test_content_parts_are_read_as_text() -> None:
    parts = {"role": "user", "content": [{"type": "text", "text": "about"}, {"type": "text", "text": "Jane"}]}
    assert answer(LEAD_RULES, [parts]) == "searching"


def test_no_rule_and_no_messages() -> None:
    assert answer([{"when": {"user_contains": "zzz"}, "reply": {"content": "x"}}], [user("a")]) is None
    assert answer(LEAD_RULES, []) is None


# --- scenario files ------------------------------------------------------------------------------------

SCENARIO_YAML = """\
name: demo
rules:
  - when: {user_contains: jane}
    reply:
      tool_calls:
        - name: search_leads
          arguments: {query: Jane Doe}
  - reply: {content: hi}
"""


@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".json"])
def test_load_scenario(tmp_path: Path, suffix: str) -> None:
    import yaml

    path = tmp_path / f"s{suffix}"
    data = yaml.safe_load(SCENARIO_YAML)
    path.write_text(json.dumps(data) if suffix == ".json" else SCENARIO_YAML)
    scenario = load_scenario(path)
    assert scenario.name == "demo"
    assert scenario.rules[0].reply.tool_calls[0].arguments == {"query": "Jane Doe"}
    assert scenario.rules[1].when.user_contains is None


@pytest.mark.parametrize(
    ("filename", "text", "expected"),
    [
        ("s.yaml", "name: x\nrules: [", "not valid YAML"),
        ("s.json", '{"name": ', "not valid JSON"),
        ("s.txt", "", "unsupported scenario file type '.txt'"),
        ("s.yaml", "rules: []", "name: Field required"),
        (
            "s.yaml",
            "name: x\nrules:\n  - when: {after_tol: t}\n    reply: {content: c}",
            "rules.0.when.after_tol",
        ),
        ("s.yaml", "name: x\nrules:\n  - reply: {}", "a reply needs `content`, `tool_calls` or both"),
        (
            "s.yaml",
            "name: x\nrules:\n  - when: {result_contains: r}\n    reply: {content: c}",
            "needs `after_tool`",
        ),
        (
            "s.yaml",
            "name: x\nrules:\n  - reply: {tool_calls: [{arguments: {}}]}",
            "rules.0.reply.tool_calls.0.name",
        ),
    ],
)
def test_load_errors_name_the_file_and_the_problem(
    tmp_path: Path, filename: str, text: str, expected: str
) -> None:
    path = tmp_path / filename
    path.write_text(text)
    with pytest.raises(ScenarioError) as raised:
        load_scenario(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: ") and expected in message and "\n" not in message


def test_load_error_for_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"missing\.yaml: cannot read scenario"):
        load_scenario(tmp_path / "missing.yaml")


def test_the_product_demo_scenario_loads() -> None:
    scenario = load_scenario(Path(__file__).parents[2] / "countersign" / "scenarios" / "lead-qualifier.yaml")
    assert scenario.rules


# --- the server through the real openai client ---------------------------------------------------------


@pytest_asyncio.fixture
async def client(scripted_model: ScriptedModelServer) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=scripted_model.base_url, api_key="x", max_retries=0) as client:
        yield client


async def complete(client: openai.AsyncOpenAI, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
    return await client.chat.completions.create(model="my-model", messages=messages, **kwargs)  # type: ignore[arg-type]


async def test_text_reply_is_labelled_and_echoes_the_model(
    scripted_model: ScriptedModelServer, client: openai.AsyncOpenAI
) -> None:
    scripted_model.set_scenario(rules({"reply": {"content": "Hello there"}}))
    completion = await complete(client, [user("hi")], max_tokens=50, temperature=0.2, user="alice")
    choice = completion.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == "[scripted model] Hello there"
    assert choice.message.tool_calls is None and choice.finish_reason == "stop"
    assert completion.model == "my-model" and completion.object == "chat.completion"
    assert scripted_model.requests[0]["max_tokens"] == 50


async def test_content_already_labelled_is_not_labelled_twice(
    scripted_model: ScriptedModelServer, client: openai.AsyncOpenAI
) -> None:
    scripted_model.set_scenario(rules({"reply": {"content": "[scripted model] done"}}))
    completion = await complete(client, [user("hi")])
    assert completion.choices[0].message.content == "[scripted model] done"


async def test_tool_call(scripted_model: ScriptedModelServer, client: openai.AsyncOpenAI) -> None:
    scripted_model.set_scenario(
        rules({"reply": {"tool_calls": [{"name": "search_leads", "arguments": {"query": "Jane Doe"}}]}})
    )
    completion = await complete(client, [user("find jane")], tools=[SEARCH_TOOL], tool_choice="auto")
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "search_leads"
    assert json.loads(call.function.arguments) == {"query": "Jane Doe"}
    assert scripted_model.requests[0]["tools"] == [SEARCH_TOOL]


async def test_parallel_tool_calls_have_unique_ids(
    scripted_model: ScriptedModelServer, client: openai.AsyncOpenAI
) -> None:
    calls = [
        {"name": "get_lead", "arguments": {"lead": "a@x"}},
        {"name": "get_lead", "arguments": {"lead": "b@x"}},
    ]
    scripted_model.set_scenario(rules({"reply": {"content": "Looking both up.", "tool_calls": calls}}))
    first = (await complete(client, [user("compare")])).choices[0].message
    second = (await complete(client, [user("compare")])).choices[0].message
    assert first.content == "[scripted model] Looking both up."
    assert [json.loads(c.function.arguments)["lead"] for c in first.tool_calls] == ["a@x", "b@x"]
    ids = [c.id for c in first.tool_calls + second.tool_calls]
    assert len(set(ids)) == 4


async def test_multi_step_exchange(scripted_model: ScriptedModelServer, client: openai.AsyncOpenAI) -> None:
    """Feeds the server's own calls back as tool results, as the agent loop does."""
    scripted_model.set_scenario(
        rules(
            {
                "when": {"user_contains": "jane"},
                "reply": {"tool_calls": [{"name": "search_leads", "arguments": {"query": "Jane"}}]},
            },
            {
                "when": {"after_tool": "search_leads", "result_contains": "JANE.DOE@", "turn_calls": 1},
                "reply": {
                    "tool_calls": [{"name": "get_lead", "arguments": {"lead": "jane.doe@example.com"}}]
                },
            },
            {"when": {"after_tool": "get_lead", "turn_calls": 1}, "reply": {"content": "wrong count"}},
            {"when": {"after_tool": "get_lead", "turn_calls": 2}, "reply": {"content": "Jane is new."}},
        )
    )
    messages: list[dict[str, Any]] = [user("Tell me about Jane")]
    results = iter(
        ['{"ok": true, "data": [{"email": "jane.doe@example.com"}]}', '{"ok": true, "status": "new"}']
    )
    while True:
        message = (await complete(client, messages, tools=[SEARCH_TOOL])).choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        messages += [
            {"role": "tool", "tool_call_id": c.id, "content": next(results)} for c in message.tool_calls
        ]
    assert messages[-1]["content"] == "[scripted model] Jane is new."
    assert len(scripted_model.requests) == 3


async def test_no_rule_matched(scripted_model: ScriptedModelServer, client: openai.AsyncOpenAI) -> None:
    completion = await complete(client, [user("anything")])
    assert completion.choices[0].message.content == "[scripted model] no rule matched"
    assert completion.choices[0].finish_reason == "stop"


async def test_usage_counts_words(scripted_model: ScriptedModelServer, client: openai.AsyncOpenAI) -> None:
    scripted_model.set_scenario(
        rules({"reply": {"content": "two words", "tool_calls": [{"name": "t", "arguments": {"q": "a b"}}]}})
    )
    messages = [
        {"role": "system", "content": "be brief"},
        user("find jane doe"),
        assistant_calls(("c1", "t")),  # arguments "{}": one word
        tool("c1", "three word result"),
        user("again please"),
    ]
    usage = (await complete(client, messages)).usage
    assert usage.prompt_tokens == 2 + 3 + 1 + 3 + 2
    # content "[scripted model] two words" (4) + arguments '{"q": "a b"}' (3)
    assert usage.completion_tokens == 4 + 3
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


async def test_models_lists_the_scripted_model(client: openai.AsyncOpenAI) -> None:
    models = [m.id async for m in client.models.list()]
    assert models == [SCRIPTED_MODEL_NAME]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"{not json", "not valid JSON"),
        (b"[]", "must be a JSON object"),
        (b'{"model": "m"}', "messages: Field required"),
        (b'{"model": "m", "messages": []}', "messages: List should have at least 1 item"),
        (b'{"model": "m", "messages": [{"content": "x"}]}', "message 0 has no string `role`"),
    ],
)
async def test_malformed_request_is_an_openai_style_400(
    scripted_model: ScriptedModelServer, body: bytes, expected: str
) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{scripted_model.base_url}/chat/completions", data=body) as response,
    ):
        assert response.status == 400
        error = (await response.json())["error"]
    assert expected in error["message"] and error["message"].startswith("[scripted model] ")
    assert error["type"] == "invalid_request_error" and error["code"]
    assert scripted_model.requests == []


async def test_malformed_request_through_the_client(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="at least 1 item"):
        await complete(client, [])


async def test_unknown_path_is_a_json_404(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="/v1/embeddings"):
        await client.embeddings.create(model="m", input="x")


async def test_injected_rate_limit_carries_retry_after(
    scripted_model: ScriptedModelServer, client: openai.AsyncOpenAI
) -> None:
    scripted_model.set_scenario(rules({"reply": {"content": "ok"}}))
    scripted_model.inject(Fault(status=429, retry_after=1))
    with pytest.raises(openai.RateLimitError) as raised:
        await complete(client, [user("hi")])
    assert raised.value.response.headers["retry-after"] == "1"
    assert "[scripted model]" in raised.value.message
    # one-shot: the next request is answered normally, and both were recorded
    assert (await complete(client, [user("hi")])).choices[0].message.content == "[scripted model] ok"
    assert len(scripted_model.requests) == 2


async def test_injected_server_error(scripted_model: ScriptedModelServer, client: openai.AsyncOpenAI) -> None:
    scripted_model.inject(Fault(status=500))
    with pytest.raises(openai.InternalServerError):
        await complete(client, [user("hi")])


async def test_injected_malformed_json(
    scripted_model: ScriptedModelServer, client: openai.AsyncOpenAI
) -> None:
    scripted_model.inject(Fault(raw_body='{"truncated'))
    # The client does not wrap a broken body: callers see the JSON error itself (a ValueError).
    with pytest.raises(json.JSONDecodeError):
        await complete(client, [user("hi")])


async def test_injected_delay_provokes_a_timeout(
    scripted_model: ScriptedModelServer, client: openai.AsyncOpenAI
) -> None:
    scripted_model.inject(Fault(delay_s=5))
    with pytest.raises(openai.APITimeoutError):
        await complete(client, [user("hi")], timeout=0.2)
    after = await complete(client, [user("hi")])
    assert after.choices[0].message.content == "[scripted model] no rule matched"


def test_a_fault_needs_an_error_status() -> None:
    with pytest.raises(ValueError, match="4xx/5xx"):
        Fault(status=200)


async def test_server_lifecycle_and_port() -> None:
    server = ScriptedModelServer(rules({"reply": {"content": "x"}}))
    with pytest.raises(RuntimeError, match="not started"):
        _ = server.base_url
    async with server:
        assert server.port > 0 and server.base_url == f"http://127.0.0.1:{server.port}/v1"
    assert isinstance(choose_reply(server.scenario, [user("a")]), Reply)
