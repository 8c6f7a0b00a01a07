"""Command line interface: ``noetherflow <subcommand> ...`` (also ``python -m noetherflow``).

Subcommands (one ``_add_<name>`` parser builder + one ``cmd_<name>(args) -> ExitCode`` each;
add a new one by writing both and appending the builder to :data:`SUBCOMMANDS`):

``list``
    experiment ids with one-line descriptions.
``reproduce <id>... | all [--quick] [--out DIR] [--seed N] [--jobs N] [--strict]``
    run experiments; writes ``DIR/<id>/metrics.json`` + figures, ``DIR/report.md`` and a
    self-contained ``DIR/report.html``, and prints a summary table.
``report DIR``
    re-render report.md / report.html from the metrics.json files in DIR.
``inspect FILE.py:factory --input-shape ...``
    import FILE.py (this runs its code), call the factory and print the model's symmetries.
``demo``
    charges, flows, equilibrium and teleport of a small ReLU net on digits.

Exit codes (:class:`ExitCode`): 0 success (failing claims are reported, not gating); 1 a claim
(or the demo's check) failed under ``--strict``; 2 usage error (bad id, path, value or file: a
one-line message naming the value, what was expected and the fix; ``--debug`` adds the
traceback; also a full disk, a read-only or non-writable directory and a permission error,
naming the path); 3 an experiment raised (recorded in its metrics.json and in the report, the other
experiments still ran); 4 an internal error of noetherflow (a bug: please report it with the
``--debug`` traceback); 130 interrupted.
"""

from __future__ import annotations

import argparse
import enum
import math
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from noetherflow._cli_errors import environment_error, os_error_message

if TYPE_CHECKING:
    from torch import nn

__all__ = [
    "SUBCOMMANDS",
    "ExitCode",
    "UsageError",
    "build_inspect_parser",
    "build_parser",
    "inspect_main",
    "main",
]

#: Largest accepted ``--seed`` (seeds are passed to numpy and torch generators).
MAX_SEED = 2**32 - 1
#: Largest example batch of ``inspect`` (entries), far above what detection needs.
MAX_EXAMPLE_ELEMENTS = 2**27


class ExitCode(enum.IntEnum):
    """Exit status of ``noetherflow`` (see the module docstring)."""

    OK = 0
    CLAIMS_FAILED = 1
    USAGE = 2
    EXPERIMENT_ERROR = 3
    INTERNAL_ERROR = 4
    INTERRUPTED = 130


class UsageError(Exception):
    """A user's mistake: reported as one line, exit code 2, no traceback (unless --debug)."""


# --------------------------------------------------------------------------------------
# argument types (checked at parse time: a value that would fail every experiment is refused)
# --------------------------------------------------------------------------------------


def _int_in(text: str, lo: int, hi: int | None, example: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an integer; expected e.g. {example}"
        ) from None
    if value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"between {lo} and {hi}"
        raise argparse.ArgumentTypeError(f"{value} is not {bound}; pass e.g. {example}")
    return value


def _positive_int(text: str) -> int:
    return _int_in(text, 1, None, "1 or 4")


def _seed(text: str) -> int:
    return _int_in(text, 0, MAX_SEED, "0 or 42")


def _dir_arg(text: str) -> Path:
    if not text.strip() or "\0" in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not a usable path; pass a directory path")
    return Path(text)


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


class _VersionAction(argparse.Action):
    """``--version``: print the installed version (imported only when asked)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.update(nargs=0, default=argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        from noetherflow import __version__

        print(f"noetherflow {__version__}")
        parser.exit(ExitCode.OK)


def _common() -> argparse.ArgumentParser:
    """Options every subcommand accepts (after the subcommand, as users type them)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show the Python traceback of an error",
    )
    return p


def _console(*, stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


# --------------------------------------------------------------------------------------
# list
# --------------------------------------------------------------------------------------


def _add_list(sub: Any) -> None:
    p = sub.add_parser(
        "list", parents=[_common()], help="list experiment ids with one-line descriptions"
    )
    p.set_defaults(func=cmd_list)


def cmd_list(args: argparse.Namespace) -> ExitCode:
    from rich.markup import escape
    from rich.table import Table

    from noetherflow.experiments import registry

    table = Table(title="noetherflow experiments", show_lines=False)
    table.add_column("id", style="bold")
    table.add_column("description")
    for exp_id in registry.experiment_ids():
        try:
            desc = escape(registry.describe(exp_id))
        except Exception as exc:  # a broken module must not hide the others
            desc = f"[red]cannot import: {escape(f'{type(exc).__name__}: {exc}')}[/red]"
        table.add_row(escape(exp_id), desc)
    _console().print(table)
    return ExitCode.OK


# --------------------------------------------------------------------------------------
# reproduce
# --------------------------------------------------------------------------------------


def _add_reproduce(sub: Any) -> None:
    p = sub.add_parser(
        "reproduce",
        parents=[_common()],
        help="run experiments and write metrics, figures and a report",
        description="Run experiments (figures of the paper) and write DIR/<id>/metrics.json, "
        "figures, DIR/report.md and DIR/report.html. Failing claims are reported, not gating "
        "(unless --strict). Exit codes: 0 ok, 1 a claim failed under --strict, 2 usage error, "
        "3 an experiment raised.",
    )
    p.add_argument("ids", nargs="+", metavar="ID", help="experiment id(s), or 'all'")
    p.add_argument("--quick", action="store_true", help="shrunk sizes (each Config.quick())")
    p.add_argument(
        "--out", type=_dir_arg, default=Path("results"), help="output directory (default: results)"
    )
    p.add_argument("--seed", type=_seed, default=0, help=f"random seed, 0..{MAX_SEED} (default 0)")
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


def _output_dir(out: Path, flag: str) -> Path:
    if "\0" in str(out):
        raise UsageError(f"{flag} {str(out)!r}: not a usable path; pass a directory path")
    if out.exists() and not out.is_dir():
        raise UsageError(f"{flag} {out}: exists and is not a directory; pass a directory path")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"{flag} {out}: cannot create the directory ({exc.strerror or exc}); "
            "pass a writable directory"
        ) from exc
    try:  # before any experiment runs: a read-only or non-writable directory fails now
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as exc:
        raise UsageError(os_error_message(exc, out, flag)) from exc
    return out


def cmd_reproduce(args: argparse.Namespace) -> ExitCode:
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
        raise UsageError(str(exc)) from exc
    specs = [(i, registry.target(i)) for i in ids]
    if args.mnist is not None and not args.mnist.is_dir():
        raise UsageError(f"--mnist {args.mnist}: not a directory; expected MNIST's IDX files there")
    overrides = {"mnist_dir": str(args.mnist)} if args.mnist is not None else None
    out = _output_dir(Path(args.out), "--out")
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
            from rich.markup import escape

            held = sum(bool(c.get("holds")) for c in rec.get("claims", []))
            total = len(rec.get("claims", []))
            if rec.get("error"):
                err = rec["error"]
                text = escape(f"✗ {exp_id}: error in {err.get('stage')}: {err.get('type')}")
                msg = f"[red]{text}[/red]"
            else:
                colour = "green" if held == total else "yellow"
                msg = f"[{colour}]{escape(exp_id)}: {held}/{total} claims hold[/{colour}]"
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


def _exit_code(records: Sequence[dict[str, Any]], *, strict: bool) -> ExitCode:
    # the report's own reading of the records: the summary, the failing list and the exit
    # code cannot disagree (a malformed "claims" or "holds" is refused when loading)
    from noetherflow.report.records import failing, status_of

    if any(status_of(r) == "error" for r in records):
        return ExitCode.EXPERIMENT_ERROR
    if strict and failing(records):
        return ExitCode.CLAIMS_FAILED
    return ExitCode.OK


# --------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------


def _add_report(sub: Any) -> None:
    p = sub.add_parser(
        "report",
        parents=[_common()],
        help="re-render report.md/report.html from DIR/*/metrics.json",
        description="Re-render DIR/report.md and DIR/report.html from DIR/<id>/metrics.json. "
        "Only files inside DIR are read; figures outside it are refused.",
    )
    p.add_argument("out", type=Path, metavar="DIR", help="results directory of `reproduce`")
    p.add_argument("--strict", action="store_true", help="exit 1 if any claim fails")
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> ExitCode:
    from noetherflow import report

    try:
        records = report.load_records(args.out)
        md, page = report.write_report(records, args.out)
    except (FileNotFoundError, report.ReportInputError) as exc:
        raise UsageError(str(exc)) from exc
    except OSError as exc:
        raise UsageError(os_error_message(exc, args.out, "DIR")) from exc
    console = _console()
    console.print(report.summary_table(records))
    console.print(f"report: {md}  ·  {page}")
    return _exit_code(records, strict=args.strict)


# --------------------------------------------------------------------------------------
# inspect
# --------------------------------------------------------------------------------------

_INSPECT_NOTE = (
    "inspect imports FILE.py (running its top-level code) and calls the factory; run it only "
    "on files you trust."
)
_DTYPES = ("auto", "float32", "float64", "long", "int32")


def _add_inspect(sub: Any) -> None:
    p = sub.add_parser(
        "inspect",
        parents=[_common()],
        help="find and verify the symmetries of a model built by FILE.py:factory "
        "(imports and runs FILE.py)",
        description="Detect, verify and print the symmetries of a model built by a factory. "
        + _INSPECT_NOTE,
    )
    build_inspect_parser(p)
    p.set_defaults(func=cmd_inspect)


def build_inspect_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The arguments of ``noetherflow inspect`` (added to ``parser`` when given)."""
    p = parser or argparse.ArgumentParser(
        prog="noetherflow inspect",
        description="Detect, verify and print the symmetries of a model built by a factory. "
        + _INSPECT_NOTE,
        parents=[_common()],
    )
    p.add_argument(
        "model",
        help="path/to/file.py:factory (a function returning an nn.Module); the file is imported "
        "and its code runs",
    )
    p.add_argument(
        "--input-shape",
        type=_shape,
        required=True,
        help="shape of one input sample without the batch axis, e.g. 3,32,32 (images) or 16 "
        "(16 tokens, with --dtype long)",
    )
    p.add_argument(
        "--dtype",
        choices=_DTYPES,
        default="auto",
        help="input dtype: auto (the parameters' dtype, random normal inputs), float32, float64, "
        "or long/int32 for token ids (uniform in 0..--vocab-size−1), e.g. for nn.Embedding",
    )
    p.add_argument(
        "--vocab-size",
        type=_positive_int,
        default=None,
        help="token ids are drawn from 0..N−1 with --dtype long/int32 (default: the smallest "
        "num_embeddings of the model's nn.Embedding layers)",
    )
    p.add_argument(
        "--batch-size", type=_positive_int, default=4, help="example batch size (default 4)"
    )
    p.add_argument("--eval", action="store_true", help="inspect in eval mode (default: train)")
    p.add_argument("--seed", type=_seed, default=0, help="seed of the example inputs (default 0)")
    p.add_argument("--json", action="store_true", help="print syms.to_dict() and coverage as JSON")
    return p


def _load_factory(spec: str) -> Callable[[], nn.Module]:
    import importlib.util

    path_s, sep, func = spec.rpartition(":")
    if not sep or not path_s or not func:
        raise UsageError(
            f"model spec {spec!r} is not of the form path/to/file.py:factory; expected e.g. "
            "models.py:make_net"
        )
    path = Path(path_s)
    if not path.is_file():
        raise UsageError(
            f"model file {path_s!r} does not exist; expected a Python file, e.g. models.py:make"
        )
    mod_spec = importlib.util.spec_from_file_location(f"_nf_inspect_{path.stem}", path)
    if mod_spec is None or mod_spec.loader is None:
        raise UsageError(f"cannot import {path_s!r} as a Python module; expected a .py file")
    module = importlib.util.module_from_spec(mod_spec)
    sys.path.insert(0, str(path.resolve().parent))
    try:
        mod_spec.loader.exec_module(module)
    except Exception as exc:
        where = f" (line {exc.lineno})" if isinstance(exc, SyntaxError) and exc.lineno else ""
        raise UsageError(
            f"importing {path_s} raised {type(exc).__name__}{where}: {exc}; fix the file "
            "(--debug shows the traceback)"
        ) from exc
    finally:
        sys.path.pop(0)
    factory = getattr(module, func, None)
    if not callable(factory):
        raise UsageError(
            f"{path_s} has no callable {func!r}; expected a function returning an nn.Module"
        )
    return factory


def _example_inputs(args: argparse.Namespace, model: nn.Module) -> Any:
    import torch
    from torch import nn

    gen = torch.Generator().manual_seed(args.seed)
    shape = (args.batch_size, *args.input_shape)
    if math.prod(shape) > MAX_EXAMPLE_ELEMENTS:
        raise UsageError(
            f"an example batch of shape {shape} has {math.prod(shape):.3g} entries (at most "
            f"{MAX_EXAMPLE_ELEMENTS:.3g}); a small batch is enough to detect the symmetries: "
            "pass a smaller --input-shape or --batch-size"
        )
    if args.dtype in ("long", "int32"):
        vocab = args.vocab_size
        if vocab is None:
            sizes = [m.num_embeddings for m in model.modules() if isinstance(m, nn.Embedding)]
            if not sizes:
                raise UsageError(
                    f"--dtype {args.dtype} needs --vocab-size N (token ids are drawn from "
                    "0..N−1) and the model has no nn.Embedding to take it from; pass e.g. "
                    "--vocab-size 1000"
                )
            vocab = min(sizes)
        dtype = torch.long if args.dtype == "long" else torch.int32
        return torch.randint(0, vocab, shape, generator=gen, dtype=dtype)
    if args.dtype == "auto":
        floats = [p.dtype for p in model.parameters() if p.is_floating_point()]
        real = floats[0] if floats else torch.get_default_dtype()
    else:
        real = torch.float32 if args.dtype == "float32" else torch.float64
    return torch.randn(*shape, generator=gen, dtype=real)


def _embedding_hint(model: nn.Module, x: Any) -> str:
    from torch import nn

    embeddings = [
        f"{name} ({m.num_embeddings} tokens)"
        for name, m in model.named_modules()
        if isinstance(m, nn.Embedding)
    ]
    if not embeddings or not x.is_floating_point():
        return ""
    return (
        f" The model has nn.Embedding layers ({', '.join(embeddings)}), which take integer "
        "token ids, and the inputs were float: pass --dtype long (ids drawn from "
        "0..--vocab-size−1, by default the smallest num_embeddings)."
    )


def cmd_inspect(args: argparse.Namespace) -> ExitCode:
    import json
    import warnings

    from rich.console import Console
    from torch import nn

    from noetherflow.symmetry.detect import DetectionError, find_symmetries

    print(f"noetherflow inspect: importing and running {args.model}", file=sys.stderr)
    factory = _load_factory(args.model)
    try:
        model = factory()
    except Exception as exc:
        raise UsageError(
            f"{args.model}() raised {type(exc).__name__}: {exc}; fix the factory "
            "(--debug shows the traceback)"
        ) from exc
    if not isinstance(model, nn.Module):
        raise UsageError(f"{args.model} returned a {type(model).__name__}; expected an nn.Module")
    model.train(not args.eval)
    x = _example_inputs(args, model)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            syms = find_symmetries(model, x, seed=args.seed)
        report = syms.coverage(model)
    except (DetectionError, ValueError, OSError) as exc:
        hint = _embedding_hint(model, x)
        if not hint and isinstance(exc.__cause__, IndexError) and not x.is_floating_point():
            drawn = f"--vocab-size {args.vocab_size}" if args.vocab_size else "the default"
            raise UsageError(
                f"{exc} The ids were drawn from 0..{int(x.max())} or so ({drawn}): pass a "
                "--vocab-size no larger than the table they index."
            ) from exc
        if not hint:
            raise UsageError(str(exc)) from exc
        cause = exc.__cause__ or exc  # the model's own error, without detect's shape hints
        first = (str(cause).strip().splitlines() or [""])[0]
        raise UsageError(
            f"running {args.model}'s model on float inputs of shape {tuple(x.shape)} failed "
            f"({type(cause).__name__}: {first}).{hint}"
        ) from exc
    for w in caught:
        print(f"noetherflow inspect: warning: {w.message}", file=sys.stderr)
    if args.json:
        print(json.dumps({"symmetries": syms.to_dict(), "coverage": report.to_dict()}, indent=2))
        return ExitCode.OK
    out = Console(highlight=False)
    out.print(syms.table())
    out.print(report.table())
    if report.unsupported_modules:
        out.print("unsupported modules:")
        for k, v in report.unsupported_modules.items():
            out.print(f"  {k}: {v}")
    for n in report.notes:
        out.print(f"note: {n}")
    return ExitCode.OK


def inspect_main(argv: list[str]) -> int:
    """``noetherflow inspect path/to/file.py:factory --input-shape 3,32,32`` as a function.

    Prints the symmetry table and the coverage report; returns the exit code (0 success,
    2 usage error: bad spec, bad shape, model does not run on the inputs).
    """
    return _run(build_inspect_parser(), argv, "inspect")


# --------------------------------------------------------------------------------------
# demo
# --------------------------------------------------------------------------------------


def _add_demo(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        parents=[_common()],
        help="charges, flows, equilibrium and teleport of a small ReLU net on digits",
        description="Charges, flows, equilibrium and teleport of a small ReLU net on digits. "
        "Exit code 1 if the teleport does not remove the flows or changes the outputs.",
    )
    p.add_argument("--seed", type=_seed, default=0, help="random seed (default 0)")
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> ExitCode:
    from noetherflow.demo import run_demo

    res = run_demo(seed=args.seed, console=_console())
    ok = res["flow_after"] <= 1e-8 * res["flow_before"] and res["output_change"] <= 1e-10
    return ExitCode.OK if ok else ExitCode.CLAIMS_FAILED


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
    """The ``noetherflow`` argument parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="noetherflow",
        description="Parameter symmetries, Noether charges and the noise equilibrium of SGD.",
        epilog="Exit codes: 0 ok, 1 a claim failed under --strict, 2 usage error, "
        "3 an experiment raised, 4 internal error. `noetherflow COMMAND --help` for each command.",
        parents=[_common()],
    )
    parser.add_argument("--version", action=_VersionAction, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def _one_line(exc: object) -> str:
    return " ".join(str(exc).split())


def _out_of(args: argparse.Namespace) -> str | None:
    out = getattr(args, "out", None)
    return None if out is None else str(out)


def _run(parser: argparse.ArgumentParser, argv: Sequence[str] | None, name: str) -> int:
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help / --version (0) or a parse error (2, message printed)
        code = exc.code
        return code if isinstance(code, int) else ExitCode.USAGE
    func: Callable[[argparse.Namespace], int] = getattr(args, "func", cmd_inspect)
    debug = bool(getattr(args, "debug", False))
    command = f"noetherflow {getattr(args, 'command', None) or name}"
    try:
        return int(func(args))
    except KeyboardInterrupt:
        print(f"{command}: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except (UsageError, OSError, MemoryError) as exc:  # the environment is not a bug
        if debug:
            traceback.print_exc()
        text = exc if isinstance(exc, UsageError) else environment_error(exc, _out_of(args))
        print(f"{command}: error: {_one_line(text)}", file=sys.stderr)
        return ExitCode.USAGE
    except Exception as exc:
        if debug:
            traceback.print_exc()
        print(
            f"{command}: internal error: {type(exc).__name__}: {_one_line(exc)} (a bug in "
            "noetherflow: "
            "rerun with --debug and report the traceback)",
            file=sys.stderr,
        )
        return ExitCode.INTERNAL_ERROR


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``noetherflow`` console script; returns the exit code."""
    return _run(build_parser(), argv, "")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
