"""The reproduction report: ``report.md``, a self-contained ``report.html`` and a rich table.

Everything is rendered from the metrics dicts written by the harness (``<dir>/<id>/metrics.json``),
so a report can be regenerated from a results directory at any time (``noetherflow report DIR``).
One structure (:mod:`~noetherflow.report.view`) rendered by two Jinja2 templates
(``templates/report.md.j2`` and ``templates/report.html.j2``, package data):

1. a banner when any experiment ran with ``--quick`` (sizes are reduced; not the paper's
   protocol);
2. the headline, claims counted per kind (the paper's results, formulas as printed, ours);
3. the environment (package versions, platform, seed, wall and CPU time);
4. a summary table, experiments in the paper's order (``PAPER_ORDER``; those without it last,
   then by id), claims holding per kind;
5. every failing claim, grouped by kind, with its ``why``, and every experiment error;
6. "Corrections to the paper", rendered from
   :data:`noetherflow.experiments.corrections.CORRECTIONS`: the paper's text, the corrected
   statement, a two-line derivation and the measured checks (the claims' values of this run);
7. per experiment: the paper's statement, the setup table (every deviation from the paper), the
   claims, the figure(s), the notes (settings tried and what they gave), the config.

Trust: metrics.json is data, never markup or a path to follow blindly. Every value is escaped
by the template environment (HTML: Jinja's autoescaping; Markdown: see
:mod:`~noetherflow.report.render`), and a figure is read only if it is a PNG inside the results
directory: a path that is absolute, contains ``..`` or resolves outside the directory (also
through the ``experiment`` field or a symbolic link) is refused and shown as an error, never
read (:mod:`~noetherflow.report.records`).
"""

from __future__ import annotations

from noetherflow.report.records import (
    FAILS,
    HOLDS,
    QUICK_BANNER,
    ReportInputError,
    figure_path,
    fmt_value,
    load_records,
    order_records,
)
from noetherflow.report.render import (
    md_escape,
    render_html,
    render_markdown,
    summary_table,
    write_report,
)

__all__ = [
    "FAILS",
    "HOLDS",
    "QUICK_BANNER",
    "ReportInputError",
    "figure_path",
    "fmt_value",
    "load_records",
    "md_escape",
    "order_records",
    "render_html",
    "render_markdown",
    "summary_table",
    "write_report",
]
