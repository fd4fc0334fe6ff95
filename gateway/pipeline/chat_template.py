"""Chat templates: a model's Jinja template rendered in a sandbox, as Hugging Face renders it.

Templates come from backends (or a local tokenizer directory), so they are untrusted code: they
run in jinja2's immutable sandbox, which refuses attribute tricks and mutation of inputs. The
environment matches Hugging Face's (`trim_blocks`, `lstrip_blocks`, loop controls, a
`raise_exception` helper and a `tojson` that keeps non-ASCII text), so templates written for
`transformers` render the same here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NoReturn

import jinja2
import jinja2.meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from gateway.errors import InternalError, InvalidInput


class TemplateRejected(Exception):
    """The template itself refused the conversation (its raise_exception was called)."""


def _raise_exception(message: str) -> NoReturn:
    raise TemplateRejected(message)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


class ChatTemplate:
    """A compiled chat template; `render` is safe to call concurrently."""

    def __init__(self, source: str, *, bos_token: str | None = None, eos_token: str | None = None) -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.globals["raise_exception"] = _raise_exception
        env.filters["tojson"] = _tojson
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(f"the chat template does not compile: {exc}") from exc
        self._specials = {"bos_token": bos_token or "", "eos_token": eos_token or ""}
        # `Template.render` merges the globals into each render's context; merged once here, a render
        # only adds its own variables (`_render`)
        self._globals = dict(self._template.globals)
        # a template that reads `tools` has its own tool format (transformers passes them so)
        self.renders_tools = "tools" in jinja2.meta.find_undeclared_variables(env.parse(source))

    def render(
        self,
        messages: Sequence[dict[str, str]],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The prompt text for `messages`, ending with the assistant's turn header by default;
        `tools` (OpenAI's function shape) for a template that `renders_tools`."""
        variables = {**self._globals, **self._specials, "messages": list(messages)}
        variables["add_generation_prompt"] = add_generation_prompt
        if tools is not None:
            variables["tools"] = tools
        try:
            return self._render(variables)
        except TemplateRejected as exc:
            raise InvalidInput(f"messages rejected by the model's chat template: {exc}", param="messages") from exc
        except jinja2.TemplateError as exc:
            raise InternalError(f"the model's chat template failed to render: {exc}") from exc

    def _render(self, variables: dict[str, Any]) -> str:
        """What `Template.render(**variables)` does, with `variables` (globals included) as the context
        itself instead of a merged copy (less than half the time for a short conversation); errors are
        raised as they are, without jinja2's traceback rewriting."""
        template = self._template
        context = template.new_context(variables, shared=True)
        return template.environment.concat(template.root_render_func(context))
