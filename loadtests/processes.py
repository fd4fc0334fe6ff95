"""Moved to cli/processes.py (issue 17): this name forwards while work begun on other branches
lands. New code imports `cli.processes`; delete this file once nothing names it."""

from cli.processes import ROOT, ChildProcess, ProcessError, child_env, free_port, threads_per_backend

__all__ = ["ROOT", "ChildProcess", "ProcessError", "child_env", "free_port", "threads_per_backend"]
