"""MkDocs hooks of the documentation site (mkdocs.yml, ``hooks``).

The docstrings cross-reference in Sphinx's roles (``:class:`~sol_ext.SOLHead```), which Markdown
renders as the role's name followed by code. The hook turns each into the code alone, linked to the
object's API entry where the site documents it and left as plain code where it does not.
"""
from __future__ import annotations

import html
import re

# ":class:<code>~sol_ext.SOLHead</code>", ":meth:<code>SOLHead.update &lt;sol_ext.SOLHead.update&gt;</code>"
_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|data|attr|obj|exc|const):<code>([^<]*)</code>")


def _reference(match: re.Match) -> str:
    text = html.unescape(match.group(1)).strip()
    explicit = re.fullmatch(r"(.*?)\s*<([^>]+)>", text)
    if explicit:
        title, target = explicit.group(1), explicit.group(2)
    else:
        target = text.lstrip("~")
        title = target.rsplit(".", 1)[-1] if text.startswith("~") else target
    target = target.lstrip("~").rstrip("()")
    # mkdocs-autorefs links an optional reference where the target has an entry and leaves it as
    # it is otherwise, without a warning
    return (f'<autoref identifier="{html.escape(target)}" optional>'
            f"<code>{html.escape(title)}</code></autoref>")


def on_page_content(html_text: str, **_) -> str:
    """Sphinx roles in the rendered page become (linked) inline code."""
    return _ROLE.sub(_reference, html_text)
