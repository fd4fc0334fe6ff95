"""BENCHMARKS.md and RELIABILITY.md stay pages of current results a reader can rerun.

BENCHMARKS.md stays short (under 600 lines), each of its sections says when and on what machine
its figures were measured and gives a command, every `python -m <module>` command in either page
names a module of this repository and flags that its command line defines, and a section that code
or docs cite by name (BENCHMARKS.md, "Fast mode") exists.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "BENCHMARKS.md"
DOCS = [BENCHMARKS, ROOT / "RELIABILITY.md"]
MAX_LINES = 600
MEASURED = re.compile(r"^Measured: \d{4}-\d{2}-\d{2}\b.* on \S", re.MULTILINE)
COMMAND_LINE = re.compile(r"^ {4,}(\S+=\S+ )*(python -m |edgerun |bash )", re.MULTILINE)
INLINE_CODE = re.compile(r"`([^`]+)`")
CITATION = re.compile(r'(BENCHMARKS|RELIABILITY)\.md,? "([^"]{3,80})"')
IMPORTS = re.compile(r"^\s*(?:from|import) ((?:benchmarks|loadtests)(?:\.\w+)*)", re.MULTILINE)


def sections(text: str) -> dict[str, str]:
    """Each `## ` heading with the text under it, up to the next one."""
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def commands(text: str) -> list[str]:
    """Every `python -m ...` command: one per line of a code block, or an inline code span of prose."""
    found = []
    prose: list[str] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("    "):
            if "python -m " in line:
                found.append(line[line.index("python -m ") :].strip())
        elif line.strip():
            prose.append(line.strip())
            continue
        # a paragraph (or table row) ends: its code spans may have been wrapped over several lines
        for span in INLINE_CODE.findall(" ".join(prose)):
            if "python -m " in span:
                found.append(span[span.index("python -m ") :])
        prose.clear()
    return found


def module_files(module: str) -> list[Path]:
    """The files of a module of this repository (a package: all of its files); [] if there is none."""
    path = ROOT.joinpath(*module.split("."))
    if path.is_dir() and (path / "__main__.py").exists():
        return sorted(path.rglob("*.py"))
    return [path.with_suffix(".py")] if path.with_suffix(".py").is_file() else []


def command_line_source(module: str) -> str:
    """The module's source and that of the repository modules it imports, where its flags are defined."""
    files = module_files(module)
    text = "".join(f.read_text() for f in files)
    for imported in set(IMPORTS.findall(text)):
        text += "".join(f.read_text() for f in module_files(imported) if f not in files)
    return text


def test_benchmarks_md_stays_short() -> None:
    lines = BENCHMARKS.read_text().count("\n")
    assert lines < MAX_LINES, f"BENCHMARKS.md has {lines} lines: keep the latest figures, history is in git"


def test_every_benchmarks_section_says_when_where_and_how() -> None:
    found = sections(BENCHMARKS.read_text())
    assert len(found) >= 10
    for heading, body in found.items():
        assert MEASURED.search(body), f"{heading!r}: no 'Measured: YYYY-MM-DD ... on <machine>' line"
        assert COMMAND_LINE.search(body), f"{heading!r}: no command (an indented `python -m`, `edgerun` or `bash` line)"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_command_names_a_module_and_flags_that_exist(doc: Path) -> None:
    found = commands(doc.read_text())
    assert found
    problems = []
    for command in found:
        module, *args = command.split()[2:]
        if module == "pytest":
            continue
        source = command_line_source(module)
        if not source:
            problems.append(f"{command}: no module {module} in the repository")
            continue
        for flag in (arg.split("=", 1)[0].strip("[]") for arg in args if arg.lstrip("[").startswith("--")):
            if f'"{flag}"' not in source:
                problems.append(f"{command}: {module} defines no {flag}")
    assert not problems, "\n".join(problems)


def test_the_command_finder_reads_code_blocks_and_wrapped_spans() -> None:
    text = "Run\n\n    EDGERUN_X=1 python -m benchmarks.a --b 1\n\nand (`python -m\nbenchmarks.c --d`) `edgerun x`\n"
    assert commands(text) == ["python -m benchmarks.a --b 1", "python -m benchmarks.c --d"]
    assert sections("# T\n## A\nx\n## B\ny\n") == {"A": "\nx\n", "B": "\ny\n"}


@pytest.mark.process
def test_every_section_cited_by_name_exists() -> None:
    headings = {
        name: re.findall(r"^#{2,3} (.+)$", (ROOT / f"{name}.md").read_text(), re.MULTILINE)
        for name in ("BENCHMARKS", "RELIABILITY")
    }
    listing = subprocess.run(["git", "ls-files", "*.py", "*.md", "*.yaml"], cwd=ROOT, capture_output=True, text=True)
    missing = []
    for name in listing.stdout.split():
        if not (ROOT / name).is_file():
            continue
        # a citation may be wrapped over comment lines (a "#" continuing the quoted section name)
        text = re.sub(r"\s*\n\s*(?:#\s*)?", " ", (ROOT / name).read_text())
        for doc, section in CITATION.findall(text):
            if not any(heading.startswith(section) for heading in headings[doc]):
                missing.append(f'{name}: {doc}.md "{section}"')
    assert not missing, "citations of sections that do not exist:\n" + "\n".join(missing)
