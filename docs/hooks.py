"""mkdocs hooks (``hooks:`` in mkdocs.yml), run by every ``mkdocs build``.

* ``on_config`` fails the build when a name of ``noetherflow.__all__`` has no docstring, or
  a public method/property of a public class has none (its own or inherited; the few in
  ``KNOWN_UNDOCUMENTED`` are tolerated until fixed, and an entry that gains a docstring must
  be removed), or a public name is missing from the API reference pages (``docs/api/*.md``,
  one ``::: noetherflow.Name`` per name), or a page documents a name that is not public.
* ``on_files`` adds MathJax (the ``tex-svg-full.js`` bundle of the ``django-static-mathjax``
  package, a docs dependency) to the site, so formulas are typeset with no network and from
  ``file://`` (SVG output: no font files to load).
* ``on_page_markdown`` fills the Results page (``reproduction/index.md``) with the report that
  ``python docs/gen_results.py`` wrote to ``docs/reproduction/_generated/``, in a
  ``<div class="nf-report">`` whose tables ``docs/stylesheets/report.css`` lets wrap; without
  it the page says how to generate it (that is what the CI build shows). The report's values
  are Markdown-inert (noetherflow.report.render), so arithmatex finds no math in them.
"""

from __future__ import annotations

import enum
import inspect
import re
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent
API_DIR = DOCS / "api"
GENERATED = DOCS / "reproduction" / "_generated"
MARKER = "<!-- reproduction-report -->"
# Public methods without a docstring when the check was introduced (owners: fix, then delete
# the entry here — a stale entry fails the build too). Nothing may be added to this list.
KNOWN_UNDOCUMENTED: frozenset[str] = frozenset()  # all documented (ruff's D rules)
_DIRECTIVE = re.compile(r"^:::\s+noetherflow\.([A-Za-z_][A-Za-z0-9_]*)\s*$", re.MULTILINE)


def documented_names(api_dir: Path = API_DIR) -> dict[str, str]:
    """``{name: page}`` for every ``::: noetherflow.Name`` directive in the API pages."""
    out: dict[str, str] = {}
    for page in sorted(api_dir.glob("*.md")):
        for name in _DIRECTIVE.findall(page.read_text(encoding="utf-8")):
            out[name] = page.name
    return out


def _has_own_doc(cls: type) -> bool:
    doc = (cls.__dict__.get("__doc__") or "").strip()
    return bool(doc) and not doc.startswith(f"{cls.__name__}(")  # dataclasses' default doc


def undocumented_members(cls: type) -> list[str]:
    """Public methods and properties defined by ``cls`` with no docstring, own or inherited."""
    out = []
    for key, raw in vars(cls).items():
        if key.startswith("_") or not (
            inspect.isfunction(raw) or isinstance(raw, (property, staticmethod, classmethod))
        ):
            continue
        if isinstance(raw, property):
            inherited = [getattr(base, key, None) for base in cls.__mro__[1:]]
            doc = raw.__doc__ or next(
                (b.__doc__ for b in inherited if isinstance(b, property) and b.__doc__), None
            )
        else:
            doc = inspect.getdoc(getattr(cls, key))
        if not (doc or "").strip():
            out.append(f"{cls.__name__}.{key}")
    return out


def api_problems(api_dir: Path = API_DIR) -> list[str]:
    """Every public symbol without a docstring or without an API entry (empty: all good)."""
    import noetherflow

    problems = []
    members: set[str] = set()
    for name in noetherflow.__all__:
        obj = getattr(noetherflow, name)
        if not (inspect.getdoc(obj) or "").strip() or (
            inspect.isclass(obj) and not _has_own_doc(obj)
        ):
            problems.append(f"noetherflow.{name} has no docstring")
        if inspect.isclass(obj) and not issubclass(obj, (enum.Enum, BaseException)):
            members.update(undocumented_members(obj))
    problems += [f"noetherflow.{m} has no docstring" for m in sorted(members - KNOWN_UNDOCUMENTED)]
    problems += [
        f"noetherflow.{m} now has a docstring: remove it from KNOWN_UNDOCUMENTED in docs/hooks.py"
        for m in sorted(KNOWN_UNDOCUMENTED - members)
    ]
    documented = documented_names(api_dir)
    problems += [
        f"noetherflow.{n} is public but not in the API reference (add `::: noetherflow.{n}` "
        "to a page in docs/api/)"
        for n in noetherflow.__all__
        if n not in documented
    ]
    problems += [
        f"docs/api/{page} documents noetherflow.{n}, which is not in noetherflow.__all__"
        for n, page in documented.items()
        if n not in noetherflow.__all__
    ]
    return problems


def report_markdown(generated: Path = GENERATED) -> str:
    """The generated report, or an admonition saying how to generate it."""
    report = generated / "report.md"
    if not report.is_file():
        return (
            '!!! note "Not generated in this build"\n'
            "    This build of the site does not include a reproduction report. Generate it\n"
            "    with `python docs/gen_results.py` (runs `noetherflow reproduce all --quick`,\n"
            "    about 6 minutes on 2 cores) or `python docs/gen_results.py --from results`\n"
            "    (an existing full run), then rebuild.\n"
        )
    # in a block of its own, so docs/stylesheets/report.css can wrap its long table cells
    body = report.read_text(encoding="utf-8")
    return f'<div class="nf-report" markdown="1">\n\n{body}\n\n</div>\n'


def on_config(config: Any, **_: Any) -> Any:
    from mkdocs.exceptions import PluginError

    problems = api_problems()
    if problems:
        raise PluginError("API reference check failed:\n  " + "\n  ".join(problems))
    return config


MATHJAX_URI = "javascripts/mathjax/tex-svg.js"


def mathjax_bundle() -> Path:
    """The installed MathJax 3 ``tex-svg-full.js``: one file, fonts and all TeX extensions."""
    import mathjax  # the django-static-mathjax package: MathJax's own files, nothing else

    path = Path(mathjax.__file__).parent / "static" / "mathjax" / "es5" / "tex-svg-full.js"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing; reinstall the docs extra: pip install -e '.[docs]'"
        )
    return path


def on_files(files: Any, *, config: Any, **_: Any) -> Any:
    from mkdocs.structure.files import File

    files.append(File.generated(config, MATHJAX_URI, abs_src_path=str(mathjax_bundle())))
    return files


def on_page_markdown(markdown: str, *, page: Any, **_: Any) -> str:
    if page.file.src_uri == "reproduction/index.md":
        return markdown.replace(MARKER, report_markdown())
    return markdown
