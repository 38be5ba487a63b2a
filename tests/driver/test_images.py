"""Image data at scale: files decoded on access, the training transforms, the DataLoader path of a run
(workers, seeds, resume) and prediction from image files."""
from __future__ import annotations

import json
import platform
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from sol_ext.driver import load_run
from sol_ext.driver.checkpoint import load_checkpoint
from sol_ext.driver.cli import main
from sol_ext.driver.config import BASELINE_WEIGHT_DECAY, TrainConfig
from sol_ext.driver.data import ImageFiles, load_image_folder
from sol_ext.driver.loader import AUGMENTATIONS, RunInputs, SampleSet, training_transform

Image = pytest.importorskip("PIL.Image")
pytest.importorskip("torchvision")


def _image_list(folder, count=48, size=(20, 24), levels=4, seed=0, fmt="png"):
    """``count`` RGB images whose rank is how bright they are (with noise), listed in labels.csv."""
    rng = np.random.default_rng(seed)
    (folder / "img").mkdir(parents=True, exist_ok=True)
    rows = ["path,label"]
    for i in range(count):
        level = i % levels
        arr = np.clip(rng.normal(40 + 50 * level, 20, (*size, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(arr, mode="RGB").save(folder / "img" / f"{i}.{fmt}")
        rows.append(f"img/{i}.{fmt},{level}")
    (folder / "labels.csv").write_text("\n".join(rows) + "\n")
    return folder / "labels.csv"


# --------------------------------------------------------------------------------------------------
# Files decoded on access


def test_image_files_decode_on_access(tmp_path):
    listing = _image_list(tmp_path, count=6)
    ds = load_image_folder(listing, image_size=16)
    files = ds.features
    assert isinstance(files, ImageFiles) and files.shape == (6, 3, 16, 16) and len(files) == 6
    x = files.read(4)
    assert x.dtype == torch.float32 and x.shape == (3, 16, 16) and 0 <= x.min() and x.max() <= 1
    assert torch.equal(files[[4, 0]].read(0), x)
    assert torch.equal(files[torch.tensor([False, False, False, False, True, False])].read(0), x)
    assert files[1:3].rows.tolist() == [1, 2]  # the data rows of the list, from 0


def test_an_embedding_pass_over_image_files_shows_a_bar_when_asked(tmp_path, capsys):
    files = load_image_folder(_image_list(tmp_path, count=10), image_size=16).features
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 4))
    quiet = RunInputs(files, torch.device("cpu")).embed(model, 4)
    assert "image" not in capsys.readouterr().err
    shown = RunInputs(files, torch.device("cpu"), progress="embedding the test images").embed(model, 4)
    err = capsys.readouterr().err
    assert "embedding the test images" in err and "/10 " in err  # a bar over the 10 images
    assert torch.equal(quiet, shown)


def test_a_file_damaged_after_loading_is_named_when_read(tmp_path):
    listing = _image_list(tmp_path, count=4, fmt="jpg")
    ds = load_image_folder(listing, image_size=8)
    data = (tmp_path / "img" / "2.jpg").read_bytes()
    (tmp_path / "img" / "2.jpg").write_bytes(data[:len(data) // 3])  # truncated after its header
    with pytest.raises(ValueError, match=r"cannot read image .*2\.jpg \(data row 2 of .*labels.csv\)"):
        ds.features.read(2)


def test_large_jpeg_is_decoded_at_reduced_scale_to_the_same_size(tmp_path):
    arr = (np.random.default_rng(0).random((400, 300, 3)) * 255).astype(np.uint8)
    Image.fromarray(arr).save(tmp_path / "big.jpg", quality=90)
    (tmp_path / "labels.csv").write_text("path,label\nbig.jpg,1\nbig.jpg,2\n")
    x = load_image_folder(tmp_path / "labels.csv", image_size=(32, 24)).features.read(0)
    assert x.shape == (3, 32, 24)
    # the mean colour survives the reduced-scale decode
    assert x.mean().item() == pytest.approx(arr.mean() / 255, abs=0.02)


# --------------------------------------------------------------------------------------------------
# Transforms


def test_training_transforms_keep_the_shape_and_evaluation_has_none():
    assert training_transform("none", (16, 16)) is None
    x = torch.rand(3, 16, 20)
    for augment in ("crop", "resized-crop", "flip"):
        transform = training_transform(augment, (16, 20))
        outs = [transform(x) for _ in range(8)]
        assert all(o.shape == x.shape and o.dtype == x.dtype for o in outs)
        assert any(not torch.equal(o, x) for o in outs), augment
    with pytest.raises(ValueError, match="augment='blur'.*crop, resized-crop, flip, none"):
        training_transform("blur", (16, 16))


def test_crop_keeps_the_content_scale():
    # a pad-and-crop moves the image and may mirror it, but never rescales it: every output row is
    # a shifted, possibly reversed, copy of input pixels (no interpolated values)
    x = torch.arange(16 * 16, dtype=torch.float32).reshape(1, 16, 16)
    transform = training_transform("crop", (16, 16))
    for seed in range(5):
        torch.manual_seed(seed)
        assert set(transform(x).unique().tolist()) <= set(x.unique().tolist())


def test_a_sample_transform_depends_on_its_seed_only():
    images = torch.rand(5, 1, 12, 12)
    samples = SampleSet(images, training_transform("crop", (12, 12)))
    torch.manual_seed(123)
    a = samples[(2, 7)]
    state = torch.get_rng_state()
    torch.manual_seed(999)
    assert torch.equal(samples[(2, 7)], a)  # the global generator does not matter...
    assert torch.equal(torch.get_rng_state(), torch.get_rng_state())
    torch.set_rng_state(state)
    outs = {tuple(samples[(2, s)].flatten().tolist()) for s in range(10)}
    assert len(outs) > 1  # ...the seed does
    # and the global generator is left as it was
    torch.manual_seed(5)
    before = torch.rand(3)
    torch.manual_seed(5)
    samples[(1, 3)]
    assert torch.equal(torch.rand(3), before)
    assert torch.equal(SampleSet(images)[(3, 0)], images[3])  # no transform: the sample as it is
    assert torch.equal(samples[(3, None)], images[3])  # no seed: evaluation, untransformed


@pytest.mark.parametrize("augment", ["none", "crop"])
def test_batches_are_the_same_with_and_without_workers(tmp_path, augment):
    files = load_image_folder(_image_list(tmp_path, count=20), image_size=12).features
    rows = [torch.tensor([3, 1, 4]), torch.tensor([15, 9, 2, 6]), torch.tensor([5, 3])]

    def batches(workers):
        inputs = RunInputs(files, torch.device("cpu"), training_transform(augment, (12, 12)), workers)
        return list(inputs.training_batches(rows, torch.Generator().manual_seed(0)))

    serial, parallel = batches(0), batches(2)
    assert [b.shape[0] for b in serial] == [3, 4, 2]
    assert all(torch.equal(a, b) for a, b in zip(serial, parallel))
    if augment == "none":
        assert torch.equal(serial[0][1], files.read(1))


def test_embeddings_of_files_match_those_of_the_decoded_tensor(tmp_path):
    files = load_image_folder(_image_list(tmp_path, count=10), image_size=8).features
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 4))
    lazy = RunInputs(files, torch.device("cpu"), workers=0).embed(model, batch_size=3)
    eager = RunInputs(files.load(), torch.device("cpu")).embed(model, batch_size=3)
    torch.testing.assert_close(lazy, eager)
    part = RunInputs(files, torch.device("cpu")).embed(model, batch_size=3, rows=slice(4, 9))
    torch.testing.assert_close(part, eager[4:9])


# A pass over image files, in a fresh process (the allocator's state is the process's): a batch of
# 16 decoded 224-px images freed first (glibc then raises its mmap threshold to its 9.6 MB), then
# per image a decoded image freed and a small tensor kept, as an embedding pass keeps each batch's
# embeddings. Prints the images that were mappings of their own (mallinfo2's hblks) and the growth
# of the resident memory in MB.
_HEAP_PASS = textwrap.dedent("""
    import ctypes
    import torch
    from sol_ext.driver.data import ImageFiles
    from sol_ext.driver.loader import RunInputs

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
            "fordblks", "keepcost")]

    mallinfo2 = ctypes.CDLL(None).mallinfo2
    mallinfo2.restype = MallInfo2

    def rss_mb():
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024

    RunInputs(ImageFiles([], 3, (224, 224)), torch.device("cpu"))  # a run's image inputs
    batch = torch.ones(16, 3, 224, 224)
    del batch
    start, kept, mapped = rss_mb(), [], 0
    for _ in range(300):
        blocks = mallinfo2().hblks
        image = torch.ones(3, 224, 224)
        mapped += mallinfo2().hblks - blocks
        kept.append(torch.zeros(16, 16))
        del image
    print(mapped, rss_mb() - start)
""")


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc"
                    or tuple(int(v) for v in platform.libc_ver()[1].split(".")[:2]) < (2, 33),
                    reason="glibc's malloc (mallinfo2: 2.33 or later)")
def test_a_pass_over_image_files_does_not_keep_a_heap_block_per_image():
    """Each decoded image is a mapping of its own, returned when freed. Else, from the heap, each
    freed image is a hole that the small tensor kept after it splits, and the heap can grow by one
    image per image: 170 MB for these 300 (0.6 MB each)."""
    run = subprocess.run([sys.executable, "-c", _HEAP_PASS], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    mapped, grown_mb = run.stdout.split()
    assert int(mapped) == 300, f"{mapped} of 300 decoded images were mappings of their own"
    assert float(grown_mb) < 30, f"resident memory grew {float(grown_mb):.0f} MB over 300 freed images"


def test_augmentation_defaults_and_refusal_for_vectors():
    assert TrainConfig().augmentation("images") == "flip"
    assert TrainConfig().augmentation("tabular") == "none"
    assert TrainConfig(augment="none").augmentation("images") == "none"
    with pytest.raises(ValueError, match="augment=crop applies to images"):
        TrainConfig(augment="crop").augmentation("tabular")
    assert set(AUGMENTATIONS) == {"crop", "resized-crop", "flip", "none"}


# --------------------------------------------------------------------------------------------------
# Training from files


def _train(tmp_path, listing, name, *extra):
    out = tmp_path / name
    code = main(["train", "--data", str(listing), "--image-size", "16", "--epochs", "2",
                 "--batch-size", "8", "--sigma", "1", "--embedding-dim", "4", "--output", str(out),
                 "--quiet", "--no-plots", "--seed", "3", *extra])
    assert code == 0
    return out, json.loads((out / "results.json").read_text())


def _losses(results):
    return [r["train_loss"] for r in results["history"]]


def test_a_run_on_image_files_is_the_same_with_any_number_of_workers(tmp_path):
    listing = _image_list(tmp_path / "data")
    _, serial = _train(tmp_path, listing, "w0", "--workers", "0")
    out, parallel = _train(tmp_path, listing, "w2", "--workers", "2")
    assert _losses(serial) == _losses(parallel)
    assert [r["val_mae"] for r in serial["history"]] == [r["val_mae"] for r in parallel["history"]]
    assert serial["config"]["augment"] is None and serial["data"]["kind"] == "images"
    # every epoch says where its time went
    assert set(serial["history"][0]["seconds"]) == {"steps", "end_of_epoch"}


def test_augmentation_changes_the_run_and_none_turns_it_off(tmp_path):
    listing = _image_list(tmp_path / "data")
    _, crop = _train(tmp_path, listing, "crop", "--workers", "0")
    _, plain = _train(tmp_path, listing, "plain", "--workers", "0", "--augment", "none")
    assert _losses(crop) != _losses(plain)


def test_resume_with_workers_continues_the_same_run(tmp_path):
    listing = _image_list(tmp_path / "data")
    _, whole = _train(tmp_path, listing, "whole", "--workers", "2")
    out = tmp_path / "parts"
    assert main(["train", "--data", str(listing), "--image-size", "16", "--epochs", "1",
                 "--batch-size", "8", "--sigma", "1", "--embedding-dim", "4", "--output", str(out),
                 "--quiet", "--no-plots", "--seed", "3", "--workers", "0"]) == 0
    _, resumed = _train(tmp_path, listing, "parts", "--workers", "2", "--resume")
    assert _losses(resumed) == _losses(whole)


def test_predict_reads_image_files_batch_by_batch(tmp_path, capsys):
    listing = _image_list(tmp_path / "data")
    out, _ = _train(tmp_path, listing, "run", "--workers", "0", "--method", "l1")
    new = _image_list(tmp_path / "new", count=6, seed=1)
    assert main(["predict", str(out), "--data", str(new), "--workers", "1"]) == 0
    table = (out / "predictions.csv").read_text().splitlines()
    assert table[0].startswith("id,prediction") and len(table) == 7
    assert table[1].split(",")[0] == "img/0.png"


@pytest.mark.parametrize("argv,match", [
    (["--data", "abalone", "--augment", "crop"], "--augment crop applies to images"),
    (["--data", "abalone", "--image-size", "32"], "--image-size 32 applies to images"),
    (["--data", "abalone", "--workers", "-1"], "workers must be an integer >= 0"),
    (["--data", "abalone", "--image-size", "0"], "image size must be a side of 1"),
])
def test_image_options_refused_where_they_do_not_apply(tmp_path, capsys, argv, match):
    assert main(["train", *argv, "--output", str(tmp_path / "o"), "--epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sol-ext: error:") and match in err and len(err.strip().splitlines()) == 1


def test_an_image_run_keeps_the_papers_weight_decay(tmp_path):
    """--weight-decay auto: the per-rank decay of SOL is for the MLP encoder; the CNN keeps 5e-4."""
    out, _ = _train(tmp_path, _image_list(tmp_path / "data"), "run")
    groups = load_checkpoint(out / "checkpoint.pt")["optimizer"]["param_groups"]
    assert {g["weight_decay"] for g in groups} == {BASELINE_WEIGHT_DECAY}


def test_outputs_are_refused_inside_an_image_folder_the_run_read(tmp_path, capsys):
    """--data FOLDER: its labels.csv and images are the run's data, and no output replaces them."""
    folder = _image_list(tmp_path / "imgs").parent
    out = tmp_path / "run"
    assert main(["train", "--data", str(folder), "--image-size", "16", "--epochs", "1", "--batch-size", "8",
                 "--embedding-dim", "4", "--method", "l1", "--workers", "0", "--output", str(out),
                 "--quiet", "--no-plots"]) == 0
    before = (folder / "labels.csv").read_bytes()
    target = str(folder / "labels.csv")
    for argv, flag in ((["predict", str(out), "--data", str(folder), "--workers", "0", "--output"], "--output"),
                       (["audit", str(out), "--in-sample", "--csv"], "--csv"),
                       (["export", str(out), "--output"], "--output")):
        assert main([*argv, target, "--overwrite"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"sol-ext: error: {flag} {target}: is a file of") and len(err.strip().splitlines()) == 1
    assert (folder / "labels.csv").read_bytes() == before


def test_an_image_run_exported_to_onnx_gives_the_programs_ranks(tmp_path):
    """sol-ext export --format onnx on an image run: onnxruntime gives the .pt2 program's ranks on every
    image, and its probabilities within 1e-5, at any batch size."""
    pytest.importorskip("onnxscript")
    onnxruntime = pytest.importorskip("onnxruntime")
    listing = _image_list(tmp_path / "data")
    out, _ = _train(tmp_path, listing, "run", "--workers", "0", "--epochs", "1", "--augment", "none")
    # onnxruntime's and torch's float32 convolutions round differently (about 1e-7 in the embedding), and
    # a probability moves by that over the posterior temperature: 1e-5 holds for temperatures over ~1e-2
    # (a run of one epoch on fewer images can fit one of 1e-6, and then differ by 1e-3 on near ties).
    assert load_run(out).head.temperature > 1e-2
    assert main(["export", str(out)]) == 0
    assert main(["export", str(out), "--format", "onnx"]) == 0
    program = torch.export.load(str(out / "model.pt2")).module()
    session = onnxruntime.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    # images from dark to bright, as the run's ranks go, in [0, 1] at the run's image size
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(200, 3, 16, 16, generator=generator) * torch.linspace(0.1, 1.0, 200)[:, None, None, None]
    prediction, expected, probabilities = program(x)
    assert len(prediction.unique()) > 1  # the comparison sees more than one rank
    for rows in (slice(None), slice(0, 1), slice(7, 40)):
        got = session.run(None, {"x": x[rows].numpy()})
        assert np.array_equal(got[0], prediction[rows].numpy())
        np.testing.assert_allclose(got[2], probabilities[rows].numpy(), rtol=0, atol=1e-5)
        np.testing.assert_allclose(got[1], expected[rows].numpy(), rtol=1e-5)
