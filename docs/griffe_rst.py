"""Griffe extension for the API reference (mkdocs.yml → mkdocstrings → ``extensions``).

The package's docstrings are Google style with a few reStructuredText habits that Markdown
renders badly. At build time (the sources are not changed) this rewrites

* ``:func:`x```, ``:class:`x```, ``:meth:``, ``:mod:``, ``:attr:``, ``:data:``, ``:exc:``
  roles → inline code ``x`` (a leading ``~`` or ``.`` is dropped);
* a section title ``Example:`` → ``Examples:`` (griffe's Google parser knows the plural only;
  otherwise a doctest's output line such as ``['rescaling']`` is read as a Markdown link);
* an RST literal-block marker ``Example::`` → ``Examples:`` when doctest lines follow, else
  ``Example:`` followed by the indented block (Markdown shows that as code).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|exc|obj):`[~.]?([^`<]+?)(?:\s*<[^>]+>)?`")
_EXAMPLE = re.compile(r"^(\s*)Example:(:?)\s*$", re.MULTILINE)


def fix_docstring(text: str) -> str:
    """The rewritten docstring text (see the module docstring)."""
    text = _ROLE.sub(lambda m: f"`{m.group(1)}`", text)

    def example(m: re.Match[str]) -> str:
        rest = text[m.end() :].lstrip("\n")
        doctest = rest.lstrip().startswith(">>>")
        return (
            f"{m.group(1)}Examples:" if (doctest or not m.group(2)) else f"{m.group(1)}Example:\n"
        )

    return _EXAMPLE.sub(example, text)


class RstToMarkdown(griffe.Extension):
    """Apply :func:`fix_docstring` to every docstring griffe loads."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = fix_docstring(obj.docstring.value)
