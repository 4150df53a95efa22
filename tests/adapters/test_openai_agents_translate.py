"""OpenAI Agents SDK session items through chatledger messages and back: lossless, and repair-ready."""

from __future__ import annotations

import copy
import itertools
import json
import math
import typing
from datetime import UTC, datetime
from typing import Any

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai.types.responses import ResponseInputItemParam

from chatledger.adapters.openai_agents import from_messages, item_count, to_messages
from chatledger.store import InvalidInputError
from chatledger.store._repair import well_formed
from chatledger.store.messages import (
    DataPart,
    Message,
    TextPart,
    ThinkingPart,
    ToolCall,
    UnknownPart,
    UrlPart,
    dump_message,
    load_messages,
)

Item = dict[str, Any]
PNG_URL = "data:image/png;base64,iVBORw0KGgo="

# -- the corpus ---------------------------------------------------------------------------

# One realistic history holding every item type of the installed openai, with the keys the
# Agents SDK adds itself. Each entry names the member of `ResponseInputItemParam` it is.
CORPUS: list[tuple[str, Item]] = [
    ("EasyInputMessageParam", {"role": "user", "content": "Weather in Paris? ünïcode ✓"}),
    ("EasyInputMessageParam", {"role": "system", "content": "You are terse."}),
    (
        "Message",
        {
            "type": "message",
            "role": "user",
            "status": "completed",
            "content": [
                {
                    "type": "input_text",
                    "text": "and these:",
                    "prompt_cache_breakpoint": {"mode": "explicit", "ttl": "30m"},
                },
                {
                    "type": "input_image",
                    "image_url": "https://example.com/cat.png",
                    "detail": "high",
                },
                {"type": "input_image", "file_id": "file-img", "detail": "auto"},
                {
                    "type": "input_file",
                    "file_data": "data:application/pdf;base64,JVBERi0xLjQK",
                    "filename": "a.pdf",
                },
                {"type": "input_file", "file_url": "https://example.com/b.pdf", "detail": "low"},
                {"type": "input_file", "file_id": "file-123"},
            ],
        },
    ),
    (
        "Message",
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "Answer in French."}],
        },
    ),
    # one model response: reasoning, a message and two calls
    (
        "ResponseReasoningItemParam",
        {
            "type": "reasoning",
            "id": "rs_01",
            "summary": [{"type": "summary_text", "text": "Need weather and time."}],
            "content": [{"type": "reasoning_text", "text": "The user wants two facts."}],
            "encrypted_content": "gAAAAABpZ0enc==",
            "status": "completed",
            "provider_data": {"model": "anthropic/claude-x", "signature": "sig=="},
        },
    ),
    (
        "ResponseOutputMessageParam",
        {
            "type": "message",
            "id": "msg_01",
            "role": "assistant",
            "status": "completed",
            "phase": "commentary",
            "content": [
                {
                    "type": "output_text",
                    "text": "Checking both.",
                    "annotations": [
                        {
                            "type": "url_citation",
                            "url": "https://example.com",
                            "title": "Example",
                            "start_index": 0,
                            "end_index": 8,
                        }
                    ],
                    "logprobs": [
                        {"token": "Check", "logprob": -0.01, "bytes": [67], "top_logprobs": []}
                    ],
                }
            ],
        },
    ),
    (
        "ResponseFunctionToolCallParam",
        {
            "type": "function_call",
            "id": "fc_01",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
            "status": "completed",
            "namespace": "weather",
            "_agents_tool_description": "Current weather for a city.",
            "_agents_tool_title": "Weather",
        },
    ),
    (
        "ResponseFunctionToolCallParam",
        {
            "type": "function_call",
            "id": "__fake_id__",
            "call_id": "call_2",
            "name": "get_time",
            "arguments": '{"tz": "CET" ',  # cut short, as a dying stream leaves it
            "caller": {"type": "direct"},
            "async": False,
            "provider_data": {"model": "litellm/gemini"},
        },
    ),
    (
        "FunctionCallOutput",
        {"type": "function_call_output", "call_id": "call_1", "output": "21C, sunny"},
    ),
    (
        "FunctionCallOutput",
        {
            "type": "function_call_output",
            "call_id": "call_2",
            "output": [
                {"type": "input_text", "text": "12:00"},
                {"type": "input_image", "image_url": PNG_URL, "detail": "low"},
            ],
            "name": "get_time",
            "status": "completed",
            "id": None,
        },
    ),
    (
        "ResponseCustomToolCallParam",
        {
            "type": "custom_tool_call",
            "id": "ctc_01",
            "call_id": "call_3",
            "name": "run_sql",
            "input": "SELECT 1; -- not JSON",
        },
    ),
    (
        "ResponseCustomToolCallOutputParam",
        {"type": "custom_tool_call_output", "call_id": "call_3", "output": "1 row"},
    ),
    # the client-executed calls of one response, then their outputs
    (
        "ResponseComputerToolCallParam",
        {
            "type": "computer_call",
            "id": "cu_01",
            "call_id": "call_4",
            "action": {"type": "click", "x": 10, "y": 20, "button": "left"},
            "pending_safety_checks": [],
            "status": "completed",
        },
    ),
    (
        "LocalShellCall",
        {
            "type": "local_shell_call",
            "id": "lsh_01",
            "call_id": "call_5",
            "action": {
                "type": "exec",
                "command": ["ls", "-la"],
                "env": {"LANG": "C"},
                "timeout_ms": 1000,
                "working_directory": "/tmp",
                "user": None,
            },
            "status": "completed",
        },
    ),
    (
        "ShellCall",
        {
            "type": "shell_call",
            "id": "sh_01",
            "call_id": "call_6",
            "action": {"commands": ["echo hi"], "timeout_ms": 5000, "max_output_length": 4096},
            "status": "completed",
            "environment": {"type": "local"},
            "created_by": "resp_01",
        },
    ),
    (
        "ApplyPatchCall",
        {
            "type": "apply_patch_call",
            "id": "apc_01",
            "call_id": "call_7",
            "operation": {"type": "update_file", "path": "a.py", "diff": "@@ -1 +1 @@\n-a\n+b\n"},
            "status": "completed",
            "created_by": "resp_01",
        },
    ),
    (
        "ComputerCallOutput",
        {
            "type": "computer_call_output",
            "call_id": "call_4",
            "output": {"type": "computer_screenshot", "image_url": PNG_URL},
            "acknowledged_safety_checks": [
                {"id": "sc_1", "code": "malicious_instructions", "message": "Check the page."}
            ],
        },
    ),
    # the SDK writes `call_id`, which the openai type does not declare, beside the API's `id`
    (
        "LocalShellCallOutput",
        {
            "type": "local_shell_call_output",
            "id": "call_5",
            "call_id": "call_5",
            "output": "total 0",
        },
    ),
    (
        "ShellCallOutput",
        {
            "type": "shell_call_output",
            "call_id": "call_6",
            "output": [
                {"stdout": "hi\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}
            ],
            "max_output_length": 4096,
        },
    ),
    (
        "ApplyPatchCallOutput",
        {
            "type": "apply_patch_call_output",
            "call_id": "call_7",
            "status": "failed",
            "output": "patch did not apply",
        },
    ),
    # the server's own tools and items, and an approval request, in one response
    (
        "ResponseFileSearchToolCallParam",
        {
            "type": "file_search_call",
            "id": "fs_01",
            "queries": ["paris climate"],
            "status": "completed",
            "results": [
                {
                    "file_id": "file-1",
                    "filename": "a.pdf",
                    "score": 0.92,
                    "text": "Paris is mild.",
                    "attributes": {"lang": "en", "year": 2026, "public": True},
                }
            ],
        },
    ),
    (
        "ResponseFunctionWebSearchParam",
        {
            "type": "web_search_call",
            "id": "ws_01",
            "status": "completed",
            "action": {
                "type": "search",
                "query": "paris weather",
                "sources": [{"type": "url", "url": "https://weather.example"}],
            },
        },
    ),
    (
        "ResponseCodeInterpreterToolCallParam",
        {
            "type": "code_interpreter_call",
            "id": "ci_01",
            "code": "print(21 * 2)",
            "container_id": "cntr_01",
            "outputs": [{"type": "logs", "logs": "42\n"}],
            "status": "completed",
        },
    ),
    (
        "ImageGenerationCall",
        {
            "type": "image_generation_call",
            "id": "ig_01",
            "result": "iVBORw0KGgo=",
            "status": "completed",
            "revised_prompt": "a cat in Paris",
            "output_format": "png",
            "size": "1024x1024",
        },
    ),
    (
        "ToolSearchCall",
        {
            "type": "tool_search_call",
            "id": "tsc_01",
            "call_id": None,
            "arguments": {"query": "weather tools"},
            "execution": "server",
            "status": "completed",
        },
    ),
    (
        "ResponseToolSearchOutputItemParamParam",
        {
            "type": "tool_search_output",
            "id": "tso_01",
            "call_id": None,
            "execution": "server",
            "status": "completed",
            "tools": [
                {
                    "type": "function",
                    "name": "get_forecast",
                    "parameters": {"type": "object", "properties": {}},
                    "strict": True,
                }
            ],
        },
    ),
    (
        "McpListTools",
        {
            "type": "mcp_list_tools",
            "id": "mcpl_01",
            "server_label": "deepwiki",
            "tools": [
                {
                    "name": "ask",
                    "input_schema": {"type": "object"},
                    "annotations": None,
                    "description": "Ask a question.",
                }
            ],
            "error": None,
        },
    ),
    (
        "McpCall",
        {
            "type": "mcp_call",
            "id": "mcp_01",
            "server_label": "deepwiki",
            "name": "ask",
            "arguments": '{"q":"rain?"}',
            "output": "No rain.",
            "error": None,
            "status": "completed",
        },
    ),
    (
        "Program",
        {
            "type": "program",
            "id": "prog_01",
            "call_id": "call_p",
            "code": "await tools.get_weather({city: 'Lyon'})",
            "fingerprint": "fp_abc123",
        },
    ),
    (
        "ProgramOutput",
        {
            "type": "program_output",
            "id": "progo_01",
            "call_id": "call_p",
            "result": '{"temp": 19}',
            "status": "completed",
        },
    ),
    (
        "ResponseCompactionItemParamParam",
        {"type": "compaction", "id": "cmp_01", "encrypted_content": "gAAAAQ=="},
    ),
    (
        "McpApprovalRequest",
        {
            "type": "mcp_approval_request",
            "id": "mcpr_01",
            "server_label": "deepwiki",
            "name": "ask",
            "arguments": '{"q":"wind?"}',
        },
    ),
    (
        "McpApprovalResponse",
        {
            "type": "mcp_approval_response",
            "approval_request_id": "mcpr_01",
            "approve": True,
            "reason": "ok",
        },
    ),
    # the client's bookkeeping
    (
        "AdditionalTools",
        {
            "type": "additional_tools",
            "id": "at_01",
            "role": "developer",
            "tools": [{"type": "function", "name": "f", "parameters": {}, "strict": False}],
        },
    ),
    (
        "ResponseConfigurationUpdateItemParamParam",
        {
            "type": "configuration_update",
            "id": "cfg_01",
            "reasoning": {"effort": "low"},
            "text": {"format": {"type": "text"}},
        },
    ),
    ("ItemReference", {"type": "item_reference", "id": "msg_00"}),
    ("ItemReference", {"id": "rs_00"}),
    ("CompactionTrigger", {"type": "compaction_trigger"}),
]


def items() -> list[Item]:
    return [copy.deepcopy(item) for _, item in CORPUS]


def union_members() -> dict[str, set[str | None]]:
    """Every TypedDict of the installed `ResponseInputItemParam` and the `type` literals it allows."""
    members: dict[str, set[str | None]] = {}
    for member in typing.get_args(ResponseInputItemParam):
        hint = typing.get_type_hints(member)["type"]  # strips Required[]
        literals: set[str | None] = set()
        for arg in typing.get_args(hint) or (hint,):
            literals.update(
                typing.get_args(arg) if typing.get_origin(arg) is typing.Literal else {None}
            )
        members[member.__name__] = literals
    return members


def test_the_corpus_holds_every_item_type_of_the_installed_openai() -> None:
    members = union_members()
    assert len(members) == len(typing.get_args(ResponseInputItemParam))
    assert set(members) - {name for name, _ in CORPUS} == set(), "add these members to the corpus"
    assert {name for name, _ in CORPUS} <= set(members)
    literals = {t for allowed in members.values() for t in allowed if t is not None}
    seen = {item.get("type") for _, item in CORPUS}
    assert literals - seen == set(), "add items of these types to the corpus"


@pytest.mark.parametrize(
    ("member", "item"), CORPUS, ids=[f"{i}-{m}" for i, (m, _) in enumerate(CORPUS)]
)
def test_every_corpus_item_is_valid_for_its_openai_type(member: str, item: Item) -> None:
    (cls,) = [m for m in typing.get_args(ResponseInputItemParam) if m.__name__ == member]
    pydantic.TypeAdapter(cls).validate_python(item)


# -- the round trip ---------------------------------------------------------------------


def stored(messages: list[Message]) -> list[Message]:
    """Messages as the store gives them back: each dumped to its payload, then one parse."""
    return load_messages([dump_message(m) for m in messages])


def canonical(things: list[Item]) -> list[str]:
    return [json.dumps(item, sort_keys=True) for item in things]


@pytest.mark.parametrize(
    ("member", "item"), CORPUS, ids=[f"{i}-{m}" for i, (m, _) in enumerate(CORPUS)]
)
def test_every_item_round_trips_json_equal(member: str, item: Item) -> None:
    messages = to_messages([item])
    assert len(messages) == 1
    assert canonical(from_messages(stored(messages))) == canonical([item])


def test_the_whole_corpus_round_trips_as_one_history() -> None:
    history = items()
    messages = stored(to_messages(history))
    assert canonical(from_messages(messages)) == canonical(history)
    assert sum(item_count(m) for m in messages) == len(history)
    assert [item_count(m) for m in messages] == [
        len((m.model_extra or {})["native"]["items"]) for m in messages
    ]
    assert well_formed(messages)  # repair has nothing to do


def test_every_message_carries_the_items_it_was_made_of() -> None:
    history = items()
    messages = to_messages(history)
    natives = [item for m in messages for item in (m.model_extra or {})["native"]["items"]]
    assert natives == history
    assert all(set((m.model_extra or {})["native"]) == {"items"} for m in messages)


# -- grouping ---------------------------------------------------------------------------


def test_one_model_response_is_one_assistant_message_and_its_outputs_tool_messages() -> None:
    turn = items()[4:10]  # reasoning, message, two function calls, two outputs
    messages = stored(to_messages(turn))
    assert [m.role for m in messages] == ["assistant", "tool", "tool"]
    assistant, weather, time = messages
    assert assistant.content == "Checking both."
    assert assistant.parts == [ThinkingPart(text="The user wants two facts.")]
    assert assistant.tool_calls == [
        ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}'),
        ToolCall(id="call_2", name="get_time", arguments='{"tz": "CET" '),
    ]
    assert (weather.tool_call_id, weather.tool_name, weather.content) == (
        "call_1",
        "get_weather",
        "21C, sunny",
    )
    assert (time.tool_call_id, time.tool_name) == ("call_2", "get_time")
    assert time.parts == [TextPart(text="12:00"), UrlPart(url=PNG_URL, media_type="image/png")]
    assert [item_count(m) for m in messages] == [4, 1, 1]
    assert well_formed(messages)


def test_a_run_of_assistant_items_ends_at_anything_else() -> None:
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
    answer = {"role": "assistant", "content": "done"}
    user = {"role": "user", "content": "again"}
    messages = to_messages([call, output, answer, user, dict(call, call_id="c2"), answer])
    assert [(m.role, item_count(m)) for m in messages] == [
        ("assistant", 1),
        ("tool", 1),
        ("assistant", 1),
        ("user", 1),
        ("assistant", 2),
    ]
    assert messages[-1].content == "done"


def test_the_client_executed_calls_are_tool_calls_named_by_their_type() -> None:
    messages = to_messages(items()[12:20])
    assert [m.role for m in messages] == ["assistant"] + ["tool"] * 4
    assert [(c.id, c.name) for c in messages[0].tool_calls] == [
        ("call_4", "computer_call"),
        ("call_5", "local_shell_call"),
        ("call_6", "shell_call"),
        ("call_7", "apply_patch_call"),
    ]
    assert messages[0].tool_calls[0].arguments == '{"type":"click","x":10,"y":20,"button":"left"}'
    assert messages[0].tool_calls[3].arguments_object() == {
        "type": "update_file",
        "path": "a.py",
        "diff": "@@ -1 +1 @@\n-a\n+b\n",
    }
    screenshot, local, shell, patch = messages[1:]
    assert screenshot.parts == [UrlPart(url=PNG_URL, media_type="image/png")]
    assert (local.tool_call_id, local.tool_name, local.content) == (
        "call_5",
        "local_shell_call",
        "total 0",
    )
    assert json.loads(shell.content) == [
        {"stdout": "hi\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}
    ]
    assert (patch.failed, patch.content) == (True, "patch did not apply")
    assert well_formed(messages)


def test_server_side_items_are_unknown_parts_of_one_assistant_message() -> None:
    server = items()[20:33]
    (message, approval) = to_messages(server)
    assert [p.kind for p in message.parts] == [
        "openai.file_search_call",
        "openai.web_search_call",
        "openai.code_interpreter_call",
        "openai.image_generation_call",
        "openai.tool_search_call",
        "openai.tool_search_output",
        "openai.mcp_list_tools",
        "openai.mcp_call",
        "openai.program",
        "openai.program_output",
        "openai.compaction",
    ]
    assert message.tool_calls == [ToolCall(id="mcpr_01", name="ask", arguments='{"q":"wind?"}')]
    assert (approval.role, approval.tool_call_id, approval.tool_name) == ("tool", "mcpr_01", "ask")
    assert json.loads(approval.content) == {"approve": True, "reason": "ok"}


def test_a_client_executed_tool_search_is_a_call_and_a_result() -> None:
    call = {
        "type": "tool_search_call",
        "call_id": "ts1",
        "arguments": {"query": "db"},
        "execution": "client",
        "status": "completed",
    }
    output = {"type": "tool_search_output", "call_id": "ts1", "execution": "client", "tools": []}
    asked, answered = to_messages([call, output])
    assert asked.tool_calls == [
        ToolCall(id="ts1", name="tool_search_call", arguments='{"query":"db"}')
    ]
    assert (answered.role, answered.tool_call_id, answered.content) == ("tool", "ts1", "[]")
    assert well_formed([asked, answered])


def test_inputs_project_to_user_and_system_messages() -> None:
    user, system, parts, developer = stored(to_messages(items()[:4]))
    assert (user.role, user.content) == ("user", "Weather in Paris? ünïcode ✓")
    assert (system.role, system.content) == ("system", "You are terse.")
    assert parts.role == "user"
    assert parts.parts == [
        TextPart(text="and these:"),
        UrlPart(url="https://example.com/cat.png", media_type="image/png"),
        UnknownPart(kind="openai.file"),
        DataPart(media_type="application/pdf", data="JVBERi0xLjQK"),
        UrlPart(url="https://example.com/b.pdf", media_type="application/pdf"),
        UnknownPart(kind="openai.file"),
    ]
    assert (developer.role, developer.text) == ("system", "Answer in French.")


def test_bookkeeping_items_are_system_messages() -> None:
    messages = to_messages(items()[-5:])
    assert [m.role for m in messages] == ["system"] * 5
    assert [m.parts[0].kind for m in messages] == [
        "openai.additional_tools",
        "openai.configuration_update",
        "openai.item_reference",
        "openai.item_reference",  # no `type`: only an `id`
        "openai.compaction_trigger",
    ]


def test_an_unknown_or_absent_type_is_assistant_side() -> None:
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    newer = {"type": "hologram_call", "id": "h1", "payload": {"x": [1, 2]}}
    odd = {"foo": "bar"}
    (message,) = to_messages([call, newer, odd])
    assert [p.kind for p in message.parts] == ["openai.hologram_call", "openai.unknown"]
    assert item_count(message) == 3
    assert canonical(from_messages(stored([message]))) == canonical([call, newer, odd])


def test_a_tool_result_names_its_tool_from_the_call_or_its_type() -> None:
    call = {"type": "custom_tool_call", "call_id": "c1", "name": "grep", "input": "x"}
    output = {"type": "custom_tool_call_output", "call_id": "c1", "output": "y"}
    assert to_messages([call, output])[1].tool_name == "grep"
    assert to_messages([output])[0].tool_name == "custom_tool_call"  # the call is not in sight
    api_form = {"type": "local_shell_call_output", "id": "call_9", "output": "{}"}
    sdk_form = {"type": "local_shell_call_output", "call_id": "call_8", "output": "{}"}
    api, sdk = to_messages([api_form, sdk_form])
    assert (api.tool_call_id, api.tool_name) == ("call_9", "local_shell_call")
    assert (sdk.tool_call_id, sdk.tool_name) == ("call_8", "local_shell_call")


# -- what is refused --------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        {"role": "user", "content": ("a", "tuple")},
        {"type": "function_call_output", "call_id": "c", "output": b"bytes"},
        {"type": "reasoning", "id": "r", "summary": [], "when": datetime(2026, 1, 1, tzinfo=UTC)},
        {"type": "message", "role": "user", "content": "x", "score": math.nan},
        {"type": "message", "role": "user", "content": "x", "provider_data": {1: "int key"}},
        {"role": "user", "content": "lone \ud800 surrogate"},
    ],
)
def test_an_item_that_is_not_plain_json_is_refused(bad: Item) -> None:
    with pytest.raises(InvalidInputError, match="Session item 1"):
        to_messages([{"role": "user", "content": "fine"}, bad])


def test_an_item_that_is_not_a_mapping_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="not a mapping"):
        to_messages([["role", "user"]])  # type: ignore[list-item]


def test_a_foreign_native_is_refused_with_a_sentence() -> None:
    message = Message.model_validate({"role": "user", "native": {"kind": "request", "parts": []}})
    with pytest.raises(InvalidInputError, match="another adapter"):
        from_messages([message])


# -- copies -----------------------------------------------------------------------------


def test_a_returned_item_is_a_copy() -> None:
    messages = to_messages(items())
    first = from_messages(messages)
    first[2]["content"][0]["text"] = "changed"
    first[4]["summary"].clear()
    del first[0]["content"]
    assert canonical(from_messages(messages)) == canonical(items())


def test_changing_an_item_after_translation_changes_no_message() -> None:
    history = items()
    messages = to_messages(history)
    history[2]["content"][0]["text"] = "changed"
    assert canonical(from_messages(messages)) == canonical(items())


# -- messages without native ------------------------------------------------------------


def test_messages_written_by_chatledger_convert_to_responses_items() -> None:
    history = [
        Message(role="system", content="Be brief."),
        Message(
            role="user",
            content="see",
            parts=[
                UrlPart(url="https://example.com/x.png", media_type="image/png"),
                DataPart(media_type="application/pdf", data="JVBERg=="),
            ],
        ),
        Message(
            role="assistant",
            content="calling",
            parts=[ThinkingPart(text="plan")],
            tool_calls=[ToolCall(id="c1", name="lookup", arguments='{"q":1}')],
        ),
        Message(
            role="tool", tool_call_id="c1", content="No result was recorded"
        ),  # as repair writes it
        Message(role="assistant", tool_calls=[ToolCall(id="c2", name="f")]),
        Message(role="tool", tool_call_id="c2", tool_name="f", content="ok"),
        Message(role="assistant"),
    ]
    converted = from_messages(stored(history))
    assert converted == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "see"},
                {"type": "input_image", "image_url": "https://example.com/x.png", "detail": "auto"},
                {"type": "input_file", "file_data": "data:application/pdf;base64,JVBERg=="},
            ],
        },
        {"role": "assistant", "content": "calling"},
        {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": '{"q":1}'},
        {"type": "function_call_output", "call_id": "c1", "output": "No result was recorded"},
        {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c2", "output": "ok"},
        {"role": "assistant", "content": ""},
    ]
    assert [item_count(m) for m in history] == [1, 1, 2, 1, 1, 1, 1]
    assert sum(item_count(m) for m in history) == len(converted)
    # and the SDK's own item type accepts them
    adapter: Any = pydantic.TypeAdapter(ResponseInputItemParam)
    for item in converted:
        adapter.validate_python(item)


def test_native_and_native_less_messages_mix() -> None:
    native = to_messages(items()[4:8])
    synthesized = [
        Message(role="tool", tool_call_id="call_1", content="No result was recorded"),
        Message(role="tool", tool_call_id="call_2", content="No result was recorded"),
    ]
    back = from_messages([*native, *synthesized])
    assert canonical(back[:4]) == canonical(items()[4:8])
    assert [item["call_id"] for item in back[4:]] == ["call_1", "call_2"]


# -- any sequence -----------------------------------------------------------------------

_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=8)
_item = st.one_of(
    st.sampled_from([item for _, item in CORPUS]),
    st.builds(
        lambda role, text: {"role": role, "content": text},
        st.sampled_from(["user", "assistant", "developer"]),
        _text,
    ),
    st.builds(
        lambda call_id, args: {
            "type": "function_call",
            "call_id": call_id,
            "name": "t",
            "arguments": args,
        },
        st.sampled_from(["c1", "c2"]),
        _text,
    ),
    st.builds(
        lambda call_id, out: {"type": "function_call_output", "call_id": call_id, "output": out},
        st.sampled_from(["c1", "c2", "c3"]),
        st.one_of(_text, st.just([{"type": "input_text", "text": "x"}])),
    ),
    st.dictionaries(_text, st.one_of(st.none(), st.integers(), _text), max_size=3),
)


def is_assistant_side(message: Message) -> bool:
    return message.role == "assistant"


@given(st.lists(_item, max_size=12))
def test_any_item_sequence_round_trips(history: list[Item]) -> None:
    history = copy.deepcopy(history)
    messages = stored(to_messages(history))
    assert canonical(from_messages(messages)) == canonical(history)
    assert sum(item_count(m) for m in messages) == len(history)
    # only assistant messages hold more than one item, and no two of them are adjacent
    assert all(item_count(m) == 1 for m in messages if m.role != "assistant")
    assert not any(a.role == b.role == "assistant" for a, b in itertools.pairwise(messages))
