"""Request bodies parsed into plain data, with a message naming the field when one is wrong.

Workers AI text generation (the documented input schema):

    field               type        default   range
    prompt | messages   str | list            prompt 1..131072 characters; exactly one of the two
    max_tokens          integer     256       >= 1 (and prompt + max_tokens <= the model's context)
    temperature         number      0.6       0..5
    top_p               number      1.0       0.001..1   (Workers AI documents no default; 1.0 = off)
    top_k               integer     none      1..50      (none = off)
    seed                integer     none      1..9999999999
    repetition_penalty  number      1.0       (0, 2]     (0 itself is meaningless: it divides)
    frequency_penalty   number      0         -2..2
    presence_penalty    number      0         -2..2
    stream, raw         boolean     false
    stop                str | list  none      up to 16 non-empty strings: the answer ends before the first
    response_format     object    none      JSON mode (gateway/pipeline/structured.py); guided_json too
    tools, tool_choice  array, str|object   function calling (gateway/pipeline/tools.py)
    options             object      {}        {rejectIfBusy: bool}: 429 / 3040 at once rather than wait

The OpenAI Responses route (`parse_responses`) takes `input` (a string, or message items whose
content is a string or `input_text` / `output_text` parts), `instructions` (a system message put
first), `max_output_tokens`, `temperature`, `top_p`, `text.format` (JSON mode) and function
`tools` (with `tool_choice`; earlier calls and their results come back as `function_call` and
`function_call_output` items).

OpenAI routes take OpenAI's names and ranges (temperature 0..2, `max_completion_tokens` as an
alias of `max_tokens`, up to 4 `stop` strings, `n` = 1 only, `stream_options.include_usage`) and
Workers AI's `options`; fields left out get the Workers AI defaults above, so one model behaves the
same through both APIs. Before anything else is read, the body goes through the field rule of
gateway/pipeline/request_fields.py (its table says what happens to every field): nulls are absent,
a field that would change the answer and is not honoured (legacy `functions`, `logit_bias`, a
misspelt `max_token`) is refused by name, and other unknown fields are left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.errors import InvalidInput
from gateway.pipeline.request_fields import (
    GENERATION_REFUSED,
    OPENAI_CHAT,
    OPENAI_COMPLETIONS,
    OPENAI_RESPONSES,
    OPTIONS,
    OPTIONS_FIELD,
    WORKERS_AI,
    accepted_fields,
)
from gateway.pipeline.structured import parse_guided_json, parse_response_format, parse_text_format
from gateway.pipeline.tools import ToolUse, assistant_calls_text, call_text, parse_tool_use

MAX_PROMPT_CHARS = 131072
MAX_STOPS = 16  # stop strings per request on /ai/run (the backend's limit; Workers AI documents none)
MAX_OPENAI_STOPS = 4  # OpenAI's limit
ROLES = ("system", "user", "assistant", "tool", "developer")


@dataclass(frozen=True, slots=True)
class Sampling:
    max_tokens: int = 256
    temperature: float = 0.6
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop: tuple[str, ...] = ()

    def backend_fields(self) -> dict[str, Any]:
        """The sampling part of a backend /v1/completions body (vLLM/TensorRT-LLM field names)."""
        body: dict[str, Any] = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "repetition_penalty": self.repetition_penalty,
            "frequency_penalty": self.frequency_penalty,
            "presence_penalty": self.presence_penalty,
        }
        if self.top_k is not None:
            body["top_k"] = self.top_k
        if self.seed is not None:
            body["seed"] = self.seed
        if self.stop:
            body["stop"] = list(self.stop)
        return body


@dataclass(frozen=True, slots=True)
class Prompt:
    """What to tokenize: chat messages (the model's template is applied) or raw text."""

    messages: tuple[dict[str, str], ...] | None = None
    text: str | None = None
    tools: ToolUse | None = None  # described by the chat template, or in the system prompt (tools.py)

    def __post_init__(self) -> None:
        assert (self.messages is None) != (self.text is None), "exactly one of messages / text"


@dataclass(frozen=True, slots=True)
class GenerationInput:
    prompt: Prompt
    sampling: Sampling = field(default_factory=Sampling)
    stream: bool = False
    include_usage: bool = False  # OpenAI streams only; Workers AI streams always end with usage
    # JSON mode: the backend `response_format` (gateway/pipeline/structured.py); None for free text
    response_format: dict[str, Any] | None = None
    tools: ToolUse | None = None  # function calling (gateway/pipeline/tools.py)
    reject_if_busy: bool = False  # options.rejectIfBusy: 429 / 3040 at once rather than wait for capacity
    lora: str | None = None  # a LoRA finetune of the caller's account, by name or id (gateway/pipeline/finetunes.py)

    @property
    def backend_response_format(self) -> dict[str, Any] | None:
        return self.tools.response_format() if self.tools is not None else self.response_format


# ---- field readers ----------------------------------------------------------------------------


def _number(body: dict[str, Any], name: str, default: float, lo: float, hi: float, *, lo_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(f"{name} must be a number, got {type(value).__name__}", param=name)
    if value < lo or (lo_open and value == lo) or value > hi:
        low = f"greater than {lo:g}" if lo_open else f"at least {lo:g}"
        raise InvalidInput(f"{name}={value!r} is out of range: it must be {low} and at most {hi:g}", param=name)
    return float(value)


def _integer(body: dict[str, Any], name: str, default: int | None, lo: int, hi: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{name} must be an integer, got {type(value).__name__}", param=name)
    if value < lo or (hi is not None and value > hi):
        rule = f"at least {lo}" if hi is None else f"between {lo} and {hi}"
        raise InvalidInput(f"{name}={value} is out of range: it must be {rule}", param=name)
    return value


def _boolean(body: dict[str, Any], name: str, default: bool = False) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidInput(f"{name} must be true or false, got {type(value).__name__}", param=name)
    return value


def _content(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # OpenAI content parts: only text parts are supported
        parts = []
        for i, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise InvalidInput(f"{where}[{i}] must be a text part {{type: 'text', text: str}}", param="messages")
            parts.append(part["text"])
        return "".join(parts)
    raise InvalidInput(f"{where} must be a string, got {type(value).__name__}", param="messages")


def _messages(value: Any) -> tuple[dict[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise InvalidInput("messages must be a non-empty array of {role, content} objects", param="messages")
    messages = []
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise InvalidInput(f"messages[{i}] must be an object with role and content", param="messages")
        role = message.get("role")
        if role not in ROLES:
            raise InvalidInput(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}", param="messages")
        if role == "assistant" and message.get("tool_calls"):  # an earlier turn's calls, as the model wrote them
            text = message.get("content")
            calls = assistant_calls_text(message["tool_calls"], f"messages[{i}]")
            content = f"{_content(text, f'messages[{i}].content')}\n{calls}" if text else calls
        else:
            content = _content(message.get("content"), f"messages[{i}].content")
        messages.append({"role": role, "content": content})
    return tuple(messages)


def _prompt_text(value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"prompt must be a string, got {type(value).__name__}", param="prompt")
    if not 1 <= len(value) <= MAX_PROMPT_CHARS:
        raise InvalidInput(f"prompt must be 1 to {MAX_PROMPT_CHARS} characters long, got {len(value)}", param="prompt")
    return value


def _stop(body: dict[str, Any], most: int) -> tuple[str, ...]:
    """Stop strings: the answer ends before the first one the model writes (which is not sent)."""
    value = body.get("stop")
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or len(stops) > most or not all(isinstance(s, str) and s for s in stops):
        raise InvalidInput(f"stop must be a non-empty string or an array of up to {most} non-empty strings",
                           param="stop")
    return tuple(stops)


def _reject_if_busy(body: dict[str, Any]) -> bool:
    """Workers AI's `options.rejectIfBusy`; the other keys of `options` follow the field rule."""
    options = body.get(OPTIONS_FIELD)
    if options is None:
        return False
    if not isinstance(options, dict):
        raise InvalidInput('options must be an object, e.g. {"rejectIfBusy": true}', param=OPTIONS_FIELD)
    value = accepted_fields(options, OPTIONS, "options", {}, param_prefix="options.").get("rejectIfBusy", False)
    if not isinstance(value, bool):
        raise InvalidInput("options.rejectIfBusy must be true or false", param="options.rejectIfBusy")
    return value


def _sampling(
    body: dict[str, Any], *, max_temperature: float, max_tokens_names: tuple[str, ...], max_stops: int
) -> Sampling:
    max_tokens = 256
    for name in max_tokens_names:
        value = _integer(body, name, None, 1, None)
        if value is not None:
            max_tokens = value
            break
    return Sampling(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 0.6, 0.0, max_temperature),
        top_p=_number(body, "top_p", 1.0, 0.001, 1.0),
        top_k=_integer(body, "top_k", None, 1, 50),
        seed=_integer(body, "seed", None, 1, 9_999_999_999),
        repetition_penalty=_number(body, "repetition_penalty", 1.0, 0.0, 2.0, lo_open=True),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        stop=_stop(body, max_stops),
    )


# ---- the three inputs -------------------------------------------------------------------------


def parse_workers_ai(body: dict[str, Any]) -> GenerationInput:
    """`POST /ai/run/{model}` for a text-generation model."""
    body = accepted_fields(body, WORKERS_AI, "a Workers AI text-generation request", GENERATION_REFUSED)
    has_prompt, has_messages = body.get("prompt") is not None, body.get("messages") is not None
    if has_prompt == has_messages:
        raise InvalidInput("send exactly one of prompt (a string) or messages (an array)", param="prompt")
    raw = _boolean(body, "raw")
    if has_prompt:
        text = _prompt_text(body["prompt"])
        prompt = Prompt(text=text) if raw else Prompt(messages=({"role": "user", "content": text},))
    else:
        if raw:
            raise InvalidInput(
                "raw applies to prompt only; send prompt with raw: true, or messages without it", param="raw"
            )
        prompt = Prompt(messages=_messages(body["messages"]))
    sampling = _sampling(body, max_temperature=5.0, max_tokens_names=("max_tokens",), max_stops=MAX_STOPS)
    response_format = parse_response_format(body.get("response_format"), openai=False) or parse_guided_json(
        body.get("guided_json")
    )
    tools = _tool_use(body, prompt, response_format)
    if tools is not None:
        prompt = Prompt(messages=prompt.messages, tools=tools)
    lora = body.get("lora")
    if lora is not None and (not isinstance(lora, str) or not lora):
        raise InvalidInput("lora must name a finetune of this account (its name or id)", param="lora")
    return GenerationInput(prompt, sampling, _boolean(body, "stream"), False, response_format, tools,
                           _reject_if_busy(body), lora)


def _tool_use(body: dict[str, Any], prompt: Prompt, response_format: dict[str, Any] | None) -> ToolUse | None:
    tools = parse_tool_use(body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls"))
    if tools is None:
        return None
    if prompt.messages is None:
        raise InvalidInput("tools need a chat prompt: send messages (or prompt without raw)", param="tools")
    if response_format is not None:
        raise InvalidInput(
            "send either tools or response_format: a constrained answer cannot also be a tool call", param="tools"
        )
    return tools


def _openai_common(body: dict[str, Any]) -> tuple[Sampling, bool, bool]:
    """Sampling, stream and include_usage (`options` is read by the caller)."""
    n = _integer(body, "n", 1, 1, 1)
    assert n == 1
    if body.get("logprobs") not in (None, False, 0):
        raise InvalidInput("logprobs are not supported", param="logprobs")
    stream = _boolean(body, "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise InvalidInput("stream_options must be an object", param="stream_options")
        include_usage = _boolean(options, "include_usage")
    sampling = _sampling(
        body, max_temperature=2.0, max_tokens_names=("max_completion_tokens", "max_tokens"), max_stops=MAX_OPENAI_STOPS
    )
    return sampling, stream, include_usage


def openai_model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidInput("model must be a model id string, e.g. @cf/huggingface/smollm2-135m-instruct", param="model")
    return model


def split_finetune(model: str) -> tuple[str, str | None]:
    """OpenAI routes name a LoRA finetune in `model` as "<base model>:<finetune name or id>" (model ids hold
    no ':'): -> (base model, finetune), or (model, None)."""
    base, sep, finetune = model.rpartition(":")
    return (base, finetune) if sep and base and finetune else (model, None)


def parse_chat_completions(body: dict[str, Any]) -> GenerationInput:
    """`POST /ai/v1/chat/completions`."""
    body = accepted_fields(body, OPENAI_CHAT, "a chat completion request", GENERATION_REFUSED)
    sampling, stream, include_usage = _openai_common(body)
    prompt = Prompt(messages=_messages(body.get("messages")))
    response_format = parse_response_format(body.get("response_format"), openai=True)
    tools = _tool_use(body, prompt, response_format)
    if tools is not None:
        prompt = Prompt(messages=prompt.messages, tools=tools)
    return GenerationInput(prompt, sampling, stream, include_usage, response_format, tools, _reject_if_busy(body))


def parse_completions(body: dict[str, Any]) -> GenerationInput:
    """`POST /ai/v1/completions`: the prompt is raw text (no chat template), or a list of one string."""
    body = accepted_fields(body, OPENAI_COMPLETIONS, "a completion request", GENERATION_REFUSED)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    sampling, stream, include_usage = _openai_common(body)
    response_format = parse_response_format(body.get("response_format"), openai=True)
    return GenerationInput(Prompt(text=_prompt_text(prompt)), sampling, stream, include_usage, response_format,
                           reject_if_busy=_reject_if_busy(body))


@dataclass(frozen=True, slots=True)
class ResponsesInput:
    """`POST /ai/v1/responses`: the generation, plus what the response object echoes back."""

    generation: GenerationInput
    instructions: str | None
    max_output_tokens: int | None
    obfuscate: bool  # stream_options.include_obfuscation (OpenAI's default: on)
    text_format: dict[str, Any]  # `text.format` as the client sent it, echoed in the response


_ITEM_PARTS = ("input_text", "output_text")  # an earlier answer may come back as output_text


def _item_content(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise InvalidInput(f"{where} must be a string or an array of input_text parts", param="input")
    texts = []
    for i, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _ITEM_PARTS or not isinstance(part.get("text"), str):
            raise InvalidInput(f"{where}[{i}] must be a text part {{type: 'input_text', text: str}}; got type "
                               f"{kind!r} (the served models read text only)", param="input")
        texts.append(part["text"])
    return "".join(texts)


def _input_items(value: Any) -> list[dict[str, str]]:
    """Message items, and an earlier turn's `function_call` / `function_call_output` items rendered
    as chat messages do (an assistant message holding the calls, then `tool` messages)."""
    if isinstance(value, str):
        return [{"role": "user", "content": _prompt_text(value)}]
    if not isinstance(value, list) or not value:
        raise InvalidInput("input must be a string or a non-empty array of message items", param="input")
    messages: list[dict[str, str]] = []
    follows_call = False
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise InvalidInput(f"input[{i}] must be a message item {{role, content}}", param="input")
        kind = item.get("type", "message")
        if kind == "function_call":
            if not isinstance(item.get("name"), str):
                raise InvalidInput(f"input[{i}] (a function_call) must name its function", param="input")
            text = call_text(item["name"], item.get("arguments", "{}"))
            if follows_call:  # calls of one turn make one assistant message, as in chat completions
                messages[-1] = {"role": "assistant", "content": f"{messages[-1]['content']}\n{text}"}
            else:
                messages.append({"role": "assistant", "content": text})
            follows_call = True
            continue
        follows_call = False
        if kind == "function_call_output":
            output = item.get("output")
            if not isinstance(output, str):
                raise InvalidInput(f"input[{i}].output must be a string", param="input")
            messages.append({"role": "tool", "content": output})
            continue
        if kind != "message":
            raise InvalidInput(f"input[{i}] is a {kind!r} item; /responses takes message, function_call and "
                               "function_call_output items", param="input")
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise InvalidInput(f"input[{i}].role must be user, assistant, system or developer, got {role!r}",
                               param="input")
        messages.append({"role": role, "content": _item_content(item.get("content"), f"input[{i}].content")})
    return messages


def _responses_tools(body: dict[str, Any]) -> ToolUse | None:
    """Responses declares functions flat (`{type: "function", name, description, parameters}`)."""
    tools = body.get("tools")
    if isinstance(tools, list):
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict) or tool.get("type") != "function":
                kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
                raise InvalidInput(f"tools[{i}] is a {kind!r} tool; edgerun runs function tools only (no hosted "
                                   "tools such as web or file search)", param="tools")
    return parse_tool_use(tools, body.get("tool_choice"), body.get("parallel_tool_calls"))


def parse_responses(body: dict[str, Any]) -> ResponsesInput:
    """`POST /ai/v1/responses`: text in, text out."""
    body = accepted_fields(body, OPENAI_RESPONSES, "a Responses API request", GENERATION_REFUSED)
    messages = _input_items(body.get("input"))
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise InvalidInput("instructions must be a string", param="instructions")
        messages.insert(0, {"role": "system", "content": instructions})
    obfuscate = True
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict) or set(options) - {"include_obfuscation"}:
            raise InvalidInput("stream_options takes include_obfuscation only", param="stream_options")
        obfuscate = _boolean(options, "include_obfuscation", True)
    sampling = _sampling(body, max_temperature=2.0, max_tokens_names=("max_output_tokens",), max_stops=MAX_OPENAI_STOPS)
    text = body.get("text")
    response_format = parse_text_format(text)
    tools = _responses_tools(body)
    if tools is not None and response_format is not None:
        raise InvalidInput("send either tools or text.format: a constrained answer cannot also be a tool call",
                           param="tools")
    generation = GenerationInput(Prompt(messages=tuple(messages), tools=tools), sampling, _boolean(body, "stream"),
                                 response_format=response_format, tools=tools, reject_if_busy=_reject_if_busy(body))
    text_format: dict[str, Any] = {"type": "text"}
    if isinstance(text, dict) and isinstance(text.get("format"), dict):
        text_format = text["format"]
    return ResponsesInput(generation, instructions, _integer(body, "max_output_tokens", None, 1, None), obfuscate,
                          text_format)
