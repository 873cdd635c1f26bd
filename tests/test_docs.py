"""Every Python and shell block of README.md and docs/*.md runs as written, each in a fresh temporary folder that
holds links to `.venv`, `tools` and `recipes` (so `.venv/bin/python tools/train.py recipes/...` works there).

A block runs as it stands unless HTML comments right above its fence say otherwise:

    <!-- docs-test: skip (REASON) -->             not run; the reason is the skip message
    <!-- docs-test: needs runs/quickstart -->     the folder gets what an earlier step of the README made (NEEDS)
    <!-- docs-test: needs debian:PACKAGE -->      skipped when `make data-deps` could not install that data
    <!-- docs-test: after the block above -->    the previous runnable block of the file runs first, in the folder
    <!-- docs-test: tools/train.py ARGS -->       ARGS are added to each command of that tool in the block, e.g.
                                                  `--set train.max_steps=1 ...` to run a GPU-sized recipe at CPU size;
    <!-- docs-test: tools/train.py recipes/x.yaml ARGS -->   only to the commands that start with those words

A block with no marker runs, so a new block is tested as soon as it is written. Shell blocks are read command by
command (a trailing `\\` continues a line, `#` starts a comment; a `cd` does not carry over to the next line):
`.venv/bin/python tools/X.py ...` runs in a child of tests/docs_runner.py (zoo imported once for all of them),
anything else through bash. Python blocks run as a script in a child of the same runner. Network access is refused.
A block may take BLOCK_CPU seconds of CPU, so that the whole file stays cheap enough to run with the suite.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import zoo
from zoo.data import _debian as debian

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGUAGES = {"python": "python", "py": "python", "bash": "shell", "sh": "shell", "shell": "shell"}
MARKER = re.compile(r"<!--\s*docs-test:\s*(.*?)\s*-->")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
TIMEOUT = 300
# CPU seconds a block may take (its commands' processes, one thread each): a new block that trains at full size
# fails here with the way to shrink it rather than slow the suite
BLOCK_CPU = 30.0
# the quickstart recipe at test size: its run stands in for `make quickstart`
QUICKSTART = (
    "data.train_samples=64 data.val_samples=32 data.test_samples=32 data.batch_size=16 data.eval_batch_size=32 "
    "data.num_workers=0 train.max_steps=2 schedule.warmup_steps=1"
)


@dataclass
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    skip: str | None = None
    needs: list[str] = field(default_factory=list)
    after: Block | None = None
    # (the command's first words, e.g. ["tools/train.py"] or ["tools/train.py", "recipes/x.yaml"], the arguments
    # added to each command of the block that starts with them)
    tool_args: list[tuple[list[str], list[str]]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def read_blocks(path: Path) -> list[Block]:
    """The Python and shell blocks of the Markdown file `path`, with their markers."""
    lines, blocks, previous = path.read_text().splitlines(), [], None
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        indent, closing = opening.group(1), opening.group(1) + "```"
        end = next((i for i in range(index + 1, len(lines)) if lines[i].rstrip() == closing), len(lines))
        language = LANGUAGES.get(opening.group(2).lower())
        if language:
            # a block inside a list item is indented as its fence is
            code = "\n".join(line.removeprefix(indent) for line in lines[index + 1 : end]) + "\n"
            block = Block(path, index + 1, language, code)
            for marker in markers_above(lines, index):
                apply_marker(block, marker, previous)
            blocks.append(block)
            previous = block
        index = end + 1
    return blocks


def markers_above(lines: list[str], fence: int) -> list[str]:
    """The docs-test markers on the lines right above line `fence` (blank lines allowed between them)."""
    found, index = [], fence - 1
    while index >= 0 and (not lines[index].strip() or MARKER.fullmatch(lines[index].strip())):
        if lines[index].strip():
            found.append(MARKER.fullmatch(lines[index].strip()).group(1))
        index -= 1
    return found[::-1]


def apply_marker(block: Block, marker: str, previous: Block | None) -> None:
    where = f"{block.path.name}, block at line {block.line}"
    if marker.startswith("skip"):
        block.skip = marker.removeprefix("skip").strip().strip("()") or "marked skip"
    elif marker.startswith("needs "):
        block.needs.append(marker.removeprefix("needs ").strip())
    elif marker == "after the block above":
        if previous is None:
            raise ValueError(f"{where}: 'after the block above' on the first block")
        block.after = previous
    elif marker.startswith("tools/"):
        words = shlex.split(marker)
        start = next((i for i, word in enumerate(words) if word.startswith("-")), len(words))
        block.tool_args.append((words[:start], words[start:]))
    else:
        raise ValueError(f"{where}: unknown docs-test marker {marker!r}")


BLOCKS = [block for path in DOCUMENTS for block in read_blocks(path)]


class Runner:
    """tests/docs_runner.py: one request at a time, each in a forked child."""

    def __init__(self, log: Path):
        self.cpu = 0.0  # CPU seconds of every child so far
        # one thread: the documented commands are tiny here, and OpenMP threads that spin while the machine is busy
        # with the rest of the suite cost many times the CPU
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}
        self.errors = log.open("w")
        self.process = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "docs_runner.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.errors,
            text=True,
            env=env,
        )

    def run(self, cwd: Path, log: Path, **request) -> int:
        request.update(cwd=str(cwd), log=str(log), timeout=TIMEOUT)
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        if not answer:
            raise RuntimeError(f"tests/docs_runner.py stopped: see {log.parent}")
        answer = json.loads(answer)
        with log.open("a") as handle:
            handle.write(f"docs-test: {answer['cpu']} s CPU\n")
        self.cpu += answer["cpu"]
        return answer["rc"]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=600)
        self.errors.close()


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    runner = Runner(tmp_path_factory.mktemp("runner") / "runner.log")
    yield runner
    runner.close()


def workspace(folder: Path) -> Path:
    """`folder` as a user's checkout: .venv, tools and recipes linked in."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in (".venv", "tools", "recipes"):
        if not (folder / name).exists():
            (folder / name).symlink_to(ROOT / name)
    return folder


@pytest.fixture(scope="module")
def made(runner, tmp_path_factory):
    """What the README's earlier steps make, by the name a `needs` marker uses, each made once when first asked
    for: a function that puts it into a block's folder."""
    cache: dict[str, Path] = {}
    home = workspace(tmp_path_factory.mktemp("made"))

    def make(name: str) -> Path:
        if name not in cache:
            if name not in NEEDS:
                raise ValueError(f"unknown docs-test need {name!r}; known: {', '.join(NEEDS)}")
            log = home / f"{name.replace('/', '_')}.log"
            rc = NEEDS[name](runner, home, log)
            assert rc == 0 and (home / name).exists(), f"making {name} failed:\n{log.read_text()[-3000:]}"
            cache[name] = home / name
        return cache[name]

    return make


def _quickstart(runner: Runner, home: Path, log: Path) -> int:
    argv = ["tools/train.py", "recipes/quickstart.yaml", "--output", "runs/quickstart", "--set", *QUICKSTART.split()]
    return runner.run(home, log, argv=argv)


def _timm_weights(runner: Runner, home: Path, log: Path) -> int:
    # timm's own layout; weights as initialised (the test has no network to fetch ImageNet's)
    code = (
        "import timm\nfrom safetensors.torch import save_file\n"
        "save_file(timm.create_model('vit_small_patch16_224').state_dict(), 'vit_small_patch16_224.safetensors')\n"
    )
    return runner.run(home, log, python=code, name="timm weights")


NEEDS = {"runs/quickstart": _quickstart, "vit_small_patch16_224.safetensors": _timm_weights}


def run_block(block: Block, folder: Path, runner: Runner, made) -> None:
    """Run `block` (and the blocks it comes after) in `folder`; a failure names the command and shows its log."""
    if block.after is not None:
        run_block(block.after, folder, runner, made)
    for name in block.needs:
        if name.startswith("debian:"):
            package = name.removeprefix("debian:")
            if not debian.is_available(package):
                pytest.skip(f"Debian data package missing: {debian.install_hint(package)}")
            continue
        source, target = made(name), folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if source.is_dir() else shutil.copy)(source, target)
    log = folder / f"line{block.line}.log"
    if block.language == "python":
        rc = runner.run(folder, log, python=block.code, name=block.name)
        assert rc == 0, f"{block.name} failed (rc {rc}):\n{log.read_text()[-4000:]}"
        return
    for command in shell_commands(block.code):
        argv = shlex.split(command, comments=True)
        if argv[:1] == [".venv/bin/python"] and argv[1].startswith("tools/"):
            argv = argv[1:]
            argv += [arg for start, args in block.tool_args if argv[: len(start)] == start for arg in args]
            rc = runner.run(folder, log, argv=argv)
        else:
            with log.open("a") as output:
                rc = subprocess.run(
                    command, shell=True, cwd=folder, stdout=output, stderr=output, check=False
                ).returncode
        assert rc == 0, f"{block.name}: `{shlex.join(argv)}` failed (rc {rc}):\n{log.read_text()[-4000:]}"


def shell_commands(code: str) -> list[str]:
    """The commands of a shell block: continued lines joined, blank and comment-only lines left out."""
    commands, current = [], ""
    for line in code.splitlines():
        current += line[:-1] + " " if line.rstrip().endswith("\\") else line
        if line.rstrip().endswith("\\"):
            continue
        if shlex.split(current, comments=True):
            commands.append(current)
        current = ""
    return commands


@pytest.mark.parametrize("block", BLOCKS, ids=[block.name for block in BLOCKS])
def test_block_runs(block, runner, made, tmp_path):
    if block.skip:
        pytest.skip(block.skip)
    start = runner.cpu
    run_block(block, workspace(tmp_path), runner, made)
    cpu = runner.cpu - start
    assert cpu <= BLOCK_CPU, (
        f"{block.name} took {cpu:.1f} s of CPU (at most {BLOCK_CPU:.0f}): run it at CPU size with a marker above "
        "it, e.g. <!-- docs-test: tools/train.py --set train.max_steps=1 data.train_samples=16 ... -->"
    )


def test_blocks_are_found():
    """The parser sees the README's blocks (a broken fence pattern would make every test above vacuous)."""
    readme = [block for block in BLOCKS if block.path.name == "README.md"]
    assert {"python", "shell"} <= {block.language for block in readme} and len(readme) >= 10
    # skips stay few: the quickstart itself, several GPUs, 8 GPUs, the hub, a GPU check
    assert sum(block.skip is not None for block in BLOCKS) <= 6


def table_names(section: str, column: int) -> list[str]:
    """The backticked names in `column` of the first Markdown table of `section`, outside parentheses."""
    lines = section.split("\n|", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    names = []
    for line in lines:
        cell = line.split("|")[column]
        # `sparse` (Sparse Transformer), `longformer`: what is in parentheses describes the name before it
        while re.search(r"\([^()]*\)", cell):
            cell = re.sub(r"\([^()]*\)", "", cell)
        names += re.findall(r"`([^`]+)`", cell)
    return names


# A measured figure: a number with a unit of time, memory or throughput, a percentage, a speed-up or slow-down
# written onto its number ("1.8x"), or a printed metric ("top1=0.80"). Settings do not match: "1024 px", "4,096
# tokens", "8 x 8 patches", "ViT-S/16". Measured numbers live in the pages tools/pages.py generates, not in prose.
MEASURED = re.compile(
    r"\d(?:[\d,]*\d)?(?:\.\d+)?(?:x\b|\s*(?:%|ms\b|s\b|seconds?\b|minutes?\b|hours?\b|[KMGT]i?B\b"
    r"|(?:samples|tokens|tok|steps|images)/s\b|[GT]FLOP/s))"
    r"|\btop-?[15]\s*=\s*\d"
)
# the pages tools/pages.py writes (docs/results/ is a folder of its own, outside DOCUMENTS), and README's block
GENERATED_PAGES = {"cards.md", "choose.md"}
CHOOSE_BLOCK = re.compile(r"<!-- pages:choose start -->.*?<!-- pages:choose end -->", re.DOTALL)
HAND_WRITTEN = [path for path in DOCUMENTS if path.name not in GENERATED_PAGES]


def measured_figures(text: str) -> list[str]:
    """The measured figures in `text` outside README's generated block, each as `line N: ...figure...`."""
    text = CHOOSE_BLOCK.sub(lambda block: "\n" * block.group().count("\n"), text)
    found = []
    for match in MEASURED.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        found.append(f"line {line}: ...{text[max(match.start() - 30, 0) : match.end() + 10]!r}...")
    return found


def test_measured_figures_are_recognised():
    """The check below fails on the figures the README used to carry, and passes settings."""
    for figure in ("310.6 samples/s", "(1.80x)", "22,149 MiB", "2.3 ms", "-18 %", "about 2 minutes", "top1=0.80"):
        assert measured_figures(f"trains {figure} on a GPU"), figure
    for setting in ("1024 px", "4,096 tokens", "8 x 8 patches", "ViT-S/16", "a 64 kb window", "2 x [B, 64]"):
        assert not measured_figures(f"at {setting} on a GPU"), setting
    generated = "<!-- pages:choose start -->\n| `linear` | 1.80x |\n<!-- pages:choose end -->\n"
    assert not measured_figures(generated) and measured_figures(generated.replace("end -->", "end -->\n2.1x"))


@pytest.mark.parametrize("path", HAND_WRITTEN, ids=[str(path.relative_to(ROOT)) for path in HAND_WRITTEN])
def test_no_measured_figures_in_hand_written_pages(path):
    """README.md (outside its generated block) and the hand-written docs carry no measured number: they link the
    generated pages, which tools/pages.py rewrites from the committed results."""
    figures = measured_figures(path.read_text())
    assert not figures, (
        f"{path.name} carries measured figures; link docs/results/, docs/cards.md or docs/choose.md:\n"
        + ("\n".join(figures[:20]))
    )


def test_readme_holds_the_generated_block():
    """tools/pages.py rewrites README's table between these two lines: both there, once each, in order."""
    readme = (ROOT / "README.md").read_text()
    start, end = "<!-- pages:choose start -->", "<!-- pages:choose end -->"
    assert readme.count(start) == readme.count(end) == 1 and readme.index(start) < readme.index(end)


def test_attention_tables_list_every_registered_variant():
    """The README's table of attention variants and docs/attention.md's name each registered one once, and
    nothing else."""
    readme = (ROOT / "README.md").read_text().split("## Attention variants", 1)[1]
    assert sorted(table_names(readme, 2)) == sorted(zoo.list_attentions())
    docs = (ROOT / "docs" / "attention.md").read_text()
    assert sorted(table_names(docs, 1)) == sorted(zoo.list_attentions())


def test_quick_recipes_say_measured_or_smoke_as_the_training_page_does():
    """Every CPU-sized recipe opens with `# Measured:` or `# Smoke test`, and docs/training.md's table lists each
    once with the same word: a reader of either never takes a smoke run for a result."""
    recipes = sorted([*(ROOT / "recipes").glob("*_quick.yaml"), ROOT / "recipes" / "quickstart.yaml"])
    opening = {path.stem: path.read_text().splitlines()[0] for path in recipes}
    unlabelled = [name for name, line in opening.items() if not line.startswith(("# Measured:", "# Smoke test"))]
    assert not unlabelled, f"open these recipes with `# Measured: ...` or `# Smoke test: ...`: {unlabelled}"
    section = (ROOT / "docs" / "training.md").read_text().split("## CPU-sized recipes", 1)[1]
    rows = section.split("\n|", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    listed = {name: row.split("|")[2].strip() for row in rows for name in re.findall(r"`([^`]+)`", row.split("|")[1])}
    assert sorted(listed) == sorted(opening)
    for name, line in opening.items():
        assert listed[name].startswith("measured") == line.startswith("# Measured:"), (name, line, listed[name])
