"""Rerun the commands that README.md and docs/getting-started.md show with their output,
and write what they print now in place of what the page shows.

    python -m bench.refresh_doc_outputs [PAGE ...]

tests/test_docs.py fails when a page's shown output differs from what its command
prints; after a change that moves the numbers on purpose, run this, read the diff, commit.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import sys
import tempfile
from pathlib import Path

from experiments import cli

ROOT = Path(__file__).resolve().parent.parent
PAGES = ("README.md", "docs/getting-started.md")
RUN_VERBS = {"demo", "simulate", "plan", "compare", "sweep", "plot", "dag"}
LINKED = ("experiments", "runtime", "hardware_profiles")


def _titled_blocks(text: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in
            re.finditer(r'```\w*[^\n]*title="([^"]+)"[^\n]*\n(.*?)```', text, flags=re.S)}


def refresh(page: Path) -> int:
    """Rewrite ``page``'s shown outputs in place; how many blocks changed."""
    text = page.read_text()
    changed = 0
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        for name in LINKED:
            (where / name).symlink_to(ROOT / name)
        for title, body in _titled_blocks(text).items():
            if not (ROOT / title).exists():
                (where / title).parent.mkdir(parents=True, exist_ok=True)
                (where / title).write_text(body)
        cwd = os.getcwd()
        os.chdir(where)
        try:
            for block in re.findall(r"```console\n(.*?)```", text, flags=re.S):
                new = _rerun(block)
                if new != block:
                    text = text.replace(block, new, 1)
                    changed += 1
        finally:
            os.chdir(cwd)
    page.write_text(text)
    return changed


def _rerun(block: str) -> str:
    lines = block.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        if not line.startswith("$ hetsim ") or re.match(r"\$ \w+=", line):
            continue
        shown = []
        while i < len(lines) and not lines[i].startswith("$ "):
            shown.append(lines[i])
            i += 1
        words = shlex.split(line[2:])
        if words[1] not in RUN_VERBS or not shown:
            out += shown
            continue
        extra = ["--quiet"] if words[1] in ("demo", "sweep") and "--quiet" not in words else []
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
            rc = cli.main([*words[1:], *extra])
        if rc != 0:
            raise SystemExit(f"{line[2:]}: exit {rc}")
        got = [ln.rstrip() for ln in buf.getvalue().splitlines()]
        out += got
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    pages = (argv if argv is not None else sys.argv[1:]) or list(PAGES)
    for p in pages:
        n = refresh(ROOT / p)
        print(f"{p}: {n} output block(s) rewritten")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
