"""The `edgerun` command: a thin dispatcher.

Each subcommand is one module of this package (the serving benchmark's lives with it in
loadtests/bench/), imported only when that subcommand runs, so `edgerun` never loads torch
unless it must.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from cli.logs import configure_logging

# subcommand -> module exposing `add_arguments(parser)` and `run(args) -> int`
COMMANDS: dict[str, tuple[str, str]] = {
    "chat": ("cli.chat", "talk to the built-in engine in the terminal (or one-shot with --prompt)"),
    "backend": ("cli.backend", "run a regional backend: one engine behind the OpenAI-compatible backend protocol"),
    "simulate": ("cli.simulate", "replay a request trace through the routing policies and compare them"),
    "serve": ("cli.serve", "run the edge gateway (Workers AI + OpenAI-compatible API) in front of backends"),
    "dev": ("cli.dev", "start a backend and a gateway on this machine with a development key"),
    "tenants": ("cli.admin", "create and list tenants"),
    "keys": ("cli.admin", "create, list and revoke API keys"),
    "billing": ("cli.billing", "export the billing ledger (csv, jsonl, parquet), recompute bills, replay the spool"),
    "bench": ("loadtests.bench.cli", "benchmark a gateway: replay workloads at fixed load and compare routing policies"),
    "export-hf": ("cli.export_hf", "write a built-in engine model as a Hugging Face checkpoint (to serve it with vLLM, SGLang, ...)"),
    "draft": ("cli.draft", "train an EAGLE-3 draft head for the built-in engine (train), or measure one (eval)"),
    "lora": ("cli.lora", "train a LoRA adapter for the built-in engine's model, written as PEFT files (train)"),
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
    command = importlib.import_module(COMMANDS[args.command][0])
    # A command may say how it wants logs (`logging_options(args) -> dict`).
    options = command.logging_options(args) if hasattr(command, "logging_options") else {}
    configure_logging(**options)
    return int(command.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
