"""Image training throughput: one epoch of SOL against the ``l1`` baseline with the same backbone,
loader and images, and where SOL's epoch goes.

    python benchmarks/bench_images.py                      # CPU: resnet18, 64 px, 1000 images
    python benchmarks/bench_images.py --device cuda --image-size 224 --batch-size 64 --amp --images 4000
    python benchmarks/bench_images.py --memory 2000,8000   # peak memory of `sol-ext train` (224 px)
    python benchmarks/bench_images.py --memory 1000,6000 --encoder cnn --batch-size 16 --workers 0

The images are JPEG files made here (no download): smooth random scenes of 256 x 256 pixels, blurred
by one of 8 levels, the rank. Both methods run through ``sol_ext.driver.train.train`` from the same
image list (files decoded by the DataLoader, ``--workers``), with sigma fixed (no search) and
randomly initialised weights; epoch 1 warms up (workers, allocator, cuDNN) and the figures are
those of the last epoch, from the run's own timings (``history[-1]["seconds"]``):

- steps: the training steps (loading, forward, loss, backward, update);
- end of epoch: the passes over every sample that follow (embedding the training set, the
  centroid rule, read-out and relabeling for SOL, validation and test), which ``l1`` also runs
  (without the centroid rule and relabeling);
- epoch: both. The target is SOL's epoch at most 1.3x that of ``l1``.

``--memory N,M`` instead times ``sol-ext train --data list.csv --image-size 224 --encoder resnet18
--weights resnet18.pth --sigma 1 --epochs 1 --batch-size B`` (``--encoder cnn``: no weights) on lists
of N and M images, in a child process, and reports its peak resident memory (the largest of the
training process and its loader workers). The images are files decoded batch by batch, so the peak
should not grow with their number: the target is the largest count's peak at most 200 MiB above the
smallest's. (With glibc's malloc left to raise its mmap threshold, every freed 224-px image became a
heap hole and the peak grew by about 0.5 MB per image; see ``sol_ext.driver.loader.
keep_large_buffers_off_heap``.)
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from sol_ext.driver.config import TrainConfig
from sol_ext.driver.prepare import prepare_data
from sol_ext.driver.train import train

LEVELS = 8
SOURCE_SIZE = 256


def make_images(folder: Path, count: int, seed: int = 0) -> Path:
    """``count`` JPEG files and their ``labels.csv``: smooth random scenes blurred by their level."""
    from PIL import Image, ImageFilter

    rng = np.random.default_rng(seed)
    (folder / "img").mkdir(parents=True, exist_ok=True)
    rows = ["path,label"]
    for i in range(count):
        coarse = rng.random((8, 8, 3)) * 255
        scene = Image.fromarray(coarse.astype(np.uint8)).resize((SOURCE_SIZE, SOURCE_SIZE), Image.BICUBIC)
        detail = rng.normal(0, 25, (SOURCE_SIZE, SOURCE_SIZE, 3))
        scene = Image.fromarray(np.clip(np.asarray(scene, dtype=np.float64) + detail, 0, 255).astype(np.uint8))
        level = i % LEVELS
        if level:
            scene = scene.filter(ImageFilter.GaussianBlur(radius=0.6 * level))
        scene.save(folder / "img" / f"{i:05d}.jpg", quality=90)
        rows.append(f"img/{i:05d}.jpg,{level}")
    (folder / "labels.csv").write_text("\n".join(rows) + "\n")
    return folder / "labels.csv"


def time_method(listing: Path, method: str, args: argparse.Namespace, out: Path) -> dict:
    config = TrainConfig(data=str(listing), method=method, encoder=args.encoder, image_size=args.image_size,
                         batch_size=args.batch_size, epochs=args.epochs, sigma=1.0, device=args.device,
                         amp=args.amp, workers=args.workers, embedding_dim=args.embedding_dim,
                         seed=0).validate()
    data = prepare_data(config)
    outcome = train(config, data, out / method, log=lambda line: None)
    last = outcome.results["history"][-1]["seconds"]
    n_fit = outcome.results["data"]["n_train"]  # the fitted rows (the validation split apart)
    epoch = last["steps"] + last["end_of_epoch"]
    return {"method": method, "images": n_fit, "steps_s": last["steps"], "end_of_epoch_s": last["end_of_epoch"],
            "epoch_s": epoch, "images_per_s": n_fit / last["steps"],
            "end_share": last["end_of_epoch"] / epoch}


def throughput(args: argparse.Namespace, work: Path) -> list[dict]:
    listing = make_images(work / "images", args.images)
    rows = [time_method(listing, method, args, work) for method in ("l1", "sol")]
    l1 = rows[0]["epoch_s"]
    for r in rows:
        r["epoch_vs_l1"] = r["epoch_s"] / l1
    return rows


def machine(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


def throughput_table(rows: list[dict], args: argparse.Namespace) -> str:
    workers = "default" if args.workers is None else args.workers
    head = (f"{args.encoder}, {args.image_size} px, batch {args.batch_size}"
            f"{', AMP' if args.amp else ''}, {workers} loader workers, {machine(args.device)}; "
            f"last of {args.epochs} epochs")
    lines = [head, "",
             "| method | training images/s | steps s | end of epoch s | epoch s | end-of-epoch share | "
             "epoch vs l1 |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['images_per_s']:.1f} | {r['steps_s']:.2f} | "
                     f"{r['end_of_epoch_s']:.2f} | {r['epoch_s']:.2f} | {100 * r['end_share']:.0f} % | "
                     f"{r['epoch_vs_l1']:.2f}x |")
    sol = rows[-1]
    lines.append("")
    lines.append(f"target: SOL's epoch <= 1.3x l1's: {'PASS' if sol['epoch_vs_l1'] <= 1.3 else 'MISS'} "
                 f"({sol['epoch_vs_l1']:.2f}x)")
    return "\n".join(lines)


MEMORY_MARGIN_MIB = 200  # target: the largest count's peak at most this much above the smallest's


def peak_memory(counts: list[int], args: argparse.Namespace, work: Path) -> list[dict]:
    encoder = ["--encoder", args.encoder]
    if args.encoder not in ("cnn", "mlp"):
        import torchvision

        weights = work / f"{args.encoder}.pth"  # torchvision's file format; random values (no download)
        torch.save(torchvision.models.get_model(args.encoder).state_dict(), weights)
        encoder += ["--weights", str(weights)]
    rows = []
    for count in counts:
        listing = make_images(work / f"images-{count}", count)
        cmd = [sys.executable, "-m", "sol_ext.driver", "train", "--data", str(listing), "--image-size", "224",
               *encoder, "--sigma", "1", "--epochs", "1",
               "--batch-size", str(args.batch_size),
               "--output", str(work / f"run-{count}"), "--quiet", "--no-plots", "--device", args.device]
        if args.workers is not None:
            cmd += ["--workers", str(args.workers)]
        start = time.perf_counter()
        # a fresh child per size: RUSAGE_CHILDREN's peak is the largest over the waited-for processes
        child = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(cmd)], capture_output=True, text=True)
        if child.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{child.stderr[-2000:]}")
        rows.append({"images": count, "peak_rss_mb": float(child.stdout.strip().splitlines()[-1]),
                     "seconds": time.perf_counter() - start})
    return rows


# runs the command, then prints the peak resident memory (MiB) of it and its descendants
_CHILD = """
import json, resource, subprocess, sys
subprocess.run(json.loads(sys.argv[1]), check=True, stdout=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
"""


def memory_verdict(rows: list[dict]) -> str:
    """Whether the peak at the largest count is within :data:`MEMORY_MARGIN_MIB` of the smallest's
    (nothing to say for one count)."""
    if len({r["images"] for r in rows}) < 2:
        return ""
    low, high = min(rows, key=lambda r: r["images"]), max(rows, key=lambda r: r["images"])
    grown = high["peak_rss_mb"] - low["peak_rss_mb"]
    ok = grown <= MEMORY_MARGIN_MIB
    return (f"\ntarget: peak at {high['images']} images <= peak at {low['images']} + "
            f"{MEMORY_MARGIN_MIB} MiB: {'PASS' if ok else 'MISS'} ({grown:+.0f} MiB, "
            f"{grown / max(high['images'] - low['images'], 1):.3f} MiB per image)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--encoder", default="resnet18")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--images", type=int, default=1000)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--embedding-dim", type=int, default=16)
    p.add_argument("--workers", type=int, default=None, help="loader processes (default: the driver's)")
    p.add_argument("--amp", action="store_true")
    p.add_argument("--memory", default=None, help="comma list of image counts: peak memory instead")
    p.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.memory:
            rows = peak_memory([int(c) for c in args.memory.split(",")], args, work)
            workers = "" if args.workers is None else f" --workers {args.workers}"
            weights = "" if args.encoder in ("cnn", "mlp") else f" --weights {args.encoder}.pth"
            print(f"sol-ext train --image-size 224 --encoder {args.encoder}{weights} --sigma 1 "
                  f"--epochs 1 --batch-size {args.batch_size}{workers} ({machine(args.device)})\n")
            print("| images | peak resident memory MiB | seconds |\n| --- | --- | --- |")
            for r in rows:
                print(f"| {r['images']} | {r['peak_rss_mb']:.0f} | {r['seconds']:.0f} |")
            print(memory_verdict(rows))
        else:
            rows = throughput(args, work)
            print(throughput_table(rows, args))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
