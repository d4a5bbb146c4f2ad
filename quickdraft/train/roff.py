"""Plain text out of roff (man pages): inline escapes, macro arguments, and whole pages.

Enough of groff's man and pod2man macros for prose: fonts, special characters and strings
resolve to text; requests that only lay out the page are dropped. Used to build text corpora
from the man pages a machine has (``quickdraft data corpus``) and by the task-set builder.
"""

from __future__ import annotations

import functools
import re

# groff special characters met in these pages (\(xx and \[xx]).
ROFF_CHARS = {
    ":a": "ä", ":o": "ö", ":u": "ü", ":A": "Ä", ":O": "Ö", ":U": "Ü", "ss": "ß",
    "'e": "é", "`e": "è", "`E": "È", "^e": "ê", ":e": "ë", "'a": "á", "`a": "à", "^a": "â",
    "^i": "î", ":i": "ï", "^o": "ô", "`u": "ù", "^u": "û", ",c": "ç", "'E": "É",
    "oe": "œ", "OE": "Œ", "ae": "æ", "lq": "“", "rq": "”", "Bq": "„", "bq": "‚",
    "oq": "‘", "cq": "’", "aq": "'", "dq": '"', "Fo": "«", "Fc": "»", "em": "—",
    "en": "–", "hy": "-", "mi": "-", "pl": "+", "mu": "×", "bu": "•", "co": "©",
    "rg": "®", "de": "°", "ga": "`", "ti": "~", "ha": "^", "rs": "\\", "sl": "/",
    "ba": "|", "at": "@", "sh": "#", "Do": "$", "lB": "[", "rB": "]", "lC": "{",
    "rC": "}", "->": "→", "<-": "←", ">=": "≥", "<=": "≤", "fm": "′",
}  # fmt: skip
# Strings defined by pod2man's preamble (\*(xx).
ROFF_STRINGS = {"C`": '"', "C'": '"', 'L"': "“", 'R"': "”", "Aq": "'", "--": "—"}
SIMPLE_ESCAPES = {
    "-": "-", "~": " ", " ": " ", "0": " ", "e": "\\", ".": ".", "'": "'", "`": "`",
    "|": "", "^": "", "&": "", ")": "", "c": "", "%": "", ":": "", "/": "", ",": "",
}  # fmt: skip
FONT_MACROS = {"B", "I", "R", "SM", "SB"}
ALTERNATING_MACROS = {"BR", "BI", "IB", "IR", "RB", "RI"}
PARAGRAPH_MACROS = {"PP", "P", "LP", "Sp", "sp"}
# Requests that start something other than running prose (lists, displays, subsections).
STRUCTURE_MACROS = {"TP", "TQ", "IP", "HP", "RS", "nf", "EX", "Vb", "TS", "SS"}

_ROFF_ESCAPE = re.compile(
    r"\\(?:"
    r"f(?:\[[^\]]*\]|\(..|.)"  # font change
    r"|s(?:\[[^\]]*\]|\(\d\d|[+-]?\d)"  # size change
    r"|\*(?:\[(?P<str_long>[^\]]*)\]|\((?P<str2>..)|(?P<str1>.))"  # predefined string
    r"|\((?P<char2>..)|\[(?P<char_long>[^\]]*)\]"  # special character
    r"|[nwhvkHSZ](?:\[[^\]]*\]|\(..|'[^']*'|.)"  # registers, widths, motions
    r"|(?P<simple>.))"
)


def _replacement(match: re.Match[str], unknown: set[str] | None) -> str:
    if (name := match.group("str_long") or match.group("str2") or match.group("str1")) is not None:
        return ROFF_STRINGS.get(name, "")
    if (name := match.group("char2") or match.group("char_long")) is not None:
        if re.fullmatch(r"u[0-9A-F]{4,5}", name):
            return chr(int(name[1:], 16))
        if name not in ROFF_CHARS and unknown is not None:
            unknown.add(name)
        return ROFF_CHARS.get(name, "")
    if (char := match.group("simple")) is not None:
        return SIMPLE_ESCAPES.get(char, char)
    return ""


def roff_inline(text: str, unknown: set[str] | None = None) -> str:
    """Plain text of one line of roff: escapes resolved, font changes removed. Special
    characters this table lacks become nothing; their names are added to ``unknown``."""
    text = re.sub(r'\\".*', "", text)  # comment
    text = text.replace("\\\\", "\\e")
    return _ROFF_ESCAPE.sub(functools.partial(_replacement, unknown=unknown), text)


def macro_arguments(text: str) -> list[str]:
    """Split macro arguments on spaces, honouring double quotes."""
    return [a[1:-1] if a.startswith('"') else a for a in re.findall(r'"[^"]*"|\S+', text)]


SECTION_MACROS = {"SH", "SS"}
BREAK_MACROS = {"PP", "P", "LP", "Sp", "sp", "br", "TP", "TQ", "HP", "RS", "RE", "IP"}


def page_text(source: str, unknown: set[str] | None = None) -> str:
    """A whole man page as plain text: section titles and paragraphs separated by blank
    lines, each paragraph's lines joined; an ``.IP`` tag starts its paragraph. A table keeps its
    rows as text (its format lines go); requests that only lay out the page (``.TH``,
    ``.IX``, ``.de`` ...) leave no text."""
    paragraphs: list[str] = []
    current: list[str] = []

    def flush() -> None:
        text = re.sub(r"[ \t]+", " ", " ".join(current)).strip()
        if text:
            paragraphs.append(text)
        current.clear()

    defining = table_format = False
    for line in source.splitlines():
        if defining:  # inside a macro definition: none of it is text
            defining = not line.startswith("..")
            continue
        if table_format:  # a table's options and column formats, up to the line ending "."
            table_format = not line.rstrip().endswith(".")
            continue
        if line.startswith((".", "'")):
            name, _, rest = line[1:].strip().partition(" ")
            if name in ("de", "de1", "am", "ig"):
                defining = True
            elif name == "TS":
                flush()
                table_format = True
            elif name in SECTION_MACROS:
                flush()
                current.append(" ".join(macro_arguments(roff_inline(rest, unknown))))
                flush()
            elif name in BREAK_MACROS:
                flush()
                tag = macro_arguments(roff_inline(rest, unknown)) if name == "IP" else []
                current.extend(tag[:1])
            elif name in FONT_MACROS:
                current.append(" ".join(macro_arguments(roff_inline(rest, unknown))))
            elif name in ALTERNATING_MACROS:
                current.append("".join(macro_arguments(roff_inline(rest, unknown))))
            continue
        if not line.strip():
            flush()
        else:
            current.append(roff_inline(line, unknown))
    flush()
    return "\n\n".join(paragraphs) + "\n" if paragraphs else ""
