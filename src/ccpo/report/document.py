"""One renderer for every report: a document written as Markdown and HTML at once.

:class:`Doc` takes blocks (headings, paragraphs, bullets, tables, images) and writes each to
both forms, so the two never disagree; tables come from one
:class:`~ccpo.report.tables.TableData`. The HTML page (its style sheet, images inline) is
made here only. ``results.md`` (:mod:`ccpo.report.results`) and the ``reproduce`` report
(:mod:`ccpo.report.reproduce`) are both written with it.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

from ccpo.report.tables import TableData, render_html, render_markdown


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img src="data:image/png;base64,{data}" style="max-width:100%">'


def _inline_code(escaped: str) -> str:
    """Markdown `code` spans as HTML <code> (on already-escaped text)."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)


STYLE = (
    "body{font-family:sans-serif;max-width:1150px;margin:auto;padding:0 1em}"
    "table{border-collapse:collapse;margin:.6em 0}caption{text-align:left;"
    "font-weight:bold;padding:.3em 0}td,th{border:1px solid #ccc;padding:3px 8px;"
    "text-align:right}td:first-child,th:first-child{text-align:left}"
    "th{background:#f3f3f3}td.miss{color:#b00;background:#fde8e8}"
    "td.best{font-weight:bold;background:#e6f4e6}p.note{color:#555}"
    "p.caveat{background:#fff6d6;padding:.5em;border-left:4px solid #e0b000}"
)
"""The HTML page's style sheet: misses in red, the cheapest at the target in bold green."""


class Doc:
    """A report as Markdown and HTML at once: every block is written to both, so the two
    never disagree (tables come from one :class:`TableData`). ``folder`` is where the report
    goes (images are linked relative to it); without a title the document has no heading."""

    def __init__(self, folder: Path, title: str = "") -> None:
        self.folder = folder
        self.md: list[str] = [f"# {title}", ""] if title else []
        self.html: list[str] = [
            f"<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>"
        ]
        if title:
            self.html.append(f"<h1>{html.escape(title)}</h1>")

    def heading(self, text: str, level: int = 2) -> None:
        self.md += ["#" * level + " " + text, ""]
        self.html.append(f"<h{level}>{html.escape(text)}</h{level}>")

    def para(self, text: str, cls: str = "") -> None:
        self.md += [text, ""]
        attr = f" class='{cls}'" if cls else ""
        self.html.append(f"<p{attr}>{_inline_code(html.escape(text))}</p>")

    def bullets(self, items: list[str]) -> None:
        if not items:
            return
        self.md += [f"- {x}" for x in items] + [""]
        self.html.append("<ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in items) + "</ul>")

    def table(self, t: TableData) -> None:
        self.md += [render_markdown(t)]
        self.html.append(render_html(t))

    def images(self, paths: list[Path], alts: list[str]) -> None:
        links = (f"![{a}]({p.relative_to(self.folder)})" for p, a in zip(paths, alts, strict=True))
        self.md += [" ".join(links), ""]
        self.html += [_img(p) for p in paths]

    def markdown(self) -> str:
        """The Markdown text, ending in one newline."""
        return "\n".join(self.md).rstrip("\n") + "\n"

    def page(self) -> str:
        """The HTML page, plots inline (one file to send)."""
        return "\n".join([*self.html, "</body></html>"]) + "\n"

    def write(self, stem: str) -> tuple[Path, Path]:
        """``STEM.md`` and ``STEM.html`` in the folder; returns their paths."""
        md_path, html_path = self.folder / f"{stem}.md", self.folder / f"{stem}.html"
        md_path.write_text(self.markdown(), encoding="utf-8")
        html_path.write_text(self.page(), encoding="utf-8")
        return md_path, html_path
