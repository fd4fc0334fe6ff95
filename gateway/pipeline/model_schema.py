"""The JSON Schemas `GET .../ai/models/schema?model=` answers: what a model takes and returns.

Workers AI answers `{"result": {"input": {...}, "output": {...}}}`, both JSON Schemas: for text
generation the input is one of a prompt body and a messages body (with the sampling fields each
takes), the output one of a JSON object (`response`, `usage`) and an event stream. Ours describe
what gateway/pipeline/schemas.py really accepts (the same fields, defaults and ranges; tests hold the two
together), so a client generated from the schema sends nothing the gateway refuses. Other properties
are not forbidden: as the field rule says (gateway/pipeline/request_fields.py), a field that cannot
change the answer is ignored, and one that could is refused by name.
"""

from __future__ import annotations

from typing import Any

from gateway.pipeline.schemas import MAX_PROMPT_CHARS, MAX_STOPS, ROLES


def _number(
    description: str, default: float | None, lo: float, hi: float, *, integer: bool = False, lo_open: bool = False
) -> dict[str, Any]:
    field: dict[str, Any] = {"type": "integer" if integer else "number", "description": description}
    if default is not None:
        field["default"] = default
    field["exclusiveMinimum" if lo_open else "minimum"], field["maximum"] = lo, hi
    return field


SAMPLING: dict[str, dict[str, Any]] = {
    "stream": {"type": "boolean", "default": False, "description": "Stream the answer as server-sent events."},
    "max_tokens": {"type": "integer", "default": 256, "minimum": 1, "description": "The most tokens to generate."},
    "temperature": _number("Randomness of sampling; 0 is greedy.", 0.6, 0, 5),
    "top_p": _number("Nucleus sampling: the smallest set of tokens whose probability sums to top_p.", 1.0, 0.001, 1),
    "top_k": _number("Sample among the top_k most likely tokens.", None, 1, 50, integer=True),
    "seed": _number("Random seed, for reproducible sampling.", None, 1, 9_999_999_999, integer=True),
    # exclusive: a penalty of 0 would divide by zero
    "repetition_penalty": _number("Penalty on tokens already seen (1: none).", 1.0, 0, 2, lo_open=True),
    "frequency_penalty": _number("Penalty growing with how often a token has appeared.", 0, -2, 2),
    "presence_penalty": _number("Penalty on any token that has appeared.", 0, -2, 2),
}

JSON_MODE: dict[str, dict[str, Any]] = {
    "response_format": {
        "type": "object",
        "description": "JSON mode: the answer is JSON (json_object) or valid against json_schema, then returned parsed.",
        "properties": {
            "type": {"type": "string", "enum": ["text", "json_object", "json_schema"]},
            "json_schema": {"type": "object", "description": "A JSON Schema the answer must match."},
        },
        "required": ["type"],
    },
    "guided_json": {"type": "object", "description": "A JSON Schema the answer must match (as response_format)."},
    "lora": {"type": "string", "minLength": 1,
             "description": "A LoRA finetune of this account, by name or id (POST .../ai/finetunes)."},
}

_STOP_TEXT = {"type": "string", "minLength": 1}
STOP_AND_OPTIONS: dict[str, dict[str, Any]] = {
    "stop": {
        "description": "Stop strings: the answer ends before the first one the model writes.",
        "oneOf": [_STOP_TEXT, {"type": "array", "items": _STOP_TEXT, "minItems": 1, "maxItems": MAX_STOPS}],
    },
    "options": {
        "type": "object",
        "description": "Request options.",
        "properties": {
            "rejectIfBusy": {
                "type": "boolean",
                "default": False,
                "description": "Answer 429 (3040) at once when the request cannot start now, instead of waiting.",
            }
        },
    },
}

TOOL: dict[str, Any] = {
    "type": "object",
    "description": "A function the model may call: {name, description, parameters}, or OpenAI's {type, function}.",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 64},
        "description": {"type": "string"},
        "parameters": {"type": "object", "description": "A JSON Schema of the arguments."},
        "type": {"type": "string", "enum": ["function"]},
        "function": {"type": "object"},
    },
}

TOOLS: dict[str, dict[str, Any]] = {
    "tools": {"type": "array", "items": TOOL, "description": "Functions the model may call (result.tool_calls)."},
    "tool_choice": {
        "description": 'auto (default), none, required, or {"type": "function", "function": {"name": ...}}.',
        "oneOf": [{"type": "string", "enum": ["auto", "none", "required"]}, {"type": "object"}],
    },
}

PROMPT_INPUT: dict[str, Any] = {
    "title": "Prompt",
    "type": "object",
    "properties": {
        "prompt": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_PROMPT_CHARS,
            "description": "The text to answer (as one user message, unless raw).",
        },
        "raw": {"type": "boolean", "default": False, "description": "Send the prompt without the chat template."},
        **SAMPLING,
        **STOP_AND_OPTIONS,
        **JSON_MODE,
        **TOOLS,
    },
    "required": ["prompt"],
}

MESSAGES_INPUT: dict[str, Any] = {
    "title": "Messages",
    "type": "object",
    "properties": {
        "messages": {
            "type": "array",
            "minItems": 1,
            "description": "The conversation so far, oldest first.",
            "items": {
                "type": "object",
                "properties": {
                    "role": {"type": "string", "enum": list(ROLES)},
                    "content": {"type": ["string", "null"], "description": "The message's text."},
                    "tool_calls": {"type": "array", "description": "An assistant's earlier calls."},
                    "tool_call_id": {"type": "string", "description": "The call a tool message answers."},
                },
                "required": ["role"],
            },
        },
        **SAMPLING,
        **STOP_AND_OPTIONS,
        **JSON_MODE,
        **TOOLS,
    },
    "required": ["messages"],
}

USAGE: dict[str, Any] = {
    "type": "object",
    "description": "Tokens this request used.",
    "properties": {
        "prompt_tokens": {"type": "integer", "minimum": 0},
        "completion_tokens": {"type": "integer", "minimum": 0},
        "total_tokens": {"type": "integer", "minimum": 0},
        "prompt_tokens_details": {
            "type": "object",
            "properties": {"cached_tokens": {"type": "integer", "minimum": 0}},
        },
    },
}

OUTPUT: dict[str, Any] = {
    "oneOf": [
        {
            "type": "object",
            "contentType": "application/json",
            "properties": {
                "response": {
                    "type": ["string", "object", "array", "number", "boolean", "null"],
                    "description": "The generated text; in JSON mode the parsed JSON value.",
                },
                "tool_calls": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"name": {"type": "string"}, "arguments": {"type": "object"}},
                        "required": ["name", "arguments"],
                    },
                },
                "usage": USAGE,
            },
            "required": ["response"],
        },
        {"type": "string", "contentType": "text/event-stream", "format": "binary"},
    ]
}


def text_generation_schema() -> dict[str, Any]:
    """Workers AI's `{input, output}` for a text-generation model served here."""
    described = {"description": "A prompt or a conversation, with how to sample the answer.",
                 "additionalProperties": True}  # other fields: ignored or refused by name, never forbidden
    return {"input": {"type": "object", **described, "oneOf": [PROMPT_INPUT, MESSAGES_INPUT]}, "output": OUTPUT}


def text_embeddings_schema(max_texts: int) -> dict[str, Any]:
    """Workers AI's `{input, output}` for a text-embeddings model served here."""
    text = {"type": "string", "minLength": 1, "maxLength": MAX_PROMPT_CHARS}
    return {
        "input": {
            "type": "object",
            "description": "The text or texts to embed.",
            "additionalProperties": True,
            "properties": {
                "text": {
                    "oneOf": [text, {"type": "array", "items": text, "minItems": 1, "maxItems": max_texts}],
                    "description": "The text to embed, or several (one vector each, in order).",
                }
            },
            "required": ["text"],
        },
        "output": {
            "type": "object",
            "contentType": "application/json",
            "properties": {
                "shape": {"type": "array", "items": {"type": "number"}, "description": "[texts, dimensions]"},
                "data": {
                    "type": "array",
                    "items": {"type": "array", "items": {"type": "number"}},
                    "description": "One unit-length vector per input text.",
                },
            },
        },
    }
