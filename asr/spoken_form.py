"""Written English -> the words a speaker says: abbreviations, symbols, money, percentages, times,
years, decades, ordinals, decimals and numbers spelled out (numbers through `num2words`), then
`asr.text.normalize` (lower case letters and apostrophes).

    spoken_form("Dr. Lee paid $3.50 at 7:05 on the 2nd of May 1998 (10% off).")
    -> "doctor lee paid three dollars fifty cents at seven oh five on the second of may
        nineteen ninety eight ten percent off"

`expand_abbreviations` runs on whole texts before they are cut into sentences, so that the full
stop of "Mr." ends no sentence; `spoken_form` runs on one sentence.
"""

from __future__ import annotations

import re

from num2words import num2words

from asr.text import normalize

ABBREVIATIONS = {
    "Mr.": "mister", "Mrs.": "missus", "Ms.": "miz", "Dr.": "doctor", "Prof.": "professor", "St.": "saint",
    "Mt.": "mount", "Jr.": "junior", "Sr.": "senior", "vs.": "versus", "etc.": "et cetera", "e.g.": "for example",
    "i.e.": "that is", "a.m.": "a m", "p.m.": "p m", "U.S.": "u s", "U.K.": "u k", "approx.": "approximately",
    "Inc.": "incorporated", "Co.": "company", "Ltd.": "limited", "Jan.": "january", "Feb.": "february",
    "Aug.": "august", "Sept.": "september", "Oct.": "october", "Nov.": "november", "Dec.": "december",
}
"""Abbreviations (case as written, full stops included) and what is said for them."""
SYMBOLS = {"&": " and ", "+": " plus ", "#": " ", "°": " degrees "}
"""Symbols spoken as words (a hashtag's # is not spoken)."""
CURRENCIES = {"$": ("dollar", "dollars", "cent", "cents"), "£": ("pound", "pounds", "penny", "pence"),
              "€": ("euro", "euros", "cent", "cents")}

_ABBREVIATION = re.compile(
    rf"(?=[{re.escape(''.join(sorted({a[0] for a in ABBREVIATIONS})))}])(?<![\w.])"  # a first letter, not inside a word
    rf"(?:{'|'.join(re.escape(a) for a in sorted(ABBREVIATIONS, key=len, reverse=True))})")
"""Any abbreviation, the longest first, not preceded by a letter, digit or full stop. The first letters are checked
before the alternatives rather than each alternative at every character: the seven training-text
sources extract in 7.6 s instead of 27.2 (`benchmarks/cold_cache.py`), with the same matches."""
_NUMBER = r"\d+(?:,\d{3})*"
_MONEY = re.compile(rf"([$£€])\s?({_NUMBER})(?:\.(\d+))?(?:\s?(thousand|million|billion|trillion)\b)?")
_PERCENT = re.compile(rf"({_NUMBER}(?:\.\d+)?)\s?%")
_TIME = re.compile(r"\b(\d{1,2}):(\d\d)\b")
_DECADE = re.compile(r"\b(1[1-9]|20)([0-9]0)'?s\b|'([0-9]0)s\b")
_ORDINAL = re.compile(r"\b(\d+)(st|nd|rd|th)\b", re.IGNORECASE)
_YEAR = re.compile(r"(?<![\d,.])(1[1-9]\d\d|20\d\d)(?!\d|[,.]\d)")
_DECIMAL = re.compile(rf"(?<![\d.])({_NUMBER})\.(\d+)(?![\d.])")
_CARDINAL = re.compile(_NUMBER)


def expand_abbreviations(text: str) -> str:
    """`text` with every ABBREVIATIONS entry replaced by its spoken words."""
    return _ABBREVIATION.sub(lambda m: ABBREVIATIONS[m.group(0)], text)


def spoken_form(sentence: str) -> str:
    """The normalised words a speaker says for one written sentence (see the module docstring)."""
    text = expand_abbreviations(sentence)
    text = _MONEY.sub(_money, text)
    text = _PERCENT.sub(lambda m: f" {_number_words(m.group(1))} percent ", text)
    text = _TIME.sub(_time, text)
    text = _DECADE.sub(_decade, text)
    text = _ORDINAL.sub(lambda m: f" {num2words(int(m.group(1)), to='ordinal')} ", text)
    text = _YEAR.sub(lambda m: f" {num2words(int(m.group(1)), to='year')} ", text)
    text = _DECIMAL.sub(lambda m: f" {_number_words(m.group(0))} ", text)
    text = _CARDINAL.sub(lambda m: f" {_cardinal(m.group(0))} ", text)
    for symbol, words in SYMBOLS.items():
        text = text.replace(symbol, words)
    return normalize(text)


def _cardinal(digits: str) -> str:
    return num2words(int(digits.replace(",", "")))


def _number_words(number: str) -> str:
    """"1,250" -> "one thousand two hundred and fifty"; "3.25" -> "three point two five"."""
    whole, _, fraction = number.partition(".")
    words = _cardinal(whole)
    return f"{words} point {' '.join(num2words(int(d)) for d in fraction)}" if fraction else words


def _money(match: re.Match) -> str:
    one, many, cent, cents = CURRENCIES[match.group(1)]
    amount, pennies, scale = match.group(2), match.group(3), match.group(4)
    if scale or (pennies and len(pennies) != 2):  # "$4.5 million", "$0.125": the number, then the unit
        return f" {_number_words(amount + ('.' + pennies if pennies else ''))} {scale or ''} {many} "
    words = f" {_cardinal(amount)} {one if amount == '1' else many}"
    if pennies and int(pennies):
        words += f" {num2words(int(pennies))} {cent if pennies == '01' else cents}"
    return words + " "


def _time(match: re.Match) -> str:
    hour, minute = int(match.group(1)), int(match.group(2))
    if hour > 24 or minute > 59:
        return f" {num2words(hour)} {num2words(minute)} "
    if minute == 0:
        return f" {num2words(hour)} o'clock "
    return f" {num2words(hour)} {'oh ' if minute < 10 else ''}{num2words(minute)} "


def _decade(match: re.Match) -> str:
    """"1990s" -> "nineteen nineties", "'80s" -> "eighties", "2000s" -> "two thousands"."""
    words = num2words(int(match.group(1) + match.group(2)), to="year") if match.group(1) else num2words(int(match.group(3)))
    return f" {words[:-1] + 'ies' if words.endswith('y') else words + 's'} "
