"""Every generated page, from the committed results under benchmarks/: docs/cards.md (`cards`), docs/choose.md
(`choose`), one results page per machine and their index under docs/results/ (`results_pages`), and README.md's
"choosing an attention" table between its `pages:choose` markers. `tools/pages.py` writes them; the suite checks that
each committed page is what `generated_pages` gives now.
"""

from __future__ import annotations

import re
from pathlib import Path

from ._results import load
from .cards import cards_markdown
from .choose import choose_markdown, choose_rows, recall_picks
from .machine import REPO_ROOT
from .results_pages import results_pages

__all__ = ["README_END", "README_START", "generated_pages", "readme_block", "stale_pages", "write_pages"]

README_START = "<!-- pages:choose start -->"
README_END = "<!-- pages:choose end -->"
# a file an answer rests on, as docs/choose.md names it: `benchmarks/<machine>/...`
_EVIDENCE = re.compile(r"`(benchmarks/([^/`]+)/[^`]*)`")


def _evidence(why: str) -> str:
    """The results page of the machine an answer was measured on, linked from README.md; docs/choose.md (which
    names the command that would measure it) where nothing was."""
    found = _EVIDENCE.findall(why)
    if not found:
        return "[docs/choose.md](docs/choose.md)"
    machine = found[-1][1]
    return f"[docs/results/{machine}.md](docs/results/{machine}.md)"


def readme_block() -> str:
    """The table between README.md's markers: setting, pick, and a link to the page that shows the evidence."""
    lines = ["| setting | pick | evidence |", "|---|---|---|"]
    lines += [f"| {setting} | {pick} | {_evidence(why)} |" for setting, pick, why in choose_rows()]
    recall = recall_picks()
    if recall:
        lines.append(f"| tasks that recall tokens | {recall[0][0]} | [docs/cards.md](docs/cards.md) |")
    return "\n".join(lines) + "\n"


def _with_readme_block(readme: str) -> str:
    """README.md's text with the block between its markers rewritten; as it is where the markers are missing."""
    start, end = readme.find(README_START), readme.find(README_END)
    if start < 0 or end < start:
        return readme
    return readme[: start + len(README_START)] + "\n" + readme_block() + readme[end:]


def generated_pages(root: Path = REPO_ROOT) -> dict[str, str]:
    """Path under `root` -> the text `write_pages` writes there, from the committed results."""
    load.cache_clear()
    pages = {"docs/cards.md": cards_markdown(), "docs/choose.md": choose_markdown(), **results_pages()}
    readme = root / "README.md"
    if readme.is_file():
        pages["README.md"] = _with_readme_block(readme.read_text())
    return pages


def write_pages(root: Path | str = REPO_ROOT) -> list[Path]:
    """Write every generated page under `root` (the repository by default); returns their paths."""
    root = Path(root)
    written = []
    for relative, text in generated_pages(root).items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


def stale_pages(root: Path | str = REPO_ROOT) -> list[str]:
    """The generated pages under `root` that are missing or not what the results give now."""
    root = Path(root)
    return [
        relative
        for relative, text in generated_pages(root).items()
        if not (root / relative).is_file() or (root / relative).read_text() != text
    ]
