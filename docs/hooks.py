r"""MkDocs hooks of the documentation site (mkdocs.yml, ``hooks``).

The docstrings cross-reference in Sphinx's roles (``:class:`~sol_ext.SOLHead```), which Markdown
renders as the role's name followed by code. The hook turns each into the code alone, linked to the
object's API entry where the site documents it and left as plain code where it does not.

The pages write math as LaTeX between ``$…$`` (inline) and ``$$…$$`` (display), which
``pymdownx.arithmatex`` keeps in ``<span class="arithmatex">\(…\)</span>`` and
``<div class="arithmatex">\[…\]</div>``. The hook renders each to MathML with latex2mathml, which
browsers display natively: the site needs no script and no network to show its equations.
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


# what pymdownx.arithmatex (generic) leaves of $…$ and $$…$$
_INLINE_MATH = re.compile(r'<span class="arithmatex">\\\((.*?)\\\)</span>', re.S)
_DISPLAY_MATH = re.compile(r'<div class="arithmatex">\\\[(.*?)\\\]</div>', re.S)


def render_math(html_text: str) -> str:
    """The page with its LaTeX turned into MathML (``<math>``), inline and display."""
    # the extra "docs"; imported here, so that the hook's other work does not need it
    from latex2mathml.converter import convert as latex_to_mathml

    if "arithmatex" not in html_text:
        return html_text
    def inline(match: re.Match) -> str:
        return f'<span class="arithmatex">{latex_to_mathml(html.unescape(match.group(1)).strip())}</span>'

    def display(match: re.Match) -> str:
        mathml = latex_to_mathml(html.unescape(match.group(1)).strip(), display="block")
        return f'<div class="arithmatex">{mathml}</div>'

    return _INLINE_MATH.sub(inline, _DISPLAY_MATH.sub(display, html_text))


def on_page_content(html_text: str, **_) -> str:
    """Sphinx roles in the rendered page become (linked) inline code; LaTeX becomes MathML."""
    return render_math(_ROLE.sub(_reference, html_text))
