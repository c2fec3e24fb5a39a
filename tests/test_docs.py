"""The README and docs/ against the code: the snippets run, the commands exist, the links resolve.

- ```python blocks run (each in its own interpreter, from a scratch folder that sees the
  repository's configs), except blocks with a title="FILE" (files a page asks you to write).
- Every `hetsim ...` line in a code block names a verb and options the parser has; a line
  without placeholders parses in full, and the files it reads exist (in the repository, as a
  titled block of the same page, or written by an earlier command of that page).
- The commands of README.md and docs/getting-started.md that are cheap run as written, and
  where the page shows their table, print it.
- Relative links resolve, YAML and JSON blocks parse, and the generated reference is current.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from bench import gen_reference
from experiments import cli

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# Guides that other pieces of work add; a link to one is checked once the page exists.
PENDING_PAGES = {"docs/guides/rl.md"}
# Commands run as written (cheap: no torch model extraction, no real runs, no MILP).
RUN_VERBS = {"demo", "simulate", "plan", "compare", "sweep", "plot", "dag"}
RUN_PAGES = {"README.md", "docs/getting-started.md"}
# What a scratch folder needs to run the pages' commands from "the repository root".
LINKED = ("experiments", "runtime", "hardware_profiles")
# Options whose value is a file or folder written, not read.
OUTPUT_OPTIONS = {"--out", "--log-dir", "--fresh-profile"}  # --fresh-profile writes FILE when missing
PLACEHOLDER = re.compile(r"[\[\]|]|\.\.\.|\b[A-Z][A-Z_]{2,}\b")


@dataclass
class Block:
    page: Path
    line: int
    info: str
    body: str

    @property
    def lang(self) -> str:
        return self.info.split()[0] if self.info else ""

    @property
    def title(self) -> str | None:
        m = re.search(r'title="([^"]+)"', self.info)
        return m.group(1) if m else None

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def rel(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def fenced(page: Path) -> list[Block]:
    out, cur = [], None
    for i, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("```"):
            if cur is None:
                cur = Block(page, i, line[3:].strip(), "")
            else:
                out.append(cur)
                cur = None
        elif cur is not None:
            cur.body += line + "\n"
    assert cur is None, f"{rel(page)}: unclosed code block"
    return out


def indented(page: Path) -> Iterator[str]:
    """Lines of indented (4-space) code blocks outside fences, after a blank line."""
    fence, prev_blank, in_block = False, True, False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        if fence:
            continue
        in_block = line.startswith("    ") and (in_block or prev_blank)
        if in_block:
            yield line[4:]
        prev_blank = not line.strip()


def hetsim_lines(page: Path) -> Iterator[str]:
    """Every `hetsim ...` command line of a page's code, with its prompt and env assignments off."""
    code = [b.body for b in fenced(page) if b.lang in ("", "console", "bash", "sh")]
    lines = [ln for body in code for ln in body.splitlines()] + list(indented(page))
    joined: list[str] = []
    for ln in lines:  # a line ending in a backslash continues on the next one, as in a shell
        if joined and joined[-1].endswith("\\"):
            joined[-1] = joined[-1][:-1] + " " + ln.strip()
        else:
            joined.append(ln.rstrip())
    for line in joined:
        line = line.rstrip().removeprefix("$ ")  # an indented line continues a block: not a command
        line = re.sub(r"^(\w+=\S*\s+)+", "", line)
        if line.startswith("hetsim ") or line == "hetsim":
            yield line.split("  #")[0].split(" # ")[0].strip()


def all_blocks() -> list[Block]:
    return [b for p in PAGES for b in fenced(p)]


def subparsers() -> dict[str, object]:
    import argparse

    parser = cli.build_parser()
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    raise AssertionError("hetsim has no verbs")


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in LINKED:
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write_titled(page: Path, where: Path) -> set[str]:
    """The page's titled blocks written under `where` (those of a shipped file are not); their names."""
    names = set()
    for b in fenced(page):
        if b.title and not (ROOT / b.title).exists():
            (where / b.title).parent.mkdir(parents=True, exist_ok=True)
            (where / b.title).write_text(b.body)
            names.add(b.title)
    return names


# ------------------------------------------------------------------ the generated reference
def test_generated_reference_is_current() -> None:
    stale = [p.relative_to(ROOT).as_posix() for p in gen_reference.stale()]
    assert not stale, f"{stale} stale: run `{gen_reference.REGENERATE}` and commit the result"


# ------------------------------------------------------------------ links and data blocks
@pytest.mark.parametrize("block", [b for b in all_blocks() if b.title and (ROOT / b.title).exists()], ids=str)
def test_shown_shipped_files_match(block: Block) -> None:
    """A block titled with a file of the repository shows that file exactly."""
    assert block.body == (ROOT / block.title).read_text(), f"{block}: differs from {block.title}"  # type: ignore[operator]



def test_relative_links_resolve() -> None:
    broken = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://", "mailto:", "#")):
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            if path.exists():
                continue
            if path.is_relative_to(ROOT) and path.relative_to(ROOT).as_posix() in PENDING_PAGES:
                continue
            broken.append(f"{rel(page)}: {target}")
    assert not broken, broken


def test_readme_has_no_links_outside_the_repository_but_citations() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text) <= 15_000
    assert not re.findall(r"\]\((https?://[^)]+)\)", text)


@pytest.mark.parametrize("block", [b for b in all_blocks() if b.lang in ("yaml", "json")], ids=str)
def test_data_blocks_parse(block: Block) -> None:
    if block.lang == "yaml":
        yaml.safe_load(block.body)
    elif "..." not in block.body:
        json.loads(block.body)


# ------------------------------------------------------------------ hetsim commands
def _check_command(page: Path, line: str, known: set[str], verbs: dict[str, object]) -> str | None:
    """Why `line` is wrong (None when right); adds the files it writes to `known`."""
    words = shlex.split(line)[1:]
    if not words or words[0].startswith("-"):
        return None if not words or words[0] in ("--help", "-h", "--version") else f"no verb: {line}"
    verb = words[0]
    if verb not in verbs:
        return f"unknown verb {verb!r}: {line}"
    sub = verbs[verb]
    options = {o for a in sub._actions for o in a.option_strings}  # type: ignore[attr-defined]
    unknown = [w.split("=")[0] for w in words if w.startswith("--") and w.split("=")[0] not in options]
    if unknown:
        return f"unknown option {unknown} of hetsim {verb}: {line}"
    for opt, value in zip(words, words[1:]):
        if opt in OUTPUT_OPTIONS:
            known.add(value.rstrip("/"))
    if PLACEHOLDER.search(line):
        return None  # a synopsis: verb and options checked
    try:
        sub.parse_args(words[1:])  # type: ignore[attr-defined]
    except SystemExit:
        return f"does not parse: {line}"
    prev = ""
    for w in words[1:]:
        if prev in OUTPUT_OPTIONS:
            known.add(w.rstrip("/"))
        elif not w.startswith("-") and ("/" in w or w.endswith((".yaml", ".json", ".yml"))):
            path = w.rstrip("/")
            if not ((ROOT / path).exists() or path in known or any(k.startswith(path + "/") for k in known)):
                return f"{path} does not exist: {line}"
        prev = w
    return None


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_hetsim_commands_exist(page: Path) -> None:
    verbs = subparsers()
    known = {b.title for b in fenced(page) if b.title}
    errors = [e for line in hetsim_lines(page) if (e := _check_command(page, line, known, verbs))]
    assert not errors, errors


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_inline_hetsim_mentions_exist(page: Path) -> None:
    """`hetsim VERB --option` in running text names a verb and options the parser has."""
    verbs = subparsers()
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    errors = []
    for span in re.findall(r"`(hetsim [^`]+)`", text):
        words = span.replace("\\|", "|").split()
        verb = words[1]
        if verb.startswith("-"):
            continue
        if verb not in verbs:
            errors.append(f"unknown verb: {span}")
            continue
        options = {o for a in verbs[verb]._actions for o in a.option_strings}  # type: ignore[attr-defined]
        errors += [f"unknown option {w}: {span}" for w in words[2:]
                   if re.fullmatch(r"--[a-z][a-z-]*", w.split("=")[0]) and w.split("=")[0] not in options]
    assert not errors, errors


def _shown_output(page: Path) -> dict[str, list[str]]:
    """For each `$ hetsim ...` line of a console block, the lines shown after it."""
    out: dict[str, list[str]] = {}
    for b in fenced(page):
        if b.lang != "console":
            continue
        cmd = None
        for line in b.body.splitlines():
            if line.startswith("$ "):
                # a command with environment assignments needs that environment: shown, not run
                cmd = None if re.match(r"\w+=", line[2:]) else line[2:].strip()
                if cmd is not None:
                    out[cmd] = []
            elif cmd is not None:
                out[cmd].append(line)
    return out


@pytest.mark.parametrize("name", sorted(RUN_PAGES))
def test_page_commands_run_as_written(name: str, scratch: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = ROOT / name
    write_titled(page, scratch)
    ran = 0
    for cmd, shown in _shown_output(page).items():
        words = shlex.split(cmd)
        if words[0] != "hetsim" or words[1] not in RUN_VERBS:
            continue
        capsys.readouterr()
        rc = cli.main([*words[1:], *(["--quiet"] if words[1] in ("demo", "sweep") and "--quiet" not in words else [])])
        out, err = capsys.readouterr()
        assert rc == 0, f"{name}: `{cmd}` exited {rc}: {err}"
        got = [ln.rstrip() for ln in out.splitlines()]
        if words[1] == "sweep":  # the timing in its summary line varies
            got = [re.sub(r"; [\d.]+ s, [\d.]+ points/s", "", ln) for ln in got]
            shown = [re.sub(r"; [\d.]+ s, [\d.]+ points/s", "", ln) for ln in shown]
        hint = "(after an intended change: python -m bench.refresh_doc_outputs)"
        assert got[:len(shown)] == [ln.rstrip() for ln in shown], f"{name}: `{cmd}` printed\n{out}\n{hint}"
        ran += 1
    assert ran >= (3 if name == "docs/getting-started.md" else 1)


# ------------------------------------------------------------------ python snippets
PY_BLOCKS = [b for b in all_blocks() if b.lang == "python" and not b.title]


def _shown_after(block: Block) -> str | None:
    """What the page says a snippet prints: the plain block right after it, introduced by "prints"."""
    text = block.page.read_text()
    start = text.index(block.body, sum(len(ln) + 1 for ln in text.splitlines()[:block.line - 1]))
    m = re.match(r"```\n\n\s*prints\s*\n\n```\n(.*?)```", text[start + len(block.body):], flags=re.S)
    return m.group(1) if m else None


@pytest.mark.parametrize("block", PY_BLOCKS, ids=str)
def test_python_snippets_run(block: Block, scratch: Path) -> None:
    write_titled(block.page, scratch)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(scratch)])}
    proc = subprocess.run([sys.executable, "-c", block.body], cwd=scratch, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{block}: {proc.stderr[-2000:]}"
    for value in re.findall(r"^print\(.*#\s*(\S+)$", block.body, flags=re.M):
        # `print(x)  # 158.3...`: a printed line starts with the value the comment shows
        assert any(ln.startswith(value.rstrip(".")) for ln in proc.stdout.splitlines()), (str(block), value)
    shown = _shown_after(block)
    if shown is not None:
        assert proc.stdout == shown, f"{block} printed\n{proc.stdout}"
