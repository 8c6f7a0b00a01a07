"""Coverage: which symmetries act on every trainable parameter, or why none does.

Returned by :meth:`SymmetrySet.coverage`. For a set found by
:func:`noetherflow.find_symmetries` the reasons come from the detection (a residual add, a
non-homogeneous activation, weight tying, BatchNorm in eval mode, an unsupported module, an
approximate symmetry with its measured error); for a hand-built set a parameter without a
symmetry is simply reported as not declared.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from noetherflow.symmetry.base import Symmetry

if TYPE_CHECKING:
    from noetherflow.symmetry.set import SymmetrySet

__all__ = ["CoverageReport", "CoverageStatus", "DetectionReport", "ParamCoverage"]


class CoverageStatus(str, Enum):
    """How a parameter is covered."""

    COVERED = "covered"  # every coordinate is acted on by some symmetry
    PARTIAL = "partial"  # some coordinates are
    APPROXIMATE = "approximate"  # only an approximate symmetry (e.g. through tanh) acts on it
    NONE = "none"
    FROZEN = "frozen"  # requires_grad=False: SGD does not move it


@dataclass
class DetectionReport:
    """What :func:`find_symmetries` learnt besides the symmetries themselves.

    ``reasons`` and ``approximate`` are keyed by ``id(parameter)``.
    """

    traced: bool
    complete: bool
    tolerance: float
    scale: float
    notes: list[str] = field(default_factory=list)
    reasons: dict[int, list[str]] = field(default_factory=dict)
    approximate: dict[int, list[str]] = field(default_factory=dict)
    unsupported: dict[str, str] = field(default_factory=dict)
    rejected: list[tuple[str, str]] = field(default_factory=list)
    sym_notes: dict[str, str] = field(default_factory=dict)
    #: a layer's weight applied by a matmul in another module's forward (Mamba's
    #: ``dt_proj.weight``), keyed by ``id(weight)``: the qualified name of that module, where
    #: ``estimator='hooks'`` reads the product's input and output-gradient
    matmul_reads: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ParamCoverage:
    """Coverage of one trainable (or frozen) parameter."""

    name: str
    shape: tuple[int, ...]
    status: CoverageStatus
    symmetries: tuple[str, ...]
    fraction: float  # share of coordinates acted on by some symmetry
    reasons: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict."""
        return {
            "name": self.name,
            "shape": list(self.shape),
            "status": self.status.value,
            "symmetries": list(self.symmetries),
            "fraction": self.fraction,
            "reasons": list(self.reasons),
        }


@dataclass
class CoverageReport:
    """Every parameter of a model: the symmetries acting on it, or none and why."""

    params: list[ParamCoverage]
    unsupported_modules: dict[str, str]
    complete: bool
    notes: list[str]

    def __getitem__(self, name: str) -> ParamCoverage:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(
            f"no parameter named {name!r} in the coverage report; names are those of "
            f"model.named_parameters(), e.g. {[p.name for p in self.params[:3]]}"
        )

    def uncovered(self) -> list[ParamCoverage]:
        """Trainable parameters that no exact symmetry acts on."""
        return [
            p for p in self.params if p.status in (CoverageStatus.NONE, CoverageStatus.APPROXIMATE)
        ]

    def to_dict(self) -> dict[str, Any]:
        """The report as a JSON-ready dict."""
        return {
            "complete": self.complete,
            "notes": list(self.notes),
            "unsupported_modules": dict(self.unsupported_modules),
            "params": [p.to_dict() for p in self.params],
        }

    def table(self) -> Any:
        """A rich Table: parameter, shape, status, symmetries, reasons."""
        from rich.table import Table

        title = "coverage" + ("" if self.complete else " (may be incomplete)")
        t = Table(title=title)
        for col in ("parameter", "shape", "status", "symmetries", "why"):
            t.add_column(col)
        for p in self.params:
            cov = "" if p.fraction in (0.0, 1.0) else f" ({p.fraction:.0%})"
            t.add_row(
                p.name,
                "×".join(map(str, p.shape)) or "scalar",
                p.status.value + cov,
                ", ".join(p.symmetries) or "—",
                "; ".join(p.reasons),
            )
        return t

    def __str__(self) -> str:
        lines = [_render(self.table())]
        if self.unsupported_modules:
            lines.append("unsupported modules:")
            lines += [f"  {k}: {v}" for k, v in self.unsupported_modules.items()]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def _render(renderable: Any) -> str:
    from rich.console import Console

    console = Console(width=160, record=True, color_system=None, file=io.StringIO())
    console.print(renderable)
    return console.export_text().rstrip()


def covered_mask(sym: Symmetry, p: Tensor) -> Tensor | None:
    """Boolean mask of the coordinates of ``p`` that ``sym`` acts on (None if it does not)."""
    if not any(q is p for q in sym.params):
        return None
    return sym.covered_mask(p).cpu()


def _default_reason(model: nn.Module, name: str) -> str:
    owner_name = name.rsplit(".", 1)[0] if "." in name else ""
    owner = model.get_submodule(owner_name) if owner_name else model
    kind = type(owner).__name__
    norms = (
        nn.modules.batchnorm._BatchNorm,
        nn.modules.instancenorm._InstanceNorm,
        nn.LayerNorm,
        nn.GroupNorm,
        nn.RMSNorm,
    )
    if isinstance(owner, norms):
        return (
            f"affine parameters of {kind} {owner_name}: no pattern (their rescaling with the "
            "next layer is not representable by Rescaling, which takes Linear/Conv layers)"
        )
    return f"no symmetry pattern matched this parameter of {kind} {owner_name or '(root)'}"


def build_coverage(
    syms: SymmetrySet, model: nn.Module, detection: DetectionReport | None
) -> CoverageReport:
    """The coverage report of ``syms`` on ``model`` (see :meth:`SymmetrySet.coverage`)."""
    aliases: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(n)
    rows: list[ParamCoverage] = []
    for name, p in model.named_parameters():
        acting: list[str] = []
        mask = torch.zeros(p.shape, dtype=torch.bool)
        for sname, s in syms.items():
            m = covered_mask(s, p)
            if m is not None:
                acting.append(sname)
                mask |= m
        frac = float(mask.float().mean()) if p.numel() else 0.0
        reasons: list[str] = []
        if len(aliases[id(p)]) > 1:
            reasons.append(f"tied: also named {', '.join(aliases[id(p)][1:])}")
        approx = detection.approximate.get(id(p), []) if detection else []
        if not p.requires_grad:
            status = CoverageStatus.FROZEN
            reasons.append("frozen (requires_grad=False): not trained, not analysed")
        elif acting and frac >= 1.0:
            status = CoverageStatus.COVERED
            if detection:
                reasons += [detection.sym_notes[s] for s in acting if detection.sym_notes.get(s)]
        elif acting:
            status = CoverageStatus.PARTIAL
            if detection:
                reasons += [detection.sym_notes[s] for s in acting if detection.sym_notes.get(s)]
                reasons += detection.reasons.get(id(p), [])
        elif approx:
            status = CoverageStatus.APPROXIMATE
            reasons += approx
            reasons += detection.reasons.get(id(p), []) if detection else []
        else:
            status = CoverageStatus.NONE
            if detection is None:
                reasons.append("no symmetry in this set acts on it (find_symmetries detects them)")
            else:
                reasons += detection.reasons.get(id(p), []) or [_default_reason(model, name)]
        rows.append(
            ParamCoverage(
                name, tuple(p.shape), status, tuple(acting), frac, tuple(dict.fromkeys(reasons))
            )
        )
    if detection is None:
        return CoverageReport(rows, {}, True, ["symmetries declared by hand, not detected"])
    notes = list(detection.notes)
    notes.append(
        f"each symmetry was checked in float64 under a random group element of size "
        f"{detection.scale:g}; tolerance {detection.tolerance:g} on the relative output change"
    )
    notes += [f"rejected candidate {lab}: {why}" for lab, why in detection.rejected]
    return CoverageReport(rows, dict(detection.unsupported), detection.complete, notes)
