"""Command line interface: ``noetherflow <subcommand> ...``.

Subcommands (one ``_add_<name>`` parser builder + one ``cmd_<name>(args) -> int`` each;
add a new one by writing both and appending the builder to :data:`SUBCOMMANDS`):

``list``
    experiment ids with one-line descriptions.
``reproduce <id>... | all [--quick] [--out DIR] [--seed N] [--jobs N] [--strict]``
    run experiments; writes ``DIR/<id>/metrics.json`` + figures, ``DIR/report.md`` and a
    self-contained ``DIR/report.html``, and prints a summary table.
``report DIR``
    re-render report.md / report.html from the metrics.json files in DIR.

Exit codes (:class:`ExitCode`): 0 success (failing claims are reported, not gating);
1 a claim failed under ``--strict``; 2 usage error; 3 an experiment raised (recorded in
its metrics.json and in the report, the other experiments still ran).
"""

from __future__ import annotations

import argparse
import enum
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

__all__ = [
    "SUBCOMMANDS",
    "ExitCode",
    "build_inspect_parser",
    "build_parser",
    "inspect_main",
    "main",
]


class ExitCode(enum.IntEnum):
    OK = 0
    CLAIMS_FAILED = 1
    USAGE = 2
    EXPERIMENT_ERROR = 3
    INTERRUPTED = 130


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer; expected e.g. 4") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not >= 1; pass a positive count, e.g. 1 or 4")
    return value


def _console(*, stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def _usage_error(command: str, message: str) -> int:
    print(f"noetherflow {command}: error: {message}", file=sys.stderr)
    return ExitCode.USAGE


# --------------------------------------------------------------------------------------
# list
# --------------------------------------------------------------------------------------


def _add_list(sub: Any) -> None:
    p = sub.add_parser("list", help="list experiment ids with one-line descriptions")
    p.set_defaults(func=cmd_list)


def cmd_list(args: argparse.Namespace) -> int:
    from rich.table import Table

    from noetherflow.experiments import registry

    table = Table(title="noetherflow experiments", show_lines=False)
    table.add_column("id", style="bold")
    table.add_column("description")
    for exp_id in registry.experiment_ids():
        try:
            desc = registry.describe(exp_id)
        except Exception as exc:  # a broken module must not hide the others
            desc = f"[red]cannot import: {type(exc).__name__}: {exc}[/red]"
        table.add_row(exp_id, desc)
    _console().print(table)
    return ExitCode.OK


# --------------------------------------------------------------------------------------
# reproduce
# --------------------------------------------------------------------------------------


def _add_reproduce(sub: Any) -> None:
    p = sub.add_parser(
        "reproduce",
        help="run experiments and write metrics, figures and a report",
        description="Run experiments (figures of the paper) and write DIR/<id>/metrics.json, "
        "figures, DIR/report.md and DIR/report.html. Failing claims are reported, not gating "
        "(unless --strict).",
    )
    p.add_argument("ids", nargs="+", metavar="ID", help="experiment id(s), or 'all'")
    p.add_argument("--quick", action="store_true", help="shrunk sizes (each Config.quick())")
    p.add_argument(
        "--out", type=Path, default=Path("results"), help="output directory (default: results)"
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    p.add_argument(
        "--jobs",
        type=_positive_int,
        default=1,
        help="worker processes for experiments and for sweeps inside them (default: 1)",
    )
    p.add_argument(
        "--torch-threads",
        type=_positive_int,
        default=1,
        help="torch intra-op threads per experiment/worker; fixed (default 1) so that results "
        "do not depend on --jobs",
    )
    p.add_argument(
        "--mnist",
        metavar="DIR",
        type=Path,
        default=None,
        help="directory with MNIST's IDX files (train-images-idx3-ubyte, "
        "train-labels-idx1-ubyte, optionally .gz); image experiments (fig5) use it instead of "
        "scikit-learn's bundled 8x8 digits",
    )
    p.add_argument("--strict", action="store_true", help="exit 1 if any claim fails")
    p.set_defaults(func=cmd_reproduce)


def cmd_reproduce(args: argparse.Namespace) -> int:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    from noetherflow import report
    from noetherflow.experiments import registry, run_experiments

    try:
        ids = registry.resolve_ids(args.ids)
    except registry.UnknownExperimentError as exc:
        return _usage_error("reproduce", str(exc))
    specs = [(i, registry.target(i)) for i in ids]
    if args.mnist is not None and not args.mnist.is_dir():
        return _usage_error(
            "reproduce", f"--mnist {args.mnist}: not a directory; expected MNIST's IDX files there"
        )
    overrides = {"mnist_dir": str(args.mnist)} if args.mnist is not None else None
    out = Path(args.out)
    console = _console()
    err_console = _console(stderr=True)
    t0 = time.perf_counter()

    with Progress(
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=False,
    ) as progress:
        overall = progress.add_task(
            f"reproduce ({'quick' if args.quick else 'full'})", total=len(specs)
        )

        def on_start(exp_id: str) -> None:
            progress.update(overall, description=f"running {exp_id}")

        def on_done(exp_id: str, rec: dict[str, Any]) -> None:
            held = sum(bool(c.get("holds")) for c in rec.get("claims", []))
            total = len(rec.get("claims", []))
            if rec.get("error"):
                err = rec["error"]
                msg = f"[red]✗ {exp_id}: error in {err.get('stage')}: {err.get('type')}[/red]"
            else:
                colour = "green" if held == total else "yellow"
                msg = f"[{colour}]{exp_id}: {held}/{total} claims hold[/{colour}]"
            progress.console.print(f"{msg} ({rec.get('elapsed_s', 0):.1f} s)")
            progress.advance(overall)

        records = run_experiments(
            specs,
            quick=args.quick,
            seed=args.seed,
            out_dir=out,
            jobs=args.jobs,
            torch_threads=args.torch_threads,
            on_start=on_start,
            on_done=on_done,
            overrides=overrides,
        )
        progress.update(overall, description="done")

    md, page = report.write_report(records, out)
    console.print(report.summary_table(records))
    console.print(f"report: {md}  ·  {page}  ·  total {time.perf_counter() - t0:.1f} s")
    return _exit_code(records, strict=args.strict)


def _exit_code(records: Sequence[dict[str, Any]], *, strict: bool) -> int:
    if any(r.get("error") for r in records):
        return ExitCode.EXPERIMENT_ERROR
    if strict and any(not c.get("holds") for r in records for c in r.get("claims", [])):
        return ExitCode.CLAIMS_FAILED
    return ExitCode.OK


# --------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------


def _add_report(sub: Any) -> None:
    p = sub.add_parser("report", help="re-render report.md/report.html from DIR/*/metrics.json")
    p.add_argument("out", type=Path, metavar="DIR", help="results directory of `reproduce`")
    p.add_argument("--strict", action="store_true", help="exit 1 if any claim fails")
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from noetherflow import report

    try:
        records = report.load_records(args.out)
    except FileNotFoundError as exc:
        return _usage_error("report", str(exc))
    md, page = report.write_report(records, args.out)
    console = _console()
    console.print(report.summary_table(records))
    console.print(f"report: {md}  ·  {page}")
    return _exit_code(records, strict=args.strict)


# --------------------------------------------------------------------------------------
# inspect
# --------------------------------------------------------------------------------------


def _add_inspect(sub: Any) -> None:
    p = sub.add_parser(
        "inspect",
        help="find and verify the symmetries of a model built by FILE.py:factory",
        add_help=False,
    )
    p.add_argument("inspect_argv", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_inspect)


def cmd_inspect(args: argparse.Namespace) -> int:
    return inspect_main(args.inspect_argv)


def _load_factory(spec: str) -> Callable[[], nn.Module]:
    import importlib.util

    path_s, sep, func = spec.rpartition(":")
    if not sep or not path_s or not func:
        raise ValueError(
            f"model spec {spec!r} is not of the form path/to/file.py:factory; expected e.g. "
            "models.py:make_net"
        )
    path = Path(path_s)
    if not path.is_file():
        raise ValueError(f"model file {path_s!r} does not exist; expected a Python file.")
    mod_spec = importlib.util.spec_from_file_location(f"_nf_inspect_{path.stem}", path)
    if mod_spec is None or mod_spec.loader is None:
        raise ValueError(f"cannot import {path_s!r} as a Python module.")
    module = importlib.util.module_from_spec(mod_spec)
    sys.path.insert(0, str(path.resolve().parent))
    try:
        mod_spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    factory = getattr(module, func, None)
    if not callable(factory):
        raise ValueError(
            f"{path_s} has no callable {func!r}; expected a function returning an nn.Module."
        )
    return factory


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of integers; expected e.g. 3,32,32"
        ) from None
    if not dims or any(d < 1 for d in dims):
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive sizes, e.g. 3,32,32")
    return dims


def build_inspect_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The arguments of ``noetherflow inspect`` (added to ``parser`` when given)."""
    p = parser or argparse.ArgumentParser(
        prog="noetherflow inspect",
        description="Detect, verify and print the symmetries of a model built by a factory.",
    )
    p.add_argument("model", help="path/to/file.py:factory (a function returning an nn.Module)")
    p.add_argument(
        "--input-shape",
        type=_shape,
        required=True,
        help="shape of one input sample without the batch axis, e.g. 3,32,32",
    )
    p.add_argument("--batch-size", type=int, default=4, help="example batch size (default 4)")
    p.add_argument("--eval", action="store_true", help="inspect in eval mode (default: train)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print syms.to_dict() and coverage as JSON")
    return p


def inspect_main(argv: list[str]) -> int:
    """``noetherflow inspect path/to/file.py:factory --input-shape 3,32,32``.

    Prints the symmetry table and the coverage report. Exit codes: 0 success, 2 usage error
    (bad spec, bad shape, model does not run on the inputs).
    """
    import json
    import warnings

    import torch
    from rich.console import Console
    from torch import nn

    from noetherflow.symmetry.detect import find_symmetries

    args = build_inspect_parser().parse_args(argv)
    err = Console(stderr=True, highlight=False)
    try:
        model = _load_factory(args.model)()
        if not isinstance(model, nn.Module):
            raise ValueError(
                f"{args.model} returned a {type(model).__name__}; expected an nn.Module."
            )
        model.train(not args.eval)
        gen = torch.Generator().manual_seed(args.seed)
        dtype = next((p.dtype for p in model.parameters()), torch.float32)
        x = torch.randn(args.batch_size, *args.input_shape, generator=gen, dtype=dtype)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            syms = find_symmetries(model, x, seed=args.seed)
        for w in caught:
            err.print(f"warning: {w.message}")
        report = syms.coverage(model)
    except (ValueError, OSError) as exc:
        err.print(f"noetherflow inspect: error: {exc}")
        return 2
    if args.json:
        print(json.dumps({"symmetries": syms.to_dict(), "coverage": report.to_dict()}, indent=2))
        return 0
    out = Console(highlight=False)
    out.print(syms.table())
    out.print(report.table())
    if report.unsupported_modules:
        out.print("unsupported modules:")
        for k, v in report.unsupported_modules.items():
            out.print(f"  {k}: {v}")
    for n in report.notes:
        out.print(f"note: {n}")
    return 0


# --------------------------------------------------------------------------------------
# demo
# --------------------------------------------------------------------------------------


def _add_demo(sub: Any) -> None:
    p = sub.add_parser(
        "demo", help="charges, flows, equilibrium and teleport of a small ReLU net on digits"
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from noetherflow.demo import run_demo

    res = run_demo(seed=args.seed, console=_console())
    ok = res["flow_after"] <= 1e-8 * res["flow_before"] and res["output_change"] <= 1e-10
    return ExitCode.OK if ok else 1


# --------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------

#: Parser builders, one per subcommand; each registers ``func=cmd_<name>`` via set_defaults.
SUBCOMMANDS: list[Callable[[Any], None]] = [
    _add_list,
    _add_reproduce,
    _add_report,
    _add_inspect,
    _add_demo,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="noetherflow",
        description="Parameter symmetries, Noether charges and the noise equilibrium of SGD.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``noetherflow`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return int(func(args))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
