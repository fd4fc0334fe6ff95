"""`edgerun chat` as a user runs it: a real process with the real model."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from cli.processes import ROOT

pytestmark = pytest.mark.slow
CHAT = [sys.executable, "-m", "cli", "chat", "--temperature", "0", "--max-tokens", "12"]
# a question whose greedy answer does not hang on a near tie (test_server.py's test_chat_completion says why)
QUESTION = "What is the capital city of France? Answer in one word."


def test_one_shot_prompt_streams_the_answer() -> None:
    result = subprocess.run([*CHAT, "--prompt", QUESTION], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout


def test_conversation_ends_cleanly_on_eof() -> None:
    result = subprocess.run(CHAT, cwd=ROOT, input=f"{QUESTION}\n", capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout
    assert "Traceback" not in result.stderr


def test_ctrl_c_at_the_prompt_quits_cleanly() -> None:
    process = subprocess.Popen(CHAT, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        banner = ""
        while "Ctrl-D" not in banner:  # the model is loaded once the help line is printed
            assert time.monotonic() < deadline and process.poll() is None
            banner += process.stderr.readline()
        time.sleep(0.3)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0
    assert "Traceback" not in stderr
