"""The runbook (``docs/runbook.md``) as the daemon serves it at ``/runbook``.

The shipped alert rules link each alert to ``http://INSTANCE/runbook#anchor``,
so the page an alert names is the one installed with the daemon that raised
it. It is served as the Markdown text inside an HTML page, with an anchor
before each heading (GitHub's spelling of a heading's anchor), so those links
land on their entry without a Markdown renderer on the host.
"""
from __future__ import annotations

import html
import re
from importlib import resources


def anchor(heading: str) -> str:
    """The anchor of a Markdown heading's text: lower case, punctuation
    dropped, spaces as hyphens (``CoschedDown`` -> ``coscheddown``)."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def text() -> str:
    """The runbook's Markdown, as installed with this package."""
    return resources.files("cosched").joinpath("runbook.md").read_text(encoding="utf-8")


def page(markdown: str) -> bytes:
    """An HTML page showing ``markdown`` as it is, each heading preceded by its anchor."""
    lines = []
    for line in markdown.splitlines():
        heading = re.match(r"#+ (.*)$", line)
        mark = f'<a id="{anchor(heading.group(1))}"></a>' if heading else ""
        lines.append(mark + html.escape(line))
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>cosched runbook</title></head>\n"
            "<body><pre style=\"white-space: pre-wrap\">\n" + "\n".join(lines) + "\n</pre></body></html>\n").encode()
