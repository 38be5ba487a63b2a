"""The sol-ext command end to end on tiny data, and its one-line errors on bad input."""

import csv
import json
import subprocess
import sys

import pytest
import torch

from sol_ext.cli import main


def write_csv(path, rows, header=("a", "b", "label")):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def tiny_csv(path, n=120, num_ranks=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = torch.randint(0, num_ranks, (n,), generator=g)
    rows = [(float(v) + 0.3 * float(e), float(e), 20 + int(v))
            for v, e in zip(r, torch.randn(n, generator=g))]
    return write_csv(path, rows)


FAST = ["--epochs", "2", "--batch-size", "16", "--embedding-dim", "4", "--hidden", "16",
        "--lr", "0.01"]


def run_train(tmp_path, *extra):
    data = tiny_csv(tmp_path / "d.csv")
    out = tmp_path / "run"
    code = main(["train", "--data", str(data), "--output", str(out), "--quiet", *FAST, *extra])
    return code, out


def test_train_audit_end_to_end(tmp_path, capsys):
    code, out = run_train(tmp_path)
    assert code == 0
    printed = capsys.readouterr().out
    assert "test MAE" in printed and "relabeled" in printed
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["method"] == "sol" and len(results["history"]) == 2
    for name in ("learning_curves.png", "cs_curve.png", "embeddings_pca.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"

    assert main(["audit", str(out)]) == 0
    summary = capsys.readouterr().out
    assert "look wrong" in summary
    rows = list(csv.DictReader(open(out / "audit.csv")))
    assert len(rows) == results["data"]["n_train"]
    assert list(rows[0]) == ["index", "given_label", "current_label", "predicted_label",
                             "deviation", "outlier", "suggested_label", "clean_label"]
    flagged = sum(r["outlier"] == "1" for r in rows)
    assert f"{flagged} of {len(rows)}" in summary
    # indices are rows of the data file: distinct and within it
    idx = [int(r["index"]) for r in rows]
    assert len(set(idx)) == len(idx) and max(idx) < 120


def test_rerun_needs_resume_or_overwrite_and_resume_continues(tmp_path, capsys):
    code, out = run_train(tmp_path)
    assert code == 0
    code, _ = run_train(tmp_path)
    assert code == 2 and "--resume" in capsys.readouterr().err
    data = str(tmp_path / "d.csv")
    more = [a if a != "2" else "3" for a in FAST]  # --epochs 3
    assert main(["train", "--data", data, "--output", str(out), "--quiet", "--resume", *more]) == 0
    assert len(json.loads((out / "results.json").read_text())["history"]) == 3
    # resuming with another configuration is a one-line error
    code = main(["train", "--data", data, "--output", str(out), "--quiet", "--resume",
                 *more, "--tau", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "another configuration" in err and "tau" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("method", ["l1", "ce", "sol-no-noise"])
def test_baselines_from_the_cli(tmp_path, method):
    code, out = run_train(tmp_path, "--method", method, "--no-plots")
    assert code == 0
    assert json.loads((out / "results.json").read_text())["relabeled_total"] == 0


def test_separate_test_file_with_noisy_training_labels(tmp_path, capsys):
    train = tiny_csv(tmp_path / "train.csv", seed=1)
    test = tiny_csv(tmp_path / "test.csv", n=40, seed=2)
    out = tmp_path / "run"
    assert main(["train", "--data", str(train), "--test-data", str(test), "--output", str(out),
                 "--quiet", "--no-plots", *FAST]) == 0
    capsys.readouterr()
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["noise"] == "none" and results["label_noise_given"] is None
    assert results["data"]["n_train"] == 120 and results["data"]["n_test"] == 40
    assert main(["audit", str(out), "--csv", "-"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].endswith("suggested_label") and len(lines) == 121


def test_compare_small_grid(tmp_path, capsys):
    data = tiny_csv(tmp_path / "d.csv")
    out = tmp_path / "cmp"
    code = main(["compare", "--data", str(data), "--seeds", "0", "--kappas", "0.3", "--noises", "",
                 "--output", str(out), "--epochs", "1", "--batch-size", "16",
                 "--embedding-dim", "4", "--hidden", "16"])
    assert code == 0
    table = capsys.readouterr().out
    assert "| method | gaussian 0.3 |" in table
    for m in ("sol", "sol-no-noise", "l1", "ce"):
        assert f"| {m} |" in table
    assert table.strip().endswith((out / "compare.md").read_text().strip())
    assert len(json.loads((out / "compare.json").read_text())) == 4


def test_default_dataset_one_epoch(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--epochs", "1", "--output", str(out), "--no-plots"]) == 0
    assert "abalone" in capsys.readouterr().out


def test_python_dash_m_entry(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "sol_ext", "train", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "--kappa" in proc.stdout


# ---------------------------------------------------------------------------------------------
# bad input: one line on stderr, exit status 2, no traceback, no result


def expect_error(capsys, argv, *needles):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("sol-ext: error:")
    for needle in needles:
        assert needle in err, err


def test_missing_label_column(tmp_path, capsys):
    data = tiny_csv(tmp_path / "d.csv")
    expect_error(capsys, ["train", "--data", str(data), "--label-column", "age",
                          "--output", str(tmp_path / "o")], "age")
    assert not (tmp_path / "o" / "results.json").exists()


def test_non_numeric_label(tmp_path, capsys):
    data = write_csv(tmp_path / "d.csv", [(1, 2, "old"), (2, 3, "young")])
    expect_error(capsys, ["train", "--data", str(data), "--output", str(tmp_path / "o")],
                 "non-numeric")


def test_nan_feature(tmp_path, capsys):
    data = write_csv(tmp_path / "d.csv", [(1, 2, 3), ("nan", 3, 4), (2, 2, 5)])
    expect_error(capsys, ["train", "--data", str(data), "--output", str(tmp_path / "o")], "NaN")


def test_empty_dataset(tmp_path, capsys):
    data = write_csv(tmp_path / "d.csv", [])
    expect_error(capsys, ["train", "--data", str(data), "--output", str(tmp_path / "o")], "empty")


def test_one_rank_dataset(tmp_path, capsys):
    data = write_csv(tmp_path / "d.csv", [(i, i, 7) for i in range(10)])
    expect_error(capsys, ["train", "--data", str(data), "--output", str(tmp_path / "o")],
                 "one rank")


def test_negative_kappa(tmp_path, capsys):
    expect_error(capsys, ["train", "--kappa", "-0.1", "--output", str(tmp_path / "o")], "kappa")


def test_unknown_noise_type(tmp_path, capsys):
    data = tiny_csv(tmp_path / "d.csv")
    expect_error(capsys, ["train", "--data", str(data), "--noise", "pink",
                          "--output", str(tmp_path / "o")], "pink")


def test_missing_data_file(tmp_path, capsys):
    expect_error(capsys, ["train", "--data", str(tmp_path / "nope.csv"),
                          "--output", str(tmp_path / "o")], "nope.csv")


def test_unreadable_image(tmp_path, capsys):
    pytest.importorskip("PIL")
    (tmp_path / "bad.png").write_bytes(b"not an image")
    listing = write_csv(tmp_path / "labels.csv", [("bad.png", 1), ("bad.png", 2)],
                        header=("path", "label"))
    expect_error(capsys, ["train", "--data", str(listing), "--output", str(tmp_path / "o")],
                 "bad.png")


def test_audit_of_a_folder_without_run(tmp_path, capsys):
    expect_error(capsys, ["audit", str(tmp_path)], "no checkpoint")


def test_damaged_checkpoint(tmp_path, capsys):
    (tmp_path / "checkpoint.pt").write_bytes(b"garbage")
    expect_error(capsys, ["audit", str(tmp_path)], "damaged")


def test_vgg_weights_without_vgg_encoder(tmp_path, capsys):
    expect_error(capsys, ["train", "--vgg-weights", "w.pth", "--output", str(tmp_path / "o")],
                 "vgg16bn")


def test_posterior_inference_option(tmp_path, capsys):
    data = tiny_csv(tmp_path / "d.csv")
    out = tmp_path / "run"
    assert main(["train", "--data", str(data), "--epochs", "1", "--batch-size", "16",
                 "--embedding-dim", "4", "--hidden", "16", "--inference", "posterior",
                 "--output", str(out), "--no-plots", "--quiet"]) == 0
    saved = json.loads((out / "results.json").read_text())
    assert saved["config"]["inference"] == "posterior"
