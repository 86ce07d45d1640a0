"""--tools FILE and --tool-choice (loadgen/llm/tools.py): the tools array read in either
form, sent in the target's form, and each bad file refused naming what is wrong."""

from __future__ import annotations

import json

import pytest

from loadgen.llm.tools import DEFAULT_TOOL_RESULT, load_tools

CHAT_FORM = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"},
                                              "x-result": {"temp_c": 21}}}
FLAT_FORM = {"type": "function", "name": "get_time", "description": "now", "x-result": "noon"}


def _file(tmp_path, doc) -> str:
    path = tmp_path / "tools.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


def test_either_form_is_sent_in_the_targets_form_without_x_result(tmp_path):
    tools = load_tools(_file(tmp_path, {"tools": [CHAT_FORM, FLAT_FORM]}))
    chat = tools.body_fields("chat")
    assert chat["tool_choice"] == "auto"
    assert chat["tools"] == [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
                             {"type": "function", "function": {"name": "get_time", "description": "now"}}]
    flat = tools.body_fields("responses")["tools"]
    assert flat == [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}},
                    {"type": "function", "name": "get_time", "description": "now"}]
    assert "x-result" not in json.dumps(chat) + json.dumps(flat)


def test_a_calls_result_is_its_functions_x_result_else_the_fixed_one(tmp_path):
    tools = load_tools(_file(tmp_path, [CHAT_FORM, FLAT_FORM, {"type": "function", "function": {"name": "f"}}]))
    assert tools.result("get_weather") == '{"temp_c": 21}'  # a JSON value: its JSON text
    assert tools.result("get_time") == "noon"
    assert tools.result("f") == tools.result("unknown") == DEFAULT_TOOL_RESULT


def test_tool_choice_naming_a_function_is_sent_in_the_targets_form(tmp_path):
    path = _file(tmp_path, [CHAT_FORM])
    tools = load_tools(path, "get_weather")
    assert tools.body_fields("chat")["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert tools.body_fields("responses")["tool_choice"] == {"type": "function", "name": "get_weather"}
    assert load_tools(path, "required").body_fields("chat")["tool_choice"] == "required"
    with pytest.raises(ValueError, match=r"--tool-choice nope: not auto, none, required or a function of --tools .*"
                                         r"\(get_weather\)"):
        load_tools(path, "nope")


@pytest.mark.parametrize("content, says", [
    ("[", "not JSON"),
    ("[]", "not an OpenAI tools array"),
    ('{"tools": {}}', "not an OpenAI tools array"),
    ("[1]", "tool 1 is not a JSON object"),
    ('[{"type": "function", "function": "f"}]', "tool 1: 'function' is not a JSON object"),
    ('[{"type": "function", "function": {"name": ""}}]', "tool 1 has no function 'name'"),
    ('[{"type": "function", "name": "f", "parameters": []}]', "tool 1 (f): 'parameters' is not a JSON object"),
    ('[{"type": "file_search"}]', "tool 1 has type 'file_search'; only \"function\" tools are sent"),
    ('[{"name": "f"}, {"name": "f"}]', "tool 2: function 'f' is defined twice"),
])
def test_a_bad_file_is_refused_naming_the_file_and_what_is_wrong(tmp_path, content, says):
    path = _file(tmp_path, content)
    with pytest.raises(ValueError) as e:
        load_tools(path)
    assert str(e.value).startswith(f"--tools {path}: ") and says in str(e.value)
    assert "\n" not in str(e.value)


def test_a_missing_file_is_refused(tmp_path):
    with pytest.raises(ValueError, match="cannot read .*none"):
        load_tools(str(tmp_path / "none.json"))
