"""Function calling: declared tools into the prompt and a grammar, the answer back into tool calls.

Tools come in Workers AI's shape (`{name, description, parameters}`) or OpenAI's
(`{"type": "function", "function": {name, description, parameters, strict}}`).

The prompt: a chat template that reads `tools` gets them (OpenAI's function shape, as
transformers passes them) and describes them in the model's own format. SmolLM2's template has
none, so the documented fallback is used for it and every such template: the functions are listed
in the system prompt (added, or appended to the one the client sent), and the model is told to
answer a call with one JSON object `{"name": <function>, "arguments": <object>}`. Either way the
grammar below fixes how a call is written, so the answer is read the same way for every model.

The grammar (sent to the backend as `response_format`, so every backend enforces it the same way):

- `tool_choice: "required"` or a named function: the whole answer is one call, a JSON value valid
  against `anyOf` of `{"name": {"const": f}, "arguments": <f's parameters>}` over the allowed
  functions;
- `"auto"` (the default when tools are given): a structural tag. The model writes free text, and
  the moment it writes `{"name": ` the rest must be `"<a declared function>", "arguments": <its
  parameters>}`. So it may answer in words or call, and a call always has valid arguments;
- `"none"`: tools are left out of the prompt and nothing is constrained.

The answer: calls are cut out of the text (`split_calls`) and returned as Workers AI
`result.tool_calls` (`[{name, arguments}]`, arguments an object) or OpenAI `message.tool_calls`
(`id`, `type: "function"`, `function.name`, `function.arguments` as a JSON string) with
finish_reason "tool_calls". A later turn may carry the assistant's `tool_calls` and `tool` role
messages with the results: both are rendered back into the conversation as text.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from gateway.errors import InvalidInput
from gateway.pipeline.structured import check_schema, json_schema_format

CALL_TRIGGER = '{"name": '
MAX_TOOLS = 64
ToolMode = Literal["auto", "required", "named"]


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str

    def workers_ai(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments}

    def openai(self, index: int | None = None) -> dict[str, Any]:
        call: dict[str, Any] = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)},
        }
        return call if index is None else {"index": index, **call}


@dataclass(frozen=True, slots=True)
class ToolUse:
    """The tools a request may call and how (`tool_choice`)."""

    tools: tuple[Tool, ...]
    mode: ToolMode
    named: str | None = None  # the one function a named tool_choice forces
    parallel: bool = True  # OpenAI's parallel_tool_calls: false keeps the first call only

    @property
    def callable_tools(self) -> tuple[Tool, ...]:
        return tuple(t for t in self.tools if self.named is None or t.name == self.named)

    @property
    def is_whole_answer_a_call(self) -> bool:
        return self.mode != "auto"

    def response_format(self) -> dict[str, Any]:
        """The backend `response_format` that keeps calls valid (see the module docstring)."""
        if self.mode == "auto":
            structures = [
                {"begin": f'{CALL_TRIGGER}{json.dumps(t.name)}, "arguments": ', "schema": t.parameters, "end": "}"}
                for t in self.tools
            ]
            return {"type": "structural_tag", "structures": structures, "triggers": [CALL_TRIGGER]}
        options = [
            {
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in self.callable_tools
        ]
        schema = options[0] if len(options) == 1 else {"anyOf": options}
        return json_schema_format(schema, "tool_call")

    def template_tools(self) -> list[dict[str, Any]]:
        """The tools as a chat template reads them (OpenAI's function shape, as transformers passes them)."""
        return [
            {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
            for t in self.callable_tools
        ]

    def system_prompt(self) -> str:
        lines = ["You can call the following functions:"]
        for tool in self.callable_tools:
            params = json.dumps(tool.parameters, ensure_ascii=False)
            lines.append(f"- {tool.name}: {tool.description or 'no description'} Parameters (JSON Schema): {params}")
        lines.append(
            'To call a function, answer with only a JSON object: {"name": <function name>, "arguments": <arguments>}.'
        )
        if self.mode == "auto":
            lines.append("If no function is needed, answer the user in plain text.")
        return "\n".join(lines)

    def split_calls(self, text: str) -> tuple[str, list[ToolCall]]:
        """The answer's text without its calls, and the calls (valid ones of declared functions)."""
        names = {t.name for t in self.callable_tools}
        decoder = json.JSONDecoder()
        calls: list[ToolCall] = []
        kept: list[str] = []
        start = 0
        while (found := text.find("{", start)) != -1:
            try:
                value, end = decoder.raw_decode(text, found)
            except ValueError:
                kept.append(text[start : found + 1])
                start = found + 1
                continue
            if _is_call(value, names):
                kept.append(text[start:found])
                calls.append(ToolCall(value["name"], value["arguments"], f"call_{uuid.uuid4().hex[:24]}"))
            else:
                kept.append(text[start:end])
            start = end
        kept.append(text[start:])
        if not self.parallel:
            calls = calls[:1]
        return "".join(kept).strip() if calls else text, calls


def _is_call(value: Any, names: set[str]) -> bool:
    return (
        isinstance(value, dict)
        and set(value) == {"name", "arguments"}
        and value["name"] in names
        and isinstance(value["arguments"], dict)
    )


# ---- parsing ----------------------------------------------------------------------------------


def _tool(value: Any, i: int) -> Tool:
    where = f"tools[{i}]"
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("function"), dict):
        value, where = value["function"], f"tools[{i}].function"  # OpenAI's wrapper
    if not isinstance(value, dict):
        raise InvalidInput(f"{where} must be an object with name, description and parameters", param="tools")
    name, description = value.get("name"), value.get("description", "")
    parameters = value.get("parameters") or {"type": "object", "properties": {}}
    if not isinstance(name, str) or not name or len(name) > 64:
        raise InvalidInput(f"{where}.name must be a function name of 1 to 64 characters", param="tools")
    if not isinstance(description, str):
        raise InvalidInput(f"{where}.description must be a string", param="tools")
    if not isinstance(parameters, dict):
        raise InvalidInput(f"{where}.parameters must be a JSON Schema object", param="tools")
    check_schema(parameters, f"{where}.parameters", "tools")
    return Tool(name, description, parameters)


def parse_tool_use(tools: Any, tool_choice: Any, parallel_tool_calls: Any = None) -> ToolUse | None:
    """The request's tool use, or None when there is nothing to call (no tools, or tool_choice none)."""
    if tools is None or tools == []:
        if tool_choice not in (None, "none", "auto"):
            raise InvalidInput("tool_choice needs tools: declare the functions in tools", param="tool_choice")
        return None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise InvalidInput(f"tools must be an array of up to {MAX_TOOLS} functions", param="tools")
    parsed = tuple(_tool(t, i) for i, t in enumerate(tools))
    if len({t.name for t in parsed}) != len(parsed):
        raise InvalidInput("tools declares the same function name twice", param="tools")
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise InvalidInput("parallel_tool_calls must be true or false", param="parallel_tool_calls")
    parallel = parallel_tool_calls is not False
    if tool_choice is None or tool_choice == "auto":
        return ToolUse(parsed, "auto", parallel=parallel)
    if tool_choice == "none":
        return None
    if tool_choice == "required":
        return ToolUse(parsed, "required", parallel=parallel)
    if isinstance(tool_choice, dict):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, dict) else tool_choice.get("name")
        if tool_choice.get("type", "function") == "function" and isinstance(name, str):
            if name not in {t.name for t in parsed}:
                raise InvalidInput(f"tool_choice names {name!r}, which is not in tools", param="tool_choice")
            return ToolUse(parsed, "named", named=name, parallel=parallel)
    raise InvalidInput(
        'tool_choice must be "auto", "none", "required" or {"type": "function", "function": {"name": ...}}',
        param="tool_choice",
    )


def call_text(name: str, arguments: Any) -> str:
    """A call as the model writes it (what a later turn's assistant message renders to)."""
    if isinstance(arguments, str):  # OpenAI sends the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)


def assistant_calls_text(tool_calls: Any, where: str) -> str:
    """The text of an assistant message's `tool_calls` (OpenAI's or Workers AI's shape)."""
    if not isinstance(tool_calls, list):
        raise InvalidInput(f"{where}.tool_calls must be an array", param="messages")
    texts = []
    for j, call in enumerate(tool_calls):
        function = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidInput(f"{where}.tool_calls[{j}] must name a function", param="messages")
        texts.append(call_text(function["name"], function.get("arguments", {})))
    return "\n".join(texts)


def with_tools_prompt(messages: tuple[dict[str, str], ...], use: ToolUse) -> tuple[dict[str, str], ...]:
    """`messages` with the tools described in the system prompt (appended to the client's, if any)."""
    prompt = use.system_prompt()
    if messages and messages[0]["role"] == "system":
        first = {"role": "system", "content": f"{messages[0]['content']}\n\n{prompt}"}
        return (first, *messages[1:])
    return ({"role": "system", "content": prompt}, *messages)


@dataclass(frozen=True, slots=True)
class CallDelta:
    """A piece of a streamed call, in OpenAI's delta shape: the first of a call has its `id` and
    `name` (and empty arguments), the next ones pieces of its `arguments` JSON text."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def openai(self) -> dict[str, Any]:
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        function = {"name": self.name, "arguments": self.arguments}
        return {"index": self.index, "id": self.id, "type": "function", "function": function}


class CallStream:
    """Streams an answer that may hold calls: text goes out as it comes; a call's head
    (`{"name": "<declared>", "arguments": `, the order the prompt asks for) opens it, and its
    arguments go out in pieces as the model writes them. Text that might still become a head is
    held back until it does or cannot. `calls` lists the calls completed so far.

    A required call written in another key order is held whole and parsed at the end."""

    def __init__(self, use: ToolUse) -> None:
        self.use = use
        self.calls: list[ToolCall] = []
        self._heads = {f"{CALL_TRIGGER}{json.dumps(t.name)}, \"arguments\": ": t.name for t in use.callable_tools}
        self._buf = ""  # held text, or the open call's arguments so far
        self._open: CallDelta | None = None  # the call whose arguments are streaming
        self._num_sent = 0  # characters of the open call's arguments already sent
        self._closing = False  # a call's arguments ended: its closing brace comes next

    @property
    def has_calls(self) -> bool:
        return bool(self.calls) or self._open is not None

    def feed(self, text: str) -> list[str | CallDelta]:
        """What can be sent now: text pieces and call deltas, in order."""
        self._buf += text
        events: list[str | CallDelta] = []
        while self._step(events):
            pass
        return events

    def _step(self, events: list[str | CallDelta]) -> bool:
        """One move on the held text; False when it must wait for more."""
        if self._closing:
            if not self._buf:
                return False
            self._closing = False
            if self._buf[0] == "}":
                self._buf = self._buf[1:]
            return True
        if self._open is not None:
            return self._advance_arguments(events)
        brace = self._buf.find("{")
        if brace == -1:
            if self._buf and not self.use.is_whole_answer_a_call:
                events.append(self._buf)
                self._buf = ""
            return False
        if brace > 0:
            events.append(self._buf[:brace])
            self._buf = self._buf[brace:]
        heads = self._heads if self.use.parallel or not self.calls else {}
        for head, name in heads.items():
            if self._buf.startswith(head):
                self._open = CallDelta(len(self.calls), f"call_{uuid.uuid4().hex[:24]}", name)
                events.append(self._open)
                self._buf, self._num_sent = self._buf[len(head) :], 0
                return True
        if any(head.startswith(self._buf) for head in heads) or self.use.is_whole_answer_a_call:
            return False  # may still become a head (or, for a required call, is parsed at the end)
        events.append("{")  # a brace that opens no call
        self._buf = self._buf[1:]
        return True

    def _advance_arguments(self, events: list[str | CallDelta]) -> bool:
        assert self._open is not None
        try:
            arguments, end = json.JSONDecoder().raw_decode(self._buf)
        except ValueError:  # not complete yet: everything so far belongs to the arguments
            if len(self._buf) > self._num_sent:
                events.append(CallDelta(self._open.index, arguments=self._buf[self._num_sent :]))
                self._num_sent = len(self._buf)
            return False
        if end > self._num_sent:
            events.append(CallDelta(self._open.index, arguments=self._buf[self._num_sent : end]))
        assert self._open.id is not None and self._open.name is not None
        if isinstance(arguments, dict):
            self.calls.append(ToolCall(self._open.name, arguments, self._open.id))
        self._buf, self._open, self._closing = self._buf[end:], None, True
        return True

    def finish(self) -> list[str | CallDelta]:
        """What is left once the answer ended: held text, or a required call written out of order."""
        held, self._buf = self._buf, ""
        if self._open is not None or not held:  # an open call was cut by max_tokens: it stays partial
            return []
        rest, calls = self.use.split_calls(held)
        first = len(self.calls)
        self.calls += calls
        events: list[str | CallDelta] = [rest] if rest else []
        for i, call in enumerate(calls):
            events.append(CallDelta(first + i, call.id, call.name, json.dumps(call.arguments, ensure_ascii=False)))
        return events
