"""Tools: `tools` and `tool_choice` on chat completions (executing a tool is the client's business).

    tool_choice   output constraint                                         answer
    none          none (tools are still shown to the model)                 content
    auto          none                                                      tool_calls parsed from <tool_call>{...}</tool_call>
                                                                            blocks (Hermes style), else content
    required      JSON: [{"name": <one of the tools>, "parameters": {...}}, ...] (vLLM's shape)   tool_calls
    {function}    JSON: that function's parameters schema                  one tool_call, arguments streamed

Tools reach the model through its chat template (`tools=`); a template that never mentions tools gets them as
a system message instead, so the model is told about them either way. With tool calls the finish reason is
`tool_calls`.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from producers.gateway.admission.requests import ResponseFormat
from producers.gateway.errors import ApiError

HERMES_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = Field(default=None, max_length=4096)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: NamedFunction


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    arguments: str


class ToolCall(BaseModel):
    """An assistant message's earlier tool call (conversation history)."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCall


@dataclass(frozen=True)
class ToolMode:
    """How the answer's text becomes tool calls: `named` (the text is the arguments of `names[0]`),
    `required` (a JSON list of {name, parameters}), `auto` (Hermes blocks, if any)."""

    kind: Literal["named", "required", "auto"]
    names: tuple[str, ...]


def parameters_of(tool: Tool) -> dict[str, Any]:
    return tool.function.parameters or {"type": "object", "properties": {}}


def tool_mode(tools: list[Tool] | None, choice: str | NamedToolChoice | None) -> ToolMode | None:
    """The mode for these fields (None: plain content); ApiError 400 naming tool_choice when it names no tool."""
    if not tools:
        if choice not in (None, "none", "auto"):
            raise ApiError(400, "invalid_request", "tool_choice needs tools", {"field": "tool_choice"})
        return None
    names = tuple(t.function.name for t in tools)
    if len(set(names)) != len(names):
        raise ApiError(400, "invalid_request", "tool names must be unique", {"field": "tools"})
    if choice == "none":
        return None
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in names:
            raise ApiError(400, "invalid_request", f"tool_choice names {choice.function.name!r}, which is not "
                           f"among the tools", {"field": "tool_choice"})
        return ToolMode("named", (choice.function.name,))
    return ToolMode("required" if choice == "required" else "auto", names)


def tool_constraint(tools: list[Tool], mode: ToolMode | None) -> ResponseFormat | None:
    """The output constraint `mode` asks for: the named function's parameters, or vLLM's list of calls."""
    if mode is None or mode.kind == "auto":
        return None
    by_name = {t.function.name: t for t in tools}
    if mode.kind == "named":
        tool = by_name[mode.names[0]]
        return ResponseFormat(type="json_schema", json_schema=parameters_of(tool), strict=bool(tool.function.strict))
    calls = [{"type": "object", "additionalProperties": False, "required": ["name", "parameters"],
              "properties": {"name": {"const": t.function.name}, "parameters": parameters_of(t)}} for t in tools]
    return ResponseFormat(type="json_schema", strict=False, json_schema={
        "type": "array", "minItems": 1, "items": calls[0] if len(calls) == 1 else {"anyOf": calls}})


def template_tools(tools: list[Tool]) -> list[dict]:
    """The tools as chat templates take them (OpenAI's shape)."""
    return [t.model_dump(exclude_none=True) for t in tools]


def tools_system_prompt(tools: list[dict]) -> str:
    """For a chat template that ignores `tools`: the tools and the call format, as a system message."""
    return ("You may call these tools. To call one, answer with <tool_call>{\"name\": <tool name>, "
            "\"arguments\": <arguments as JSON>}</tool_call>.\nTools:\n" + json.dumps(tools, separators=(",", ":")))


def tool_calls_of(text: str, mode: ToolMode, call_id: str) -> tuple[list[dict], str | None]:
    """(tool calls, remaining content) from an answer's text. The constrained modes always parse; a text
    that does not (cut by max_tokens) stays content with no calls."""
    calls: list[tuple[str, str]] = []
    content: str | None = text
    try:
        if mode.kind == "named":
            json.loads(text)
            calls, content = [(mode.names[0], text)], None
        elif mode.kind == "required":
            calls = [(c["name"], json.dumps(c["parameters"], separators=(",", ":"))) for c in json.loads(text)]
            content = None
        else:
            for match in HERMES_CALL.finditer(text):
                call = json.loads(match.group(1))
                if call.get("name") in mode.names:
                    arguments = call.get("arguments", call.get("parameters", {}))
                    calls.append((call["name"], arguments if isinstance(arguments, str)
                                  else json.dumps(arguments, separators=(",", ":"))))
            if calls:
                content = HERMES_CALL.sub("", text).strip() or None
    except (ValueError, TypeError, KeyError, AttributeError):
        return [], text
    return [{"id": f"{call_id}-{i}", "type": "function", "function": {"name": name, "arguments": arguments}}
            for i, (name, arguments) in enumerate(calls)], content
