"""Real structures for the protein tests: the NMR ensemble 1ADZ (30 models of a Kunitz domain)
from Debian theseus-examples, fetched once into the data cache."""

import gzip
import subprocess
from pathlib import Path

import pytest

from zoo.downloads import data_dir, debian_package, write_atomically


def theseus_example(name: str) -> Path:
    """Decompressed path of theseus-examples' usr/share/doc/theseus/examples/NAME (a .pdb.gz)."""
    root = data_dir() / "theseus"
    target = root / name.removesuffix(".gz")
    if not target.exists():
        package = debian_package("theseus-examples", data_dir())
        member = f"./usr/share/doc/theseus/examples/{name}"
        packed = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(package)], check=True, capture_output=True).stdout
        data = subprocess.run(["tar", "-xO", member], input=packed, check=True, capture_output=True).stdout
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(target, gzip.decompress(data))
    return target


@pytest.fixture(scope="session")
def nmr_ensemble() -> Path:
    return theseus_example("1adz.pdb.gz")
