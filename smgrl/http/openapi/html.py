"""``GET /docs``: the OpenAPI document (``smgrl/http/openapi/document.py``) rendered as one HTML page.

Rendered by the gateway itself, server side: no JavaScript, no stylesheet or font from anywhere
else (a gateway on a training cluster often has no route to a CDN, and a page that loads code
from one is code nobody reviewed). Links are fragments within the page (``#op-...``,
``#schema-...``); the response's ``content-security-policy`` forbids loading anything at all.
Like ``/openapi.json`` it needs no key: it shows routes, never data.
"""

from __future__ import annotations

import json
import re
from html import escape
from typing import Any

from smgrl.http.openapi import document as openapi

HTML = "text/html; charset=utf-8"
# Nothing may be fetched: inline styles only (the page has no script, image or frame).
CSP = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
METHODS = ("get", "head", "post", "put", "patch", "delete", "options")
_REF = re.compile(r"&quot;#/components/(schemas|responses)/([A-Za-z0-9_.-]+)&quot;")

_STYLE = """
body{font:15px/1.45 system-ui,sans-serif;margin:0 auto;max-width:70em;padding:1em 2em;color:#222}
h2{border-bottom:1px solid #ccc;margin-top:2em}
section.op{border:1px solid #ddd;border-radius:4px;margin:1em 0;padding:.2em 1em}
.m{display:inline-block;min-width:4.5em;font-weight:bold;text-transform:uppercase}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:.2em .5em;vertical-align:top}
pre{background:#f6f6f6;padding:.5em;overflow:auto;font-size:13px}code{font-size:13px}
"""


def render(doc: dict[str, Any]) -> str:
    """The whole page for one OpenAPI document."""
    info = doc.get("info", {})
    title = f"{info.get('title', 'API')} {info.get('version', '')}".strip()
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(title)} API</title><style>{_STYLE}</style></head><body>",
        f"<h1>{escape(title)} API</h1>",
        f"<p>{escape(info.get('description', ''))}</p>",
        f"<p>The same document as JSON: <code>GET /openapi.json</code> (OpenAPI {escape(str(doc.get('openapi', '')))}).</p>",
        _contents(doc),
    ]
    for path, item in doc.get("paths", {}).items():
        for method in METHODS:
            if method in item:
                parts.append(_operation(path, method, item[method]))
    components = doc.get("components", {})
    parts.append("<h2>Schemas</h2>")
    for name, schema in components.get("schemas", {}).items():
        parts.append(_component("schema", name, schema))
    if components.get("responses"):
        parts.append("<h2>Shared responses</h2>")
        for name, response in components["responses"].items():
            parts.append(_component("response", name, response))
    if components.get("securitySchemes"):
        parts.append(
            "<h2>Security schemes</h2><table><tr><th>name</th><th>scheme</th><th>description</th></tr>"
        )
        for name, scheme in components["securitySchemes"].items():
            kind = f"{scheme.get('type', '')} {scheme.get('scheme', '')}".strip()
            parts.append(_row(name, kind, scheme.get("description", "")))
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _contents(doc: dict[str, Any]) -> str:
    """The list of operations, grouped by their first tag in the document's tag order."""
    groups: dict[str, list[str]] = {tag["name"]: [] for tag in doc.get("tags", [])}
    descriptions = {tag["name"]: tag.get("description", "") for tag in doc.get("tags", [])}
    for path, item in doc.get("paths", {}).items():
        for method in METHODS:
            if method in item:
                op = item[method]
                tag = (op.get("tags") or ["other"])[0]
                link = (
                    f'<li><a href="#{_op_anchor(path, method, op)}"><span class="m">{method}</span> '
                    f"<code>{escape(path)}</code></a> {escape(op.get('summary', ''))}</li>"
                )
                groups.setdefault(tag, []).append(link)
    out = ["<h2>Routes</h2>"]
    for tag, links in groups.items():
        if links:
            note = f" ({escape(descriptions[tag])})" if descriptions.get(tag) else ""
            out.append(f"<h3>{escape(tag)}{note}</h3><ul>{''.join(links)}</ul>")
    return "\n".join(out)


def _op_anchor(path: str, method: str, op: dict[str, Any]) -> str:
    name = op.get("operationId") or f"{method}-{path}"
    return "op-" + re.sub(r"[^A-Za-z0-9_-]", "-", name)


def _operation(path: str, method: str, op: dict[str, Any]) -> str:
    out = [
        f'<section class="op" id="{_op_anchor(path, method, op)}">',
        f'<h3><span class="m">{method}</span> <code>{escape(path)}</code></h3>',
        f"<p><b>{escape(op.get('summary', ''))}</b></p>",
    ]
    if op.get("description"):
        out.append(f"<p>{escape(op['description'])}</p>")
    security = op.get("security")
    if security is not None:
        names = sorted({name for requirement in security for name in requirement})
        needs = ", ".join(names) + (" (or none, when no key is configured)" if {} in security else "")
        out.append(f"<p>Auth: {escape(needs) if names else 'none'}</p>")
    params = op.get("parameters") or []
    if params:
        out.append(
            "<table><tr><th>parameter</th><th>in</th><th>required</th><th>schema</th><th>description</th></tr>"
        )
        for param in params:
            out.append(
                f"<tr><td><code>{escape(str(param.get('name', '')))}</code></td><td>{escape(str(param.get('in', '')))}</td>"
                f"<td>{'yes' if param.get('required') else 'no'}</td><td>{_schema(param.get('schema'))}</td>"
                f"<td>{escape(str(param.get('description', '')))}</td></tr>"
            )
        out.append("</table>")
    body = op.get("requestBody")
    if body:
        out.append(f"<p>Request body{' (required)' if body.get('required') else ''}:</p>{_content(body)}")
    out.append("<table><tr><th>status</th><th>description</th><th>content</th></tr>")
    for status, response in op.get("responses", {}).items():
        if "$ref" in response:
            out.append(f"<tr><td>{escape(str(status))}</td><td colspan=2>{_schema(response)}</td></tr>")
            continue
        out.append(
            f"<tr><td>{escape(str(status))}</td><td>{escape(response.get('description', ''))}</td>"
            f"<td>{_content(response)}</td></tr>"
        )
    out.append("</table></section>")
    return "\n".join(out)


def _content(holder: dict[str, Any]) -> str:
    items = [
        f"<code>{escape(kind)}</code>: {_schema(media.get('schema'))}"
        for kind, media in (holder.get("content") or {}).items()
    ]
    return "<br>".join(items)


def _schema(schema: Any) -> str:
    """A link for a ``$ref``, else the (small) inline schema as JSON."""
    if not schema:
        return ""
    return _linked(escape(json.dumps(schema, separators=(", ", ": "))))


def _component(kind: str, name: str, value: Any) -> str:
    body = _linked(escape(json.dumps(value, indent=2)))
    return f'<section id="{kind}-{escape(name)}"><h3>{escape(name)}</h3><pre>{body}</pre></section>'


def _linked(escaped_json: str) -> str:
    """Turn every escaped ``"#/components/<kind>/<Name>"`` into a link to its section."""

    def link(match: re.Match[str]) -> str:
        kind = "schema" if match.group(1) == "schemas" else "response"
        return f'<a href="#{kind}-{match.group(2)}">{match.group(2)}</a>'

    return _REF.sub(link, escaped_json)


def _row(*cells: str) -> str:
    return "<tr>" + "".join(f"<td>{escape(str(cell))}</td>" for cell in cells) + "</tr>"


_RENDERED: dict[bool, bytes] = {}


def rendered(rl_enabled: bool) -> bytes:
    """The page for the gateway's document, built once per process (it describes code only)."""
    page = _RENDERED.get(rl_enabled)
    if page is None:
        page = render(openapi.document(rl_enabled)).encode("utf-8")
        _RENDERED[rl_enabled] = page
    return page
