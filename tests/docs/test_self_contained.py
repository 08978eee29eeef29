"""The repository stands alone: no file in it (code, comments, docstrings, tests, docs,
benchmarks) points at documents outside it, and none names the project's working history.

Refused, with the file and line of each hit:

- paths into a sibling checkout of design notes (``shared`` followed by ``/spec``, ``/design`` or
  ``/tools``, or ``..`` followed by ``/shared``) and absolute paths of one machine (a home
  directory or a work tree);
- a section sign that is not an RFC's (``RFC 9112`` then the sign and a number), and an outside
  contract's appendices and numbered sections: the project's pages have named sections, so a
  reference names the page and the section's title;
- the word issue followed by a number, session followed by a digit, and helper followed by a
  name: a comment says what the code does and why, a benchmark heading says when it was measured.

The patterns are built from pieces so that this file does not match itself.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_SKIP_DIRS = {
    ".git",
    ".venv",
    "__pycache__",
    ".pytest_cache",
    ".ruff_cache",
    ".mypy_cache",
    ".hypothesis",
    "node_modules",
    "build",
    "dist",
}
_TEXT = {
    ".py",
    ".md",
    ".toml",
    ".txt",
    ".sh",
    ".cfg",
    ".ini",
    ".yaml",
    ".yml",
    ".json",
    ".html",
    ".js",
    ".css",
}
_SECTION = "\u00a7"

OUTSIDE = [
    ("a design-notes checkout", re.compile("shared" + r"/(spec|design|tools)\b")),
    ("a sibling checkout", re.compile(r"\.\./" + "shared")),
    ("a machine's absolute path", re.compile(r"(?<![\w.~])/(" + "work|home|Users|root" + r")/\w")),
    # RFC 9112 <sign>6.3 is the RFC's own numbering; any other section sign points outside.
    ("a section sign outside an RFC", re.compile(r"(?<!RFC \d{4} )" + _SECTION)),
    # the outside contract's appendices and sections, by name
    ("an outside appendix", re.compile(r"\b" + "Appendix" + r" [A-Z]\b")),
    (
        "an outside spec's section",
        re.compile(r"\bspec('s)? " + r"(section|chapter)|" + "psrl-sessions" + r"-tito"),
    ),
]
HISTORY = [
    ("an issue number", re.compile(r"\b" + "issue" + r"s? #?\d+", re.IGNORECASE)),
    ("a session number", re.compile(r"(?<![-\w])" + "session" + r" \d", re.IGNORECASE)),
]
# "helper" then a name; ordinary words after it ("helpers for tests") are not names.
_HELPER = re.compile(r"\b" + "helper" + r's? "?([A-Za-z_][\w-]*)', re.IGNORECASE)
_PLAIN_WORDS = """
a an the and or to of for on in at by from with that which who is are was were be has had have
import imports running run runs shipped ships function functions module modules class method
methods process processes task tasks thread threads returns return used uses use it its this
these those test tests script scripts here there above below stopped users live
"""
_PLAIN = frozenset(_PLAIN_WORDS.split())


def _files() -> list[Path]:
    out: list[Path] = []
    for path in sorted(ROOT.rglob("*")):
        rel = path.relative_to(ROOT)
        if any(part in _SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts):
            continue
        if path.is_file() and (path.suffix in _TEXT or path.name in {"Makefile", "Dockerfile"}):
            out.append(path)
    return out


def _hits(text: str, rel: str) -> list[str]:
    found: list[str] = []
    for n, line in enumerate(text.splitlines(), 1):
        for what, pattern in OUTSIDE + HISTORY:
            m = pattern.search(line)
            if m:
                found.append(f"{rel}:{n}: {what}: {line.strip()[:100]}")
        for m in _HELPER.finditer(line):
            if m.group(1).lower() not in _PLAIN:
                found.append(f"{rel}:{n}: a helper's name: {line.strip()[:100]}")
    return found


def test_the_checker_refuses_what_it_should():
    sign = _SECTION
    bad = [
        "see " + "shared" + "/spec/engines.md",
        "(" + ".." + "/shared/x)",
        "/" + "work/shared/tools/x",
        "spec " + sign + "9",
        "engines.md " + sign + "1.3",
        "Is" + "sue 14",
        "Ses" + "sion 4: rollout",
        "helper" + ' "trust',
        "(helper" + " fanout2)",
        "spec " + "Appendix A.2",
        "(spec " + "psrl-sessions" + "-tito.md section 6.2)",
        "the spec's " + "section 11 item 1",
    ]
    good = [
        "RFC 9112 " + sign + "6.3 rule 1",
        "RFC 3986 " + sign + "6.2.2.1",
        "helpers for tests",
        "/tmp/x.db",
    ]
    assert [b for b in bad if not _hits(b, "x")] == []
    assert [g for g in good if _hits(g, "x")] == []


def test_no_reference_outside_the_repository_and_no_working_history():
    me = Path(__file__).resolve()
    hits: list[str] = []
    for path in _files():
        if path.resolve() == me:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        hits.extend(_hits(text, str(path.relative_to(ROOT))))
    assert hits == [], f"{len(hits)} references:\n" + "\n".join(hits)
