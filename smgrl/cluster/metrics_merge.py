"""Merging Prometheus text expositions of several processes into one (``smgrl launch --workers N``).

Each process keeps its own prometheus_client registry (its counters, and gauges computed from its
memory: a multiprocess-mode registry cannot hold those). The supervisor scrapes them all and answers
one exposition: every sample gets a ``label="<process index>"`` label, a family's ``# HELP`` and
``# TYPE`` lines appear once. Pure (text in, text out).
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

__all__ = ["merge_expositions"]


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _help(doc: str) -> str:
    return doc.replace("\\", r"\\").replace("\n", r"\n")


def merge_expositions(texts: dict[str, str], *, label: str) -> str:
    """``texts``: process key -> its exposition. Families in first-seen order."""
    families: dict[str, tuple[str, str, list[str]]] = {}
    for key, text in texts.items():
        for fam in text_string_to_metric_families(text):
            entry = families.setdefault(fam.name, (fam.documentation, fam.type, []))
            for s in fam.samples:
                labels = {label: key, **s.labels}
                rendered = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
                entry[2].append(f"{s.name}{{{rendered}}} {floatToGoString(s.value)}")
    out = []
    for name, (doc, kind, lines) in families.items():
        # As prometheus_client writes them: a counter's header names its _total samples.
        name = f"{name}_total" if kind == "counter" else name
        out.append(f"# HELP {name} {_help(doc)}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(lines)
    return "\n".join(out) + "\n" if out else ""
