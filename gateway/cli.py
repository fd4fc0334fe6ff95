"""The `edgerun` command: a thin dispatcher.

Each subcommand's parser and handler live next to the part they drive and are imported only
when that subcommand runs, so `edgerun` never loads torch unless it must (and the gateway never
imports an engine).
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module exposing `add_arguments(parser)` and `run(args) -> int`
COMMANDS: dict[str, tuple[str, str]] = {
    "chat": ("backends.cli_chat", "talk to the built-in engine in the terminal (or one-shot with --prompt)"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="edgerun", description="Self-hostable LLM inference edge platform.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = argv[0] if argv and argv[0] in COMMANDS else None
    for name, (module, help_text) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text)
        if name == chosen:  # only the command that runs pays for its imports
            importlib.import_module(module).add_arguments(command_parser)
    args, rest = parser.parse_known_args(argv)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return int(importlib.import_module(COMMANDS[args.command][0]).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
