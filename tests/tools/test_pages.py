"""The generated pages (tools/pages.py): each committed page is what the committed results give now, one results page
per machine with an index, README.md's "choosing an attention" table, and a number two pages show reads the same on
both."""

import re
from pathlib import Path

import pytest

from zoo_bench import _results, pages, results_pages

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def generated():
    _results.load.cache_clear()
    return pages.generated_pages()


def test_every_machine_has_a_results_page_and_the_index_links_it(generated):
    expected = {f"docs/results/{machine}.md" for machine in ("cpu", "cpu-xeon", "nvidia-h200", "nvidia-h100-80gb-hbm3")}
    assert expected | {"docs/results/README.md", "docs/cards.md", "docs/choose.md"} <= set(generated)
    index = generated["docs/results/README.md"]
    assert all(f"]({Path(page).name})" in index for page in expected)


@pytest.mark.parametrize(
    "page",
    [
        "docs/cards.md",
        "docs/choose.md",
        "docs/results/README.md",
        "docs/results/cpu.md",
        "docs/results/cpu-xeon.md",
        "docs/results/nvidia-h200.md",
        "docs/results/nvidia-h100-80gb-hbm3.md",
    ],
)
def test_the_committed_page_is_what_the_generator_writes_now(generated, page):
    assert (REPO / page).read_text() == generated[page], f"{page} is out of date: run tools/pages.py and commit"


def test_the_readme_table_is_current(generated):
    readme = (REPO / "README.md").read_text()
    assert pages.README_START in readme and pages.README_END in readme, "README.md lost its pages:choose markers"
    assert readme == generated["README.md"], "README.md's choosing table is out of date: run tools/pages.py"
    block = readme.split(pages.README_START)[1].split(pages.README_END)[0]
    assert "| setting | pick | evidence |" in block
    # every row links the page its number is on
    rows = [line for line in block.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert rows and all("](docs/" in row for row in rows)


def test_the_readme_block_is_rewritten_between_the_markers_only():
    text = f"before\n{pages.README_START}\nold table\n{pages.README_END}\nafter\n"
    rewritten = pages._with_readme_block(text)
    assert rewritten.startswith(f"before\n{pages.README_START}\n| setting | pick | evidence |")
    assert rewritten.endswith(f"{pages.README_END}\nafter\n") and "old table" not in rewritten
    assert pages._with_readme_block("no markers\n") == "no markers\n"


def test_a_number_two_pages_show_reads_the_same_on_both(generated):
    """The 256-px CPU softmax top-1 (mean ± sample std over its seeds) and the length from which `local` is faster than
    softmax on the CPU, as the cards, the decision page and the CPU results page show them."""
    scores = [r["test"]["top1"] for r in _results.load(_results.HIGHRES)["runs"] if r["layout"] == "softmax"]
    softmax = _results.percent_mean_std(scores)
    assert f"| softmax | {softmax} |" in generated["docs/results/cpu.md"]
    assert f"top-1 {softmax} %" in generated["docs/choose.md"]
    assert "| `softmax` |" in generated["docs/cards.md"] and f"{softmax}, " in generated["docs/cards.md"]
    cpu = generated["docs/results/cpu.md"].split("## results.json")[1]
    local = next(line for line in cpu.splitlines() if line.startswith("| `local` |"))
    assert "| 4,096 tokens |" in local
    assert "faster than softmax (by > 5%) from 4,096 tokens" in generated["docs/cards.md"].split("| `local` |")[1]


def test_results_pages_read_each_file_by_what_it_holds():
    sweep = {"metadata": {"settings": {}}, "records": [{"variant": "softmax", "length": 1024, "fwd_bwd_s": 1.0}]}
    assert results_pages._reader(sweep, "x/results.json") is results_pages._layer_sweep
    assert results_pages._reader({"parts": {}}, "x/device_check.json") is results_pages._device_check
    assert results_pages._reader({"metadata": {}, "records": []}, "x/recall_speed.json") is results_pages._recall_speed
    assert results_pages._reader({"device": "cuda", "cases": []}, "x/kernel_profile.json") is None


def test_written_pages_are_current_and_a_changed_one_is_named(tmp_path):
    (tmp_path / "README.md").write_text(f"# x\n{pages.README_START}\n{pages.README_END}\n")
    assert "README.md" in pages.stale_pages(tmp_path)
    pages.write_pages(tmp_path)
    assert pages.stale_pages(tmp_path) == []
    (tmp_path / "docs" / "results" / "cpu.md").write_text("edited by hand\n")
    assert pages.stale_pages(tmp_path) == ["docs/results/cpu.md"]


def test_every_relative_link_of_the_markdown_pages_reaches_a_file():
    """A link on README.md or a docs/ page (generated or written by hand) to a file of the repository that does not
    exist is a dead end for the reader: every relative target must be there."""
    link = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
    pages_read = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    missing = [
        f"{page.relative_to(REPO)} -> {target}"
        for page in pages_read
        for target in link.findall(page.read_text())
        if "://" not in target and not target.startswith("mailto:") and not (page.parent / target).exists()
    ]
    assert not missing, "links to missing files:\n" + "\n".join(missing)


def test_a_score_over_seeds_shows_its_sample_spread_and_one_seed_says_so():
    """Two seeds 25 and 30 %: mean 27.5, sample std 5 / sqrt(2); one seed has no spread to show, not a spread of 0."""
    assert _results.percent_mean_std([0.25, 0.30]) == "27.5 ± 3.5"
    assert _results.percent_mean_std([0.176]) == "17.6 (one seed)"
