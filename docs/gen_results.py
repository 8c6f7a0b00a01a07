"""Generate the Results page from a reproduction run.

    python docs/gen_results.py                    # runs `noetherflow reproduce all --quick`
    python docs/gen_results.py --from results     # an existing run (e.g. the full one)
    python docs/gen_results.py --ids fig1 fig2    # only some experiments (quick)
    mkdocs build --strict                         # the Results page now shows the report

The run's ``report.md`` (every claim with its measured value and threshold, every figure) and
its PNG figures are copied to ``docs/reproduction/_generated/`` (git-ignored), with the
figure links rewritten and the headings moved one level down; the ``docs/hooks.py`` hook puts
the report into ``reproduction/index.md`` at build time. The reproduction itself is never run
by ``mkdocs build``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
DEFAULT_DEST = DOCS / "reproduction" / "_generated"
_IMAGE = re.compile(r"\]\((?!https?://|#)([^)\s]+\.png)\)")
_HEADING = re.compile(r"^(#{1,5}) ", re.MULTILINE)


def convert(report_md: str, prefix: str = "_generated/") -> str:
    """The report as a section of the Results page: no H1, headings one level down."""
    lines = report_md.splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    text = "\n".join(lines).lstrip("\n") + "\n"
    text = _HEADING.sub(lambda m: "#" + m.group(1) + " ", text)
    return _IMAGE.sub(lambda m: f"]({prefix}{m.group(1)})", text)


def copy_run(run_dir: Path, dest: Path = DEFAULT_DEST) -> list[Path]:
    """Copy ``run_dir/report.md`` (converted) and every ``run_dir/<id>/*.png`` into ``dest``."""
    report = run_dir / "report.md"
    if not report.is_file():
        raise FileNotFoundError(
            f"no report.md in {run_dir}; run `noetherflow reproduce all --out {run_dir}` first"
        )
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    written = []
    for png in sorted(run_dir.glob("*/*.png")):
        target = dest / png.parent.name / png.name
        target.parent.mkdir(exist_ok=True)
        shutil.copyfile(png, target)
        written.append(target)
    (dest / "report.md").write_text(convert(report.read_text(encoding="utf-8")), encoding="utf-8")
    return [dest / "report.md", *written]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="src", type=Path, help="an existing reproduction run")
    ap.add_argument("--ids", nargs="+", default=["all"], help="experiments to run (quick)")
    ap.add_argument(
        "--run-dir",
        type=Path,
        default=Path("results/docs-quick"),
        help="where the quick run writes (default: results/docs-quick)",
    )
    ap.add_argument("--dest", type=Path, default=DEFAULT_DEST, help=argparse.SUPPRESS)
    ap.add_argument("--jobs", type=int, default=1)
    args = ap.parse_args(argv)
    run_dir = args.src
    if run_dir is None:
        run_dir = args.run_dir
        cmd = [
            sys.executable,
            "-m",
            "noetherflow.cli",
            "reproduce",
            *args.ids,
            "--quick",
            "--out",
            str(run_dir),
            "--jobs",
            str(args.jobs),
        ]
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    files = copy_run(run_dir, args.dest)
    print(f"wrote {len(files)} files to {args.dest}; now run `mkdocs build --strict`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
