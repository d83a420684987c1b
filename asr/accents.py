"""Synthetic espeak-ng accents: training accents with random phoneme replacements.

An espeak-ng accent is a voice file: a phoneme table, spelling-rule options, and `replace` rules
that swap one phoneme for another wherever it occurs. `draw_accents` makes new accents: each copies
the voice file of one training accent and adds random replacements, drawn uniformly over
espeak-ng's English phonemes (a vowel by another vowel, a consonant by another consonant or by
nothing). `espeak_data` builds an espeak-ng data folder that holds their voice files beside the
system's data (linked, not copied), for `espeak-ng --path`.
"""

from __future__ import annotations

import random
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

VOWELS = ("a", "a#", "A:", "A@", "aI", "aI@", "aU", "@", "@L", "3", "3:", "e", "e@", "eI", "E", "i", "i:", "i@",
          "I", "I2", "0", "O:", "O@", "o@", "OI", "oU", "u:", "U", "U@", "V")
"""espeak-ng's English vowel phonemes."""
CONSONANTS = ("p", "b", "t", "d", "k", "g", "f", "v", "T", "D", "s", "z", "S", "Z", "h", "m", "n", "N", "l", "r",
              "w", "j", "tS", "dZ")
"""espeak-ng's English consonant phonemes."""
VOICE_FOLDER = "memzoo"
"""Folder of the synthetic voice files under the data folder's voices/ (their espeak-ng names start with it)."""


@dataclass(frozen=True)
class SyntheticAccent:
    """One synthetic accent: a training accent's voice file plus phoneme replacements."""

    index: int
    base: str
    """The espeak-ng accent it copies, such as "en-gb-scotland"."""
    replacements: tuple[tuple[str, str], ...]
    """(phoneme, replacement) pairs; the replacement "NULL" drops the phoneme."""

    @property
    def name(self) -> str:
        """Its espeak-ng voice name (with `--path` at `espeak_data`'s folder)."""
        return f"{VOICE_FOLDER}/accent-{self.index:02d}"

    def voice_file(self, system_data: Path) -> str:
        """The voice file: the base accent's, renamed, with the replacements ahead of its own
        (espeak-ng applies the first rule that names a phoneme)."""
        lines = [line for line in accent_file(self.base, system_data).read_text().splitlines()
                 if line.strip() and not line.startswith("name ")]
        rules = [f"replace 00 {phoneme} {replacement}" for phoneme, replacement in self.replacements]
        first = next((i for i, line in enumerate(lines) if line.startswith("replace ")), len(lines))
        return "\n".join([f"name {self.name}", *lines[:first], *rules, *lines[first:]]) + "\n"


def draw_accents(count: int, rules: int, bases: tuple[str, ...], rng: random.Random) -> list[SyntheticAccent]:
    """`count` synthetic accents, each on a random accent of `bases` with `rules` random
    replacements of distinct phonemes."""
    if count < 0 or rules < 1 or not bases:
        raise ValueError(f"draw_accents needs count >= 0, rules >= 1 and some bases; got {count}, {rules}, {bases}")
    accents = []
    for index in range(count):
        base = rng.choice(bases)
        phonemes = rng.sample(VOWELS + CONSONANTS, rules)
        replacements = tuple((p, rng.choice([v for v in VOWELS if v != p]) if p in VOWELS
                              else rng.choice([c for c in CONSONANTS if c != p] + ["NULL"])) for p in phonemes)
        accents.append(SyntheticAccent(index, base, replacements))
    return accents


def system_espeak_data() -> Path:
    """The espeak-ng-data folder of the installed espeak-ng."""
    try:
        version = subprocess.run(["espeak-ng", "--version"], capture_output=True, text=True, check=True).stdout
    except FileNotFoundError as error:
        raise RuntimeError("espeak-ng is not installed (install it with `apt-get install espeak-ng`)") from error
    found = re.search(r"Data at: (.+)", version)
    if found is None:
        raise RuntimeError(f"cannot find espeak-ng's data folder in its --version output: {version!r}")
    return Path(found.group(1).strip())


def accent_file(accent: str, system_data: Path) -> Path:
    """The voice file under system_data/lang whose first `language` line names `accent`."""
    for path in sorted((system_data / "lang").rglob("*")):
        if path.is_file():
            languages = [line.split()[1] for line in path.read_text(errors="replace").splitlines()
                         if line.startswith("language ") and len(line.split()) > 1]
            if languages and languages[0] == accent:
                return path
    raise ValueError(f"espeak-ng has no accent {accent!r} under {system_data / 'lang'}")


def espeak_data(accents: list[SyntheticAccent], folder: Path) -> Path:
    """A folder for `espeak-ng --path` whose espeak-ng-data links every entry of the system's and
    adds the accents' voice files under voices/memzoo; returns `folder`."""
    system = system_espeak_data()
    data = folder / "espeak-ng-data"
    (data / "voices" / VOICE_FOLDER).mkdir(parents=True, exist_ok=True)
    links = [(entry, data / entry.name) for entry in system.iterdir() if entry.name != "voices"]
    links += [(entry, data / "voices" / entry.name) for entry in (system / "voices").iterdir()]
    for entry, link in links:
        if not link.exists():
            link.symlink_to(entry)
    for accent in accents:
        (data / "voices" / accent.name).write_text(accent.voice_file(system))
    return folder
