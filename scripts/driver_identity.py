"""Record what ``sol-ext train`` computes, to check that a change of the driver keeps it bit for bit.

Trains five short runs on the built-in abalone data, each in a fresh folder: the defaults (sigma
auto: one training per candidate), ``--method corn``, ``--method l1``, ``--paper``, and a default
run stopped by a Ctrl-C in the middle of its sigma search and then continued with ``--resume``.
For each it records the test figures of ``results.json`` (and the picked sigma and epoch) and a
SHA-256 digest of every tensor in ``best.pt``. The record is JSON; with ``--against`` the script
compares it with an earlier record and exits with status 1 where any figure or tensor differs, or a
tensor is missing (tensors only the new record has are listed apart: new entries of ``best.pt``)::

    PYTHONPATH=$PWD python scripts/driver_identity.py --record before.json
    PYTHONPATH=$PWD python scripts/driver_identity.py --record after.json --against before.json

The runs take a few minutes on two CPU cores (``--epochs`` makes them shorter or longer; compare
records of the same settings only).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

RUNS = {
    "default": [],
    "corn": ["--method", "corn"],
    "l1": ["--method", "l1"],
    "paper": ["--paper"],
}

# A Ctrl-C at an optimizer step, as tests/driver/test_cli.py makes one: KeyboardInterrupt from
# Optimizer.zero_grad at the given step, then the command as installed.
INTERRUPTED = """
import sys, torch
from sol_ext.driver.cli import main
stop_at = int(sys.argv[1])
calls = []
zero_grad = torch.optim.Optimizer.zero_grad
def interrupted(self, *args, **kwargs):
    calls.append(1)
    if len(calls) >= stop_at:
        raise KeyboardInterrupt
    return zero_grad(self, *args, **kwargs)
torch.optim.Optimizer.zero_grad = interrupted
sys.exit(main(sys.argv[2:]))
"""


def _digest(value: Any, prefix: str, out: dict[str, str]) -> None:
    """SHA-256 of every tensor in ``value`` (nested dicts, lists and tuples), by its key path."""
    import torch

    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        out[prefix] = h.hexdigest()
    elif isinstance(value, dict):
        for k in sorted(value, key=str):
            _digest(value[k], f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _digest(v, f"{prefix}[{i}]", out)


def _record_run(folder: Path) -> dict[str, Any]:
    import torch

    results = json.loads((folder / "results.json").read_text())
    tensors: dict[str, str] = {}
    _digest(torch.load(folder / "best.pt", map_location="cpu", weights_only=False), "", tensors)
    return {"test": results["test"], "val_mae": results["val_mae"],
            "selected_epoch": results["selected_epoch"], "epochs_run": results["epochs_run"],
            "sigma_selected": results["sigma_selected"], "best_pt_tensors": tensors}


def _train(args: list[str], env: dict[str, str], script: str | None = None,
           stop_at: int = 0) -> int:
    command = ([sys.executable, "-c", script, str(stop_at)] if script
               else [sys.executable, "-c", "import sys; from sol_ext.driver.cli import main; "
                                          "sys.exit(main(sys.argv[1:]))"])
    proc = subprocess.run([*command, "train", *args], env=env, capture_output=True, text=True)
    if proc.returncode not in (0, 130):
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"sol-ext train {' '.join(args)} failed ({proc.returncode})")
    return proc.returncode


def record(epochs: int, seed: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    common = ["--epochs", str(epochs), "--seed", str(seed), "--quiet", "--no-plots"]
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="sol-ext-identity-") as tmp:
        for name, options in RUNS.items():
            folder = Path(tmp) / name
            _train(["--output", str(folder), *common, *options], env)
            runs[name] = _record_run(folder)
            print(f"{name}: test {runs[name]['test']}", flush=True)
        folder = Path(tmp) / "resumed"
        # abalone's 3007 fitted rows are 47 steps of 64 an epoch: stop in the second epoch of the
        # second sigma trial, which the resumed run continues from its checkpoint
        stop_at = epochs * 47 + 47 + 20
        code = _train(["--output", str(folder), *common], env, script=INTERRUPTED, stop_at=stop_at)
        if code != 130:
            raise SystemExit(f"the interrupted run ended with {code}, not 130 (Ctrl-C)")
        _train(["--output", str(folder), *common, "--resume"], env)
        runs["resumed"] = _record_run(folder)
        print(f"resumed: test {runs['resumed']['test']}", flush=True)
    return {"settings": {"epochs": epochs, "seed": seed}, "runs": runs}


def differences(a: dict[str, Any], b: dict[str, Any], where: str = "") -> list[str]:
    """Where the earlier record ``a`` and the new ``b`` differ; a ``best.pt`` tensor that only the new
    record has is not a difference (:func:`added_tensors` lists those)."""
    if isinstance(a, dict) and isinstance(b, dict):
        only = set(a) - set(b) if where.endswith("best_pt_tensors") else set(a) ^ set(b)
        found = [f"{where}.{k}: only in one record" for k in sorted(only)]
        for k in sorted(set(a) & set(b)):
            found += differences(a[k], b[k], f"{where}.{k}" if where else k)
        return found
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def added_tensors(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The ``best.pt`` tensors of the new record ``b`` that the earlier ``a`` does not have (new
    entries of the run's model file; every tensor both have must be equal)."""
    return [f"{name}.{key}" for name, run in b["runs"].items() if name in a["runs"]
            for key in sorted(set(run["best_pt_tensors"]) - set(a["runs"][name]["best_pt_tensors"]))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", required=True, help="where to write the record (JSON)")
    parser.add_argument("--against", default=None, help="an earlier record to compare with")
    parser.add_argument("--epochs", type=int, default=20)  # the default run's
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rec = record(args.epochs, args.seed)
    Path(args.record).write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
    if args.against is None:
        return 0
    earlier = json.loads(Path(args.against).read_text())
    found = differences(earlier, rec)
    added = added_tensors(earlier, rec)
    tensors = sum(len(r["best_pt_tensors"]) for r in rec["runs"].values()) - len(added)
    if added:
        print(f"{len(added)} best.pt tensors new since {args.against} (not compared):", *added, sep="\n")
    if found:
        print(f"{len(found)} differences from {args.against}:", *found[:50], sep="\n")
        return 1
    print(f"identical to {args.against}: {len(rec['runs'])} runs, test figures and "
          f"{tensors} best.pt tensors bit for bit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
