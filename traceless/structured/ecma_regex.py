"""Regular expressions with ECMA-262's character classes, for llguidance.

JSON Schema reads `pattern` as ECMA-262, where `\\d` is [0-9], `\\w` is [A-Za-z0-9_] and `\\s` is a
fixed set of spaces and line terminators; llguidance applies that to schema patterns itself, but
a plain regex (`structured_outputs.regex`) goes to its Rust regex syntax, where `\\d` and `\\w` are
Unicode classes (a `\\d{3}` admitted three Arabic-Indic or segmented digits). `ecma_to_ascii`
rewrites the six class escapes into explicit sets before the regex is compiled, so both kinds of
request mean the same thing by them. Everything else passes through unchanged.
"""

from __future__ import annotations

from traceless.errors import InvalidRequestError

DIGIT = "0-9"
WORD = "A-Za-z0-9_"
# ECMA-262 WhiteSpace and LineTerminator: tab, LF, VT, FF, CR, space, NBSP, the Zs spaces, LS, PS, BOM
SPACE = (
    r"\t\n\x0B\x0C\r \xA0\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}"
    r"\x{FEFF}"
)
_CLASSES = {"d": DIGIT, "w": WORD, "s": SPACE}


def ecma_to_ascii(pattern: str) -> str:
    """`pattern` with \\d \\D \\w \\W \\s \\S replaced by explicit sets (inside a bracket set the
    positive ones are inlined; a negated one there is refused: it has no set form to inline)."""
    out: list[str] = []
    in_set = False
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            esc = pattern[i + 1]
            out.append(_escape(esc, in_set))
            i += 2
            continue
        if ch == "[" and not in_set:
            in_set = True
            out.append(ch)
            if pattern.startswith("^", i + 1):  # a negated set: its "^" is not a literal
                out.append("^")
                i += 1
        elif ch == "]" and in_set:
            in_set = False
            out.append(ch)
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def _escape(esc: str, in_set: bool) -> str:
    cls = _CLASSES.get(esc.lower())
    if cls is None:
        return "\\" + esc
    if in_set:
        if esc.isupper():
            raise InvalidRequestError(
                "the regex uses a negated class (\\D, \\W or \\S) inside [...]; write the set out instead"
            )
        return cls
    return f"[^{cls}]" if esc.isupper() else f"[{cls}]"
