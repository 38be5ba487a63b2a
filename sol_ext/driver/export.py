"""``sol-ext export``: a trained run as a ``torch.export`` program that needs plain torch only.

The program maps raw features ``[N, F]`` (the training columns after one-hot encoding, in order) or
images ``[N, C, H, W]`` in [0, 1] to ``(prediction, expected, probabilities)``: predicted labels and
expected labels ``[N]`` in label units and ``p(q | x)`` ``[N, n]`` (float64). The feature scaling,
the encoder and the read-out are inside; the read-out's dissimilarities ``D`` are computed with plain
torch operations (docs/math.md §3), not sol_ext's kernels, so loading needs no sol_ext::

    program = torch.export.load("model.pt2").module()
    prediction, expected, probabilities = program(torch.tensor(rows))

Inputs of any floating dtype are cast inside (float32 for the encoder). A row with a NaN or
infinite value (or one that overflows float32) gets NaN for all three outputs: NaN is never a label
value, so such a prediction cannot be mistaken for one. The input's shape is checked by the loaded
program's own guard (``Guard failed: x.size()[1] == F``); the sidecar's ``inputs.shape`` says it.

Beside the program goes its sidecar, the program's path with ``.json`` added (``model.pt2`` ->
``model.pt2.json``, ``model.onnx`` -> ``model.onnx.json``; :func:`sidecar_path`), so that the two
exports of one run keep a sidecar each: the columns, the one-hot categories of each categorical
column, the label value of each probability column and, with a coverage, the intervals.

:func:`export_onnx` writes the same computation as an ONNX model (``model.onnx``, with the same
sidecar), which onnxruntime runs without torch or sol_ext: input ``x``, outputs ``prediction``,
``expected`` and ``probabilities``, a dynamic batch dimension. It needs the extra ``onnx``
(``pip install 'sol_ext[onnx]'``: onnx, onnxscript and onnxruntime).
"""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from ..intervals import intervals_at
from .checkpoint import atomic_write_files
from .methods import head_probabilities, head_ranks
from .model import TrainedModel
from .outputs import SIDECAR_FORMAT

__all__ = ["ExportedPredictor", "export_run", "export_onnx", "sidecar_path", "SIDECAR_SUFFIX",
           "export_command"]

SIDECAR_SUFFIX = ".json"


class ExportedPredictor(nn.Module):
    """Scaling, encoder and read-out of a :class:`TrainedModel` in plain torch operations; with
    ``coverage``, also the model's rank intervals at that coverage (its calibration, fixed here)."""

    def __init__(self, trained: TrainedModel, coverage: Optional[float] = None):
        super().__init__()
        self.interval = None
        if coverage is not None:
            if trained.intervals is None:
                raise ValueError("coverage: the model has no interval calibration; call its "
                                 "calibrate_intervals() on held-out data with labels first")
            self.interval = (trained.intervals.score, trained.intervals.threshold(coverage))
        self.method = trained.method
        self.n = trained.num_ranks
        self.model = copy.deepcopy(trained.model).cpu().eval()  # the trained model stays put
        scaling = trained.scaling
        # a run trained with --missing impute fills a NaN of a numeric column as its predictions do
        fill = trained.fill_vector() if trained.missing == "impute" else None
        self.imputed = fill is not None
        self.register_buffer("fill", fill if self.imputed else torch.zeros(0, dtype=torch.float64))
        self.scaled = scaling is not None
        self.register_buffer("mean", scaling[0].clone() if self.scaled else torch.zeros(0, dtype=torch.float64))
        self.register_buffer("std", scaling[1].clone() if self.scaled else torch.ones(0, dtype=torch.float64))
        self.register_buffer("values", trained.grid.values().to(torch.float64))
        self.readout = "posterior"
        if trained.head is not None:
            head = copy.deepcopy(trained.head).cpu()
            self.readout = head.readout
            self.register_buffer("centroids", head.centroids.detach().to(torch.float64).clone())
            self.register_buffer("kernel", head.kernel().to(torch.float64))
            self.register_buffer("log_prior", head.log_prior.to(torch.float64).clone())
            self.register_buffer("cuts", head.cuts.to(torch.float64).clone())
            self.temperature = float(head.temperature)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x`` [N, F] or [N, C, H, W], any floating dtype -> prediction [N], expected [N],
        probabilities [N, n] (float64), and with a coverage lower [N] and upper [N]; NaN in all for a
        row that is not finite."""
        # a copy into a new tensor casts any dtype; x.to() would be traced as a no-op that the
        # program then asserts (float32 only)
        if self.imputed:
            x64 = torch.empty(x.shape, dtype=torch.float64).copy_(x)
            x = torch.where(torch.isnan(x64) & ~torch.isnan(self.fill), self.fill, x64)
        if self.scaled:
            x64 = torch.empty(x.shape, dtype=torch.float64).copy_(x)
            x = ((x64 - self.mean) / self.std).to(torch.float32)
        else:
            x = torch.empty(x.shape, dtype=torch.float32).copy_(x)
        h = self.model(x)
        if self.method in ("sol", "sol-no-noise"):
            probabilities, ranks = self._sol_readout(h)
        else:
            probabilities, ranks = self._head_readout(h)
        # NaN or inf anywhere in a row (also one that overflowed float32) gives NaN, not a rank
        bad = ~(torch.isfinite(x.flatten(1)).all(1) & torch.isfinite(h).all(1))
        prediction = torch.where(bad, torch.nan, self.values[ranks])
        expected = torch.where(bad, torch.nan, probabilities.to(torch.float64) @ self.values)
        probabilities = torch.where(bad[:, None], torch.nan, probabilities.to(torch.float64))
        if self.interval is None:
            return prediction, expected, probabilities
        lower, upper = intervals_at(probabilities, *self.interval)
        return (prediction, expected, probabilities, torch.where(bad, torch.nan, self.values[lower]),
                torch.where(bad, torch.nan, self.values[upper]))

    def _sol_readout(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # D[x, q] = sum_j P[q, j] ||h_x - mu_j||^2 in float64: the expanded square loses nothing here
        h64 = h.to(torch.float64)
        sq = (h64 * h64).sum(1, keepdim=True) - 2.0 * h64 @ self.centroids.T \
            + (self.centroids * self.centroids).sum(1)[None, :]
        d = sq.clamp_min(0.0) @ self.kernel.T
        shifted = d - d.min(dim=1, keepdim=True).values
        probabilities = torch.softmax(-shifted / self.temperature + self.log_prior, dim=1)
        if self.readout == "nearest":
            return probabilities, torch.argmin(d, dim=1)
        if self.readout == "cuts":
            expected_rank = probabilities @ torch.arange(self.n, dtype=torch.float64)
            return probabilities, (expected_rank[:, None] > self.cuts[None, :]).sum(dim=1)
        below_half = probabilities.cumsum(dim=1) < 0.5
        return probabilities, below_half.sum(dim=1).clamp(max=self.n - 1)

    def _head_readout(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # the baselines' heads are plain torch already: the same functions as load_run
        return (head_probabilities(self.method, self.model, h, self.n),
                head_ranks(self.method, self.model, h, self.n))


def sidecar(trained: TrainedModel, coverage: Optional[float] = None) -> dict[str, Any]:
    """What a user of the exported program needs to build its input: columns and categories."""
    pre = trained.preprocessing
    schema = pre.get("schema", {})
    intervals = {} if coverage is None else {"intervals": {
        "coverage": coverage, "score": trained.intervals.score, "target": trained.intervals.target,
        "calibration_rows": trained.intervals.count,
        "outputs": "lower [N], upper [N] float64, label units: the interval of each row"}}
    return {
        "format": SIDECAR_FORMAT,
        "method": trained.method,
        "inputs": {"kind": trained.kind, "shape": ["N", *trained.input_shape],
                   "dtype": "float32 (other dtypes are cast inside)",
                   "feature_names": trained.feature_names,
                   "source_columns": schema.get("columns"),
                   "categorical": schema.get("categorical", {}),
                   "one_hot": "column 'name=category' is 1.0 where the cell equals category, else 0.0",
                   "scaling": "inside the program (the training set's mean and std)"
                   if trained.scaling is not None else "none: images in [0, 1]"},
        "outputs": ["prediction [N] float64, label units", "expected [N] float64, label units",
                    "probabilities [N, n] float64, one column per label value"],
        "non_finite_rows": "a row with NaN or inf gets NaN prediction, expected and probabilities"
                           + ("; a NaN of a numeric column is filled with missing.fill_values first (the run was "
                              "trained with --missing impute)" if trained.missing == "impute" else ""),
        **({"missing": {"fill_values": {k: v for k, v in schema.get("fill_values", {}).items()}}}
           if trained.missing == "impute" else {}),
        "label_values": [float(v) for v in trained.label_values],
        **intervals,
    }


def sidecar_path(program: Path | str) -> Path:
    """The sidecar of the program ``program``: its path with ``.json`` added (``model.onnx.json``),
    so that a ``.pt2`` and an ``.onnx`` export of one name never share one."""
    program = Path(program)
    return program.with_name(program.name + SIDECAR_SUFFIX)


def export_run(trained: TrainedModel, output: Path, example: Optional[torch.Tensor] = None,
               coverage: Optional[float] = None) -> Path:
    """Write ``output`` (a ``torch.export`` program, ``.pt2``) and its sidecar
    (:func:`sidecar_path`); return the sidecar's path. With ``coverage`` the program also returns
    ``lower`` and ``upper``, the model's rank intervals at that coverage (after its
    ``calibrate_intervals``). The batch dimension is dynamic. Both files
    are written in full before either replaces an old one (an error or Ctrl-C while writing leaves
    the folder as it was; the two renames that follow are not one atomic step).

    Raises:
        ValueError: ``output`` ends in ``.json`` (it would be taken for a sidecar).
        OSError: a file cannot be written (one line naming it).
    """
    output, side = _output_and_sidecar(output, "model.pt2")
    module, example, batch = _exported_module(trained, example, coverage)
    with torch.no_grad():
        program = torch.export.export(module, (example,), dynamic_shapes=({0: batch},))
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    _write_with_sidecar(trained, output, side, buffer.getvalue(), coverage)
    return side


def export_onnx(trained: TrainedModel, output: Path, example: Optional[torch.Tensor] = None,
                coverage: Optional[float] = None) -> Path:
    """Write ``output`` (an ONNX model, ``.onnx``) of the same computation as :func:`export_run`'s
    program (``lower`` and ``upper`` too, with ``coverage``), and its sidecar; return the sidecar's
    path. The batch dimension is dynamic.

    Raises:
        ImportError: onnx or onnxscript is not installed (the extra ``onnx``).
        ValueError, OSError: as :func:`export_run`.
    """
    for name in ("onnx", "onnxscript"):
        try:
            __import__(name)
        except ImportError:
            raise ImportError(f"exporting to ONNX needs {name}: pip install 'sol_ext[onnx]'") from None
    output, side = _output_and_sidecar(output, "model.onnx")
    module, example, batch = _exported_module(trained, example, coverage)
    names = ["prediction", "expected", "probabilities"] + ([] if coverage is None else ["lower", "upper"])
    with torch.no_grad():
        program = torch.onnx.export(module, (example,), dynamo=True, dynamic_shapes=({0: batch},),
                                    input_names=["x"], output_names=names, verbose=False)
    _write_with_sidecar(trained, output, side, program.model_proto.SerializeToString(), coverage)
    return side


def _output_and_sidecar(output: Path, example_name: str) -> tuple[Path, Path]:
    output = Path(output)
    if output.suffix.lower() == SIDECAR_SUFFIX:
        raise ValueError(f"output {output}: a program named .json would be taken for a sidecar; "
                         f"choose a name that does not end in .json, e.g. {example_name}.")
    return output, sidecar_path(output)


def _exported_module(trained: TrainedModel, example: Optional[torch.Tensor], coverage: Optional[float]):
    """The module to export, an example input (float32) and the dynamic batch dimension."""
    module = ExportedPredictor(trained, coverage).eval().requires_grad_(False)  # outputs need no graph
    if example is None:
        example = torch.rand(2, *trained.input_shape)
    return module, example.to(torch.float32), torch.export.Dim("batch", min=1, max=2**31 - 2)


def _write_with_sidecar(trained: TrainedModel, output: Path, side: Path, program: bytes,
                        coverage: Optional[float] = None) -> None:
    text = json.dumps(sidecar(trained, coverage), indent=2, allow_nan=False) + "\n"
    output.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_files({output: program, side: text.encode("utf-8")})


def export_command(args) -> int:
    """``sol-ext export``: the run in ``args.run_dir`` as a torch.export program and its sidecar."""
    from .checkpoint import run_data
    from .errors import UsageError
    from .model import load_run
    from .outputs import check_output, exported_program_format

    form = args.format or ("onnx" if str(args.output or "").lower().endswith(".onnx") else "pt2")
    model = load_run(args.run_dir)
    if model.kind == "text":  # a tokenizer is no part of a torch.export or ONNX graph
        raise UsageError(f"{args.run_dir} is a text run (--text-column): export supports table and image runs; "
                         f"predict with sol-ext predict {args.run_dir} or sol_ext.driver.load_run, whose "
                         f"text_encoder/ folder transformers also loads")
    default = args.run_dir / f"model.{form}"
    own = [default, sidecar_path(default)]  # a rerun replaces the default export
    inputs = run_data(args.run_dir, model)
    text = str(default) if args.output is None else args.output
    if text == "-":
        raise UsageError("--output -: an exported program cannot go to stdout (it is two files, the program "
                         "and its sidecar); give a file path, e.g. model.pt2.")
    if text and Path(text).suffix.lower() == SIDECAR_SUFFIX:
        raise UsageError(f"--output {text}: a program named .json would be taken for a sidecar; "
                         f"choose a name that does not end in .json, e.g. model.{form}.")
    is_default = default.exists() and Path(text).exists() and Path(text).samefile(default)
    if not is_default and exported_program_format(text) == form:  # an earlier export under a name of one's own
        if not args.overwrite:
            kind = "ONNX" if form == "onnx" else ".pt2"
            raise UsageError(f"--output {text}: is an earlier {kind} export; pass --overwrite to replace it "
                             f"and its sidecar, or choose another file.")
        own += [Path(text), sidecar_path(Path(text))]
    path = check_output(text, "--output", inputs=inputs, replaceable=own, overwrite=args.overwrite,
                        stdout_ok=False)
    check_output(str(sidecar_path(path)), f"--output {text} (its sidecar)", inputs=inputs,
                 replaceable=own, overwrite=args.overwrite, stdout_ok=False)
    from .predict import calibrated_coverage

    coverage = calibrated_coverage(args, model)
    if form == "onnx":
        try:
            side = export_onnx(model, path, coverage=coverage)
        except ImportError as err:
            raise UsageError(f"--format onnx: {err}") from None
        needs = "ONNX; onnxruntime runs it without torch"
    else:
        side = export_run(model, path, coverage=coverage)
        needs = "torch.export; needs plain torch only"
    print(f"exported {model.method} -> {path} ({needs}), inputs and label values -> {side}")
    return 0
