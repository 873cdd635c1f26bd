"""Find the real data that Debian packages ship, or fetch those packages without root.

Lookup order for a file of a package: the ``root=`` argument when given (and only it); otherwise
``$ZOO_DEBIAN_ROOT``, the system itself (``/``, where ``apt-get install`` puts the files) and the user cache
``$ZOO_CACHE/debian`` (default ``~/.cache/zoo/debian``), where ``make data-deps`` extracts the packages with
``apt-get download`` + ``dpkg -x`` (no root needed). A root is a folder laid out like ``/``: the file
``usr/share/doc/ragout/examples`` of a package is looked for at ``ROOT/usr/share/doc/ragout/examples``.

This file uses the standard library only, so the Makefile runs it as a script without importing zoo::

    python zoo/data/_debian.py ragout-examples gbrowse-data r-cran-mlbench   # fetch what is missing
    python zoo/data/_debian.py --check ragout-examples                         # exit 1 when missing
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

try:
    from ._cache import cache_dir
except ImportError:  # run as a script (the Makefile's data-deps): its own folder is on sys.path
    from _cache import cache_dir  # type: ignore[no-redef]

__all__ = [
    "DEBIAN_PACKAGES",
    "DEBIAN_ROOT_ENV",
    "MissingDebianData",
    "cache_dir",
    "debian_cache_root",
    "fetch_debian_package",
    "find_debian_file",
    "install_hint",
    "is_available",
    "package_root",
]

DEBIAN_ROOT_ENV = "ZOO_DEBIAN_ROOT"
# package -> a file that the package ships and this project reads (paths relative to the root, as in the .deb)
DEBIAN_PACKAGES = {
    "ragout-examples": "usr/share/doc/ragout/examples/V.Cholerae/references/O395.fasta.gz",
    "gbrowse-data": "var/lib/gbrowse/databases/yeast_chr1+2/yeast_chr1+2.gff3",
    "r-cran-mlbench": "usr/lib/R/site-library/mlbench/data/DNA.rda",
}


class MissingDebianData(FileNotFoundError):
    """A file of a Debian data package is in none of the searched roots; the message says how to get it."""


def debian_cache_root() -> Path:
    """The user root where ``make data-deps`` extracts Debian packages: ``cache_dir() / "debian"``."""
    return cache_dir() / "debian"


def _search_roots(root: str | os.PathLike | None) -> list[Path]:
    """Roots to search, in order; an explicit ``root`` is the only one searched."""
    if root is not None:
        return [Path(root)]
    roots = [Path(os.environ[DEBIAN_ROOT_ENV])] if os.environ.get(DEBIAN_ROOT_ENV) else []
    return roots + [Path("/"), debian_cache_root()]


def install_hint(package: str) -> str:
    """How to install ``package``, with root or without, and how to point zoo at the files."""
    cache = debian_cache_root()
    return (
        f"install the Debian package {package!r}: `apt-get install -y {package}` (as root), or without root "
        f"`apt-get download {package} && dpkg -x {package}_*.deb {cache}` (what `make data-deps` does); "
        f"a package extracted elsewhere is found with root=DIR or {DEBIAN_ROOT_ENV}=DIR. Images whose dpkg "
        "configuration excludes /usr/share/doc drop some of these files on install: use the dpkg -x route there"
    )


def find_debian_file(package: str, relpath: str, *, root: str | os.PathLike | None = None) -> Path:
    """The path of ``relpath`` (a file or folder of ``package``) under the first root that holds it.

    Args:
        package: the Debian package that ships the file, named in the error.
        relpath: path inside the package, relative to ``/``, e.g. ``usr/lib/R/site-library/mlbench/data/DNA.rda``.
        root: search only this root (a folder laid out like ``/``).

    Raises:
        MissingDebianData: naming every path tried and how to install the package.
    """
    relpath = relpath.lstrip("/")
    tried = [root_dir / relpath for root_dir in _search_roots(root)]
    for path in tried:
        if path.exists():
            return path
    looked = ", ".join(str(path) for path in tried)
    raise MissingDebianData(
        f"{relpath!r} of the Debian package {package!r} not found (looked at {looked}); {install_hint(package)}"
    )


def package_root(package: str, *, root: str | os.PathLike | None = None) -> Path:
    """The searched root that holds ``package`` (by its marker file in ``DEBIAN_PACKAGES``)."""
    marker = DEBIAN_PACKAGES[package]
    path = find_debian_file(package, marker, root=root)
    return Path(str(path)[: -len(marker)])


def is_available(package: str, *, root: str | os.PathLike | None = None) -> bool:
    """Whether the marker file of ``package`` (see ``DEBIAN_PACKAGES``) is in a searched root."""
    try:
        find_debian_file(package, DEBIAN_PACKAGES[package], root=root)
    except MissingDebianData:
        return False
    return True


def _run(command: list[str], cwd: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600, check=False)


def _download(package: str, folder: str) -> Path:
    """``apt-get download package`` into ``folder``; as root, one ``apt-get update`` and a retry on failure."""
    if shutil.which("apt-get") is None:
        raise RuntimeError("apt-get is not available on this machine")
    # apt drops privileges to _apt for downloads; a folder it may write to avoids its sandbox warning
    os.chmod(folder, 0o777)
    result = _run(["apt-get", "download", package], folder)
    if result.returncode != 0 and hasattr(os, "geteuid") and os.geteuid() == 0:
        # a fresh machine has no package lists yet
        _run(["apt-get", "update", "-qq"], folder)
        result = _run(["apt-get", "download", package], folder)
    debs = sorted(Path(folder).glob(f"{package}_*.deb"))
    if result.returncode != 0 or not debs:
        raise RuntimeError(f"`apt-get download {package}` failed: {(result.stderr or result.stdout).strip()}")
    return debs[0]


def _merge_tree(source: Path, dest: Path) -> None:
    """Move every file of ``source`` to the same place under ``dest``, each with an atomic rename."""
    for folder, _, files in os.walk(source):
        target_dir = dest / Path(folder).relative_to(source)
        target_dir.mkdir(parents=True, exist_ok=True)
        for name in files:
            os.replace(Path(folder) / name, target_dir / name)


def fetch_debian_package(package: str, dest: str | os.PathLike | None = None) -> Path:
    """Download ``package`` with ``apt-get download`` and extract it with ``dpkg -x`` into ``dest``.

    Needs no root. Files are extracted into a temporary folder first and then renamed into place, so a
    reader never sees a half-written file.

    Args:
        package: Debian package name.
        dest: root to extract into; default ``debian_cache_root()``.

    Returns:
        the root the package was extracted into.

    Raises:
        RuntimeError: apt-get or dpkg missing or failing; the message carries their output.
    """
    dest = Path(dest) if dest is not None else debian_cache_root()
    dest.mkdir(parents=True, exist_ok=True)
    if shutil.which("dpkg") is None:
        raise RuntimeError("dpkg is not available on this machine")
    with tempfile.TemporaryDirectory(dir=dest, prefix=".fetch-") as work:
        deb = _download(package, work)
        extracted = Path(work) / "root"
        result = _run(["dpkg", "-x", str(deb), str(extracted)], work)
        if result.returncode != 0:
            raise RuntimeError(f"`dpkg -x {deb.name}` failed: {result.stderr.strip()}")
        _merge_tree(extracted, dest)
    return dest


def main(argv: Sequence[str] | None = None) -> int:
    """Fetch the named packages that are not found yet; never fails unless ``--strict`` (see the module doc)."""
    parser = argparse.ArgumentParser(description="Locate or fetch the Debian packages that ship zoo's data.")
    parser.add_argument("packages", nargs="+", help="Debian package names")
    parser.add_argument("--dest", default=None, help=f"root to extract into (default {debian_cache_root()})")
    parser.add_argument("--check", action="store_true", help="only report; exit 1 when a package is missing")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a package cannot be fetched")
    args = parser.parse_args(argv)
    missing = []
    for package in args.packages:
        marker = DEBIAN_PACKAGES.get(package)
        if marker is not None and (is_available(package) or (args.dest and is_available(package, root=args.dest))):
            print(f"{package}: found")
            continue
        if args.check:
            missing.append(package)
            print(f"{package}: missing; {install_hint(package)}", file=sys.stderr)
            continue
        try:
            root = fetch_debian_package(package, args.dest)
        except (RuntimeError, OSError, subprocess.SubprocessError) as err:
            missing.append(package)
            # datasets that need this package are skipped by the tests, with this reason
            print(f"{package}: could not fetch ({err}); {install_hint(package)}", file=sys.stderr)
            continue
        print(f"{package}: extracted into {root}")
    return 1 if missing and (args.check or args.strict) else 0


if __name__ == "__main__":
    sys.exit(main())
