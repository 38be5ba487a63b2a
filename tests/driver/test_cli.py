"""The sol-ext command end to end on tiny data, and its one-line errors on bad input."""

import csv
import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from common import REPO_ROOT, expect_error, snapshot, tiny_csv, train_argv, write_csv
from sol_ext.driver.cli import main

FAST = ["--epochs", "2", "--batch-size", "16", "--embedding-dim", "4", "--hidden", "16",
        "--lr", "0.01"]


def run_train(tmp_path, *extra):
    data = tiny_csv(tmp_path / "d.csv")
    out = tmp_path / "run"
    code = main(["train", "--data", str(data), "--output", str(out), "--quiet", *FAST, *extra])
    return code, out


def test_train_audit_end_to_end(tmp_path, capsys):
    code, out = run_train(tmp_path, "--noise", "gaussian")  # added noise: the clean labels are known
    assert code == 0
    printed = capsys.readouterr().out
    assert "test MAE" in printed and "labels changed" in printed
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["method"] == "sol" and len(results["history"]) == 2
    for name in ("learning_curves.png", "cs_curve.png", "embeddings_pca.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"

    assert main(["audit", str(out)]) == 0
    summary = capsys.readouterr().out
    assert "look wrong" in summary
    rows = list(csv.DictReader(open(out / "audit.csv")))
    # every training row, the validation split included
    assert len(rows) == results["data"]["n_train"] + results["data"]["n_val"]
    columns = list(rows[0])
    assert columns[:9] == ["index", "given_label", "current_label", "predicted_label",
                           "deviation", "outlier", "score", "suggested_label", "clean_label"]
    # the out-of-sample probabilities of each label value, one row's summing to 1
    lowest, ranks = int(results["data"]["min_value"]), results["data"]["num_ranks"]  # whole labels, step 1
    assert columns[9:] == [f"p_{lowest + q}" for q in range(ranks)]
    assert all(abs(sum(float(r[c]) for c in columns[9:]) - 1) < 1e-4 for r in rows)
    scores = [float(r["score"]) for r in rows]
    assert scores == sorted(scores, reverse=True), "suspects first"
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
                 *more, "--tau", "2"])
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
    assert results["data"]["n_train"] + results["data"]["n_val"] == 120
    assert results["data"]["n_test"] == 40
    assert main(["audit", str(out), "--csv", "-"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].endswith("suggested_label," + ",".join(f"p_{v}" for v in range(20, 30)))
    assert len(lines) == 121


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
    from sol_ext.driver.compare import default_methods

    assert len(json.loads((out / "compare.json").read_text())) == len(default_methods())


def test_compare_with_a_test_file_heads_the_column_without_added_noise_labels_as_given(tmp_path, capsys):
    train, test = tiny_csv(tmp_path / "train.csv", seed=1), tiny_csv(tmp_path / "test.csv", seed=2)
    out = tmp_path / "cmp"
    code = main(["compare", "--data", str(train), "--test-data", str(test), "--seeds", "0", "--kappas", "0",
                 "--noises", "", "--methods", "sol,l1", "--output", str(out), "--epochs", "1",
                 "--batch-size", "16", "--embedding-dim", "4", "--hidden", "16"])
    assert code == 0
    assert "| method | labels as given |" in capsys.readouterr().out
    records = json.loads((out / "compare.json").read_text())
    assert {r["kappa"] for r in records} == {0.0}


def test_default_dataset_one_epoch(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--epochs", "1", "--output", str(out), "--no-plots"]) == 0
    assert "abalone" in capsys.readouterr().out


def test_python_dash_m_entry(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "sol_ext.driver", "train", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "--kappa" in proc.stdout


# ---------------------------------------------------------------------------------------------
# bad input: one line on stderr, exit status 2, no traceback, no result


def test_missing_label_column(tmp_path, capsys):
    data = tiny_csv(tmp_path / "d.csv")
    err = expect_error(capsys, ["train", "--data", str(data), "--label-column", "age",
                                "--output", str(tmp_path / "o")], "age", "--label-column")
    assert "label_column=" not in err  # the command's flag, not the library's argument name
    assert not (tmp_path / "o").exists()


def test_label_column_with_data_that_has_no_columns(tmp_path, capsys):
    err = expect_error(capsys, ["train", "--label-column", "age", "--output", str(tmp_path / "o")],
                       "--label-column", "abalone")
    assert "label_column=" not in err


def test_non_numeric_label(tmp_path, capsys):
    data = write_csv(tmp_path / "d.csv", [(1, 2, "old"), (2, 3, "young")])
    expect_error(capsys, ["train", "--data", str(data), "--output", str(tmp_path / "o")],
                 "non-numeric")


def test_nan_feature(tmp_path, capsys):
    data = write_csv(tmp_path / "d.csv", [(1, 2, 3), ("nan", 3, 4), (2, 2, 5)])
    # rows with a missing value are left out by default (--missing skip); --missing error names them
    expect_error(capsys, ["train", "--data", str(data), "--output", str(tmp_path / "o"), "--missing", "error"],
                 "NaN", "data row 1")


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
    expect_error(capsys, ["train", "--weights", "w.pth", "--output", str(tmp_path / "o")],
                 "vgg16bn")


def test_posterior_readout_option(tmp_path, capsys):
    data = tiny_csv(tmp_path / "d.csv")
    out = tmp_path / "run"
    assert main(["train", "--data", str(data), "--epochs", "1", "--batch-size", "16",
                 "--embedding-dim", "4", "--hidden", "16", "--readout", "posterior",
                 "--output", str(out), "--no-plots", "--quiet"]) == 0
    saved = json.loads((out / "results.json").read_text())
    assert saved["config"]["readout"] == "posterior"


def test_label_noise_option_reaches_the_run_and_bad_values_are_refused(tmp_path, capsys):
    code, out = run_train(tmp_path, "--sigma", "1", "--label-noise", "1.5", "--no-plots")
    assert code == 0
    assert json.loads((out / "results.json").read_text())["config"]["label_noise"] == 1.5
    expect_error(capsys, ["train", "--label-noise", "-1", "--output", str(tmp_path / "o")],
                 "label noise must be 'auto' or a finite std")


# ---------------------------------------------------------------------------------------------
# damaged files and impossible settings: one line, exit status 2


@pytest.mark.parametrize("name,damage,words", [
    ("d.csv.gz", lambda raw: gzip.compress(raw)[:200], "truncated"),
    ("d.npz", lambda raw: bytes(range(256)) * 8, "not an .npz archive"),
    ("d.csv", lambda raw: raw.replace(b"label", b"\xe9label"), "not UTF-8"),
])
def test_damaged_data_file(tmp_path, capsys, name, damage, words):
    raw = tiny_csv(tmp_path / "src.csv").read_bytes()
    path = tmp_path / name
    path.write_bytes(damage(raw))
    expect_error(capsys, ["train", "--data", str(path), "--output", str(tmp_path / "o"), *FAST],
                 str(path), words)


def test_unknown_device(tmp_path, capsys):
    expect_error(capsys, ["train", "--device", "tpu", "--output", str(tmp_path / "o"), *FAST],
                 "tpu", "--device")


def test_absurd_embedding_size(tmp_path, capsys):
    expect_error(capsys, ["train", "--embedding-dim", "100000000", "--output",
                          str(tmp_path / "o"), "--epochs", "1"], "embedding")


def test_diverging_training_says_so_with_the_epoch(tmp_path, capsys):
    data = tiny_csv(tmp_path / "d.csv")
    args = [a if a != "0.01" else "1e20" for a in FAST]  # --lr 1e20 (inf is refused as such)
    expect_error(capsys, ["train", "--data", str(data), "--output", str(tmp_path / "o"), *args],
                 "diverged", "epoch 1", "--lr")


def test_no_noise_prints_no_kappa(tmp_path, capsys):
    train = tiny_csv(tmp_path / "train.csv", seed=1)
    test = tiny_csv(tmp_path / "test.csv", n=40, seed=2)
    assert main(["train", "--data", str(train), "--test-data", str(test), "--output",
                 str(tmp_path / "run"), "--no-plots", *FAST]) == 0
    printed = capsys.readouterr().out
    assert "noise none" in printed
    for line in printed.splitlines():
        line = line.split(" -> ")[0]  # not the output folder's name
        if "none" in line:
            assert "kappa" not in line and "none 0" not in line, line


# ---------------------------------------------------------------------------------------------
# the output folder: a refused --resume changes nothing, one run at a time, Ctrl-C


def test_refused_resume_keeps_the_finished_runs_results(tmp_path, capsys):
    code, out = run_train(tmp_path)
    assert code == 0
    kept = ("results.json", "learning_curves.png", "cs_curve.png", "embeddings_pca.png",
            "checkpoint.pt")
    before = {name: (out / name).read_bytes() for name in kept}
    data = str(tmp_path / "d.csv")
    other = str(tiny_csv(tmp_path / "other.csv", n=100, seed=7))
    resume = ["train", "--output", str(out), "--quiet", "--resume", *FAST]
    refused = [[*resume, "--data", data, "--margin", "0.123"],   # other settings
               [*resume, "--data", other]]                        # other data
    if not torch.cuda.is_available():
        refused.append([*resume, "--data", data, "--device", "cuda"])  # no such device here
    for argv in refused:
        assert main(argv) == 2, argv
        assert {name: (out / name).read_bytes() for name in kept} == before, argv
    # a damaged checkpoint: refused, and the results stay
    (out / "checkpoint.pt").write_bytes(before["checkpoint.pt"][:1000])
    assert main([*resume, "--data", data]) == 2
    assert "damaged" in capsys.readouterr().err
    for name in kept[:-1]:
        assert (out / name).read_bytes() == before[name], name


def test_second_run_into_the_same_output_is_refused(tmp_path, capsys):
    from sol_ext.driver.rundir import lock_output_folder

    data = tiny_csv(tmp_path / "d.csv")
    out = tmp_path / "run"
    with lock_output_folder(out):  # a run in progress there
        expect_error(capsys, ["train", "--data", str(data), "--output", str(out), *FAST],
                     "in use by another sol-ext run", "--output")
        assert [p.name for p in out.iterdir()] == [".lock"]


def _ctrl_c_at_optimizer_step(monkeypatch, step):
    """Make the ``step``-th optimizer step of the run raise KeyboardInterrupt (as Ctrl-C does)."""
    calls = []
    zero_grad = torch.optim.Optimizer.zero_grad

    def interrupted(self, *args, **kwargs):
        calls.append(1)
        if len(calls) >= step:
            raise KeyboardInterrupt
        return zero_grad(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Optimizer, "zero_grad", interrupted)


def test_ctrl_c_before_the_first_checkpoint_says_nothing_is_saved(tmp_path, capsys, monkeypatch):
    _ctrl_c_at_optimizer_step(monkeypatch, 3)
    code, out = run_train(tmp_path)
    err = capsys.readouterr().err
    assert code == 130 and len(err.strip().splitlines()) == 1, err
    assert "nothing to resume" in err and "--resume" not in err, err
    assert not (out / "checkpoint.pt").exists()


def test_ctrl_c_after_an_epoch_points_to_its_checkpoint(tmp_path, capsys, monkeypatch):
    code, out = run_train(tmp_path)  # 2 epochs, checkpointed
    assert code == 0
    capsys.readouterr()
    _ctrl_c_at_optimizer_step(monkeypatch, 2)
    more = [a if a != "2" else "4" for a in FAST]  # --epochs 4
    code = main(["train", "--data", str(tmp_path / "d.csv"), "--output", str(out), "--quiet",
                 "--resume", *more])
    err = capsys.readouterr().err
    assert code == 130 and "checkpoint of epoch 2" in err and "--resume" in err, err
    assert not (out / ".lock").exists()


def test_ctrl_c_while_starting_prints_no_traceback(tmp_path):
    """The ``sol-ext`` command as installed: a Ctrl-C while torch loads ends it quietly."""
    root = REPO_ROOT
    env = {**os.environ, "PYTHONPATH": str(root)}
    # The launcher as installed, which says on stdout when its Ctrl-C handler is in place: the signal
    # is sent then, while the package (torch) still loads, however long the interpreter took to start.
    launcher = textwrap.dedent("""
        import signal, sys
        import sol_ext_launcher
        install = signal.signal
        def announce(signum, handler):
            previous = install(signum, handler)
            if handler is sol_ext_launcher._quit_while_starting:
                print("handler installed", flush=True)
            return previous
        signal.signal = announce
        sys.exit(sol_ext_launcher.main())
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", launcher, "train", "--output", str(tmp_path / "o")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    assert proc.stdout.readline() == "handler installed\n"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.startswith("sol-ext: interrupted"), err
    assert len(err.strip().splitlines()) == 1, err


# A second Ctrl-C while the first one stops the run: `sol-ext train` as installed, in a process of
# its own (the second one ends that process), with the two signals sent at set moments. The first
# arrives at an optimizer step of epoch 2, after epoch 1's checkpoint; ``SECOND`` sends the other.
SECOND_CTRL_C = textwrap.dedent("""
    import os, signal, sys
    import torch
    import sol_ext_launcher
    import sol_ext.driver.rundir as rundir

    steps, first_at_step = [], 10  # 6 steps an epoch
    zero_grad = torch.optim.Optimizer.zero_grad

    def first_ctrl_c_in_epoch_2(self, *args, **kwargs):
        steps.append(1)
        if len(steps) == first_at_step:
            os.kill(os.getpid(), signal.SIGINT)
        return zero_grad(self, *args, **kwargs)

    torch.optim.Optimizer.zero_grad = first_ctrl_c_in_epoch_2
    {second}
    sys.exit(sol_ext_launcher.main())
""")


def _ctrl_c_twice(tmp_path, second: str):
    """Run ``sol-ext train`` (2 epochs) with the two Ctrl-C of :data:`SECOND_CTRL_C`; its exit status,
    stderr and run folder."""
    data = tiny_csv(tmp_path / "d.csv")
    out = tmp_path / "run"
    script = SECOND_CTRL_C.replace("{second}", textwrap.dedent(second).strip())
    argv = ["train", "--data", str(data), "--output", str(out), "--quiet", "--no-plots", "--sigma", "1", *FAST]
    proc = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, cwd=tmp_path)
    return proc.returncode, proc.stderr, out


def _whole_checkpoint_of_epoch_1(out):
    """The run folder holds epoch 1's checkpoint, whole, and no temporary or lock file."""
    from sol_ext.driver.checkpoint import load_checkpoint

    assert sorted(p.name for p in out.iterdir()) == ["best.pt", "checkpoint.pt"]
    assert load_checkpoint(out / "checkpoint.pt")["epoch"] == 1  # its checksums verified


def test_a_second_ctrl_c_while_the_run_stops_ends_it_at_once(tmp_path):
    """The second arrives while the clean stop reads what the folder holds."""
    code, err, out = _ctrl_c_twice(tmp_path, """
        note = rundir.interruption_note

        def second_ctrl_c(folder):
            os.kill(os.getpid(), signal.SIGINT)
            return note(folder)

        rundir.interruption_note = second_ctrl_c
    """)
    assert code == 130, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("sol-ext: interrupted again; stopped at once"), err
    assert str(out) in err and "--resume" in err, err
    _whole_checkpoint_of_epoch_1(out)


def test_a_second_ctrl_c_while_a_checkpoint_is_written_leaves_no_temporary(tmp_path):
    """The first Ctrl-C arrives while epoch 2's checkpoint is written, the second as its temporary
    is being removed: that temporary goes all the same, and epoch 1's checkpoint stays whole."""
    code, err, out = _ctrl_c_twice(tmp_path, """
        import pathlib
        import sol_ext.driver.checkpoint as checkpoint
        first_at_step = None  # the first Ctrl-C comes while the checkpoint is written instead
        save, unlink, sent = torch.save, pathlib.Path.unlink, []

        def first_ctrl_c_while_writing(state, f, *args, **kwargs):
            if state.get("epoch") == 2 and "optimizer" in state:
                f.write(b"half a checkpoint")
                os.kill(os.getpid(), signal.SIGINT)
            return save(state, f, *args, **kwargs)

        def second_ctrl_c_while_removing(path, *args, **kwargs):
            if path.name.endswith(".tmp") and not sent:
                sent.append(1)
                os.kill(os.getpid(), signal.SIGINT)
            return unlink(path, *args, **kwargs)

        checkpoint.torch.save = first_ctrl_c_while_writing
        pathlib.Path.unlink = second_ctrl_c_while_removing
    """)
    _whole_checkpoint_of_epoch_1(out)
    assert code == 130, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("sol-ext: interrupted again; stopped at once"), err


def test_a_second_ctrl_c_while_the_process_exits_prints_no_traceback(tmp_path):
    """The second arrives after the first's line, while the exit handlers run (torch's, which
    printed the KeyboardInterrupt's traceback): the process ends at once with the first's status."""
    code, err, out = _ctrl_c_twice(tmp_path, """
        import atexit, time

        def second_ctrl_c():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)

        atexit.register(second_ctrl_c)
    """)
    assert code == 130, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("sol-ext: interrupted;") and "checkpoint of epoch 1" in err, err
    _whole_checkpoint_of_epoch_1(out)


# ---------------------------------------------------------------------------------------------
# compare: every option checked before the first run


COMPARE_FAST = ["--epochs", "1", "--batch-size", "16", "--embedding-dim", "4", "--hidden", "16"]


@pytest.mark.parametrize("option,flag", [
    (["--seeds", ""], "--seeds"),
    (["--methods", ""], "--methods"),
    (["--kappas", "", "--noises", ""], "--kappas"),
    (["--methods", "sol,l1,sol"], "--methods"),
    (["--seeds", "0,0"], "--seeds"),
    (["--noises", "laplacian,none"], "--noises"),
    (["--noises", "laplacian,Laplacian"], "--noises lists laplacian more than once"),  # one type, two spellings
    (["--noises", "gaussian"], "--noises gaussian: Gaussian noise and clean labels are the --kappas columns"),
])
def test_compare_refuses_empty_or_repeated_lists_and_keeps_compare_md(tmp_path, capsys, option,
                                                                       flag):
    data = tiny_csv(tmp_path / "d.csv")
    out = tmp_path / "cmp"
    out.mkdir()
    (out / "compare.md").write_text("earlier tables\n")
    expect_error(capsys, ["compare", "--data", str(data), "--output", str(out), *COMPARE_FAST,
                          *option], flag)
    assert (out / "compare.md").read_text() == "earlier tables\n"


def test_compare_refuses_an_unknown_noise_before_anything_trains(tmp_path, capsys):
    data = tiny_csv(tmp_path / "d.csv")
    out = tmp_path / "cmp"
    expect_error(capsys, ["compare", "--data", str(data), "--output", str(out), "--seeds", "0",
                          "--kappas", "0.3", "--noises", "laplacian,pink", *COMPARE_FAST],
                 "pink", "--noises")
    assert not out.exists() or not any(out.rglob("checkpoint.pt"))


def test_paper_switch_restores_algorithm_1_and_options_beside_it_still_apply(tmp_path):
    from sol_ext.driver.config import PAPER_SETTINGS

    code, out = run_train(tmp_path, "--paper", "--sigma", "2", "--no-plots")
    assert code == 0
    cfg = json.loads((out / "results.json").read_text())["config"]
    assert cfg["sigma"] == 2.0  # given beside --paper
    assert all(cfg[k] == v for k, v in PAPER_SETTINGS.items() if k != "sigma")
    results = json.loads((out / "results.json").read_text())
    assert results["selection"] == "last epoch" and results["selected_epoch"] == 2


def test_a_config_with_a_test_file_adds_no_noise_unless_asked():
    """Library users get the CLI's default: labels from a training file are used as they are."""
    from sol_ext.driver.config import TrainConfig

    assert TrainConfig(data="train.csv", test_data="test.csv").noise == "none"
    assert TrainConfig(data="train.csv", test_data="test.csv", noise="laplacian").noise == "laplacian"
    assert TrainConfig().noise == "gaussian"
    assert TrainConfig.from_dict(TrainConfig(test_data="t.csv").to_dict()).noise == "none"


# ---------------------------------------------------------------------------------------------
# --traceback: the full traceback behind the one error line


@pytest.mark.parametrize("how", [["--traceback", "train"], ["train", "--traceback"], "environment"])
def test_traceback_is_printed_above_the_error_line_when_asked(how, tmp_path, capsys, monkeypatch):
    argv = ["train", "--data", str(tmp_path / "missing.csv"), "--output", str(tmp_path / "o")]
    if how == "environment":
        monkeypatch.setenv("SOL_EXT_TRACEBACK", "1")
    else:
        argv = [*how, *argv[1:]]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):"), err
    assert "FileNotFoundError" in err  # the error behind the line, where it was raised
    last = err.strip().splitlines()[-1]
    assert last.startswith("sol-ext: error: ") and "missing.csv" in last, err


@pytest.mark.parametrize("value", ["", "0"])
def test_no_traceback_without_the_option(value, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SOL_EXT_TRACEBACK", value)
    expect_error(capsys, ["train", "--data", str(tmp_path / "missing.csv"), "--output",
                          str(tmp_path / "o")], "missing.csv")


# --------------------------------------------------------------------------------------------------
# Settings checked once: contradictory options, absurd numbers, the validation split

SIGMA1 = ["--sigma", "1"]

# Settings refused before any data is read (the data file does not exist): the flags and the one-line
# error's flag or setting.
REFUSED_BEFORE_LOADING = [
    (["--threads", "100000"], "--threads"),
    (["--epochs", "99999999999999999999"], "--epochs"),
    *[(["--seed", seed], "seed") for seed in ("-1", str(2**63), str(2**64 - 1))],  # outside int64
    *[([flag, value], flag) for flag, value in (("--weight-decay", "inf"), ("--lr", "inf"), ("--lr", "nan"),
                                                ("--margin", "inf"), ("--disc-weight", "nan"),
                                                ("--cs-theta", "inf"))],
    (["--disc-weight", "-1"], "disc weight"),  # once refused only after the data had loaded
]


@pytest.mark.parametrize("flags, named", REFUSED_BEFORE_LOADING,
                         ids=[" ".join(flags) for flags, _ in REFUSED_BEFORE_LOADING])
def test_settings_are_refused_by_name_before_the_data_is_read(tmp_path, capsys, flags, named):
    expect_error(capsys, train_argv(tmp_path / "nope.csv", tmp_path / "o", *flags), named,
                 absent=("nope.csv", "Overflow", "diverged"))


@pytest.mark.parametrize("setting, value", [("epochs", 10 ** 20), ("disc_weight", -1.0)])
def test_the_configuration_refuses_absurd_values_by_name(setting, value):
    from sol_ext.driver.config import TrainConfig

    with pytest.raises(ValueError, match=setting.replace("_", "[_ ]")):
        TrainConfig(**{setting: value}).validate()


# Settings that leave no order to learn on the data: the flags and the setting the error names.
@pytest.mark.parametrize("flags, named", [(["--tau", "1000000"], "tau"), (["--sigma", "1e300"], "sigma")])
def test_settings_that_leave_no_order_to_learn_are_refused(tmp_path, capsys, flags, named):
    data = tiny_csv(tmp_path / "d.csv")
    expect_error(capsys, ["train", "--data", str(data), "--epochs", "1", "--output", str(tmp_path / "o"),
                          "--batch-size", "16", "--quiet", "--no-plots", *flags], named)


def test_resume_with_fewer_epochs_than_already_run_is_refused(finished, capsys):
    out, data = finished
    before = snapshot(out)
    expect_error(capsys, [*train_argv(data, out, *SIGMA1), "--resume", "--epochs", "1"],
                 "--epochs 1", "2 epochs")
    assert snapshot(out) == before


def test_resume_and_overwrite_together_are_refused(finished, capsys):
    out, data = finished
    before = snapshot(out)
    expect_error(capsys, [*train_argv(data, out, *SIGMA1), "--resume", "--overwrite"],
                 "--resume", "--overwrite")
    assert snapshot(out) == before


def test_test_fraction_with_a_test_file_is_refused(tmp_path, capsys):
    train = tiny_csv(tmp_path / "train.csv", seed=1)
    test = tiny_csv(tmp_path / "test.csv", n=40, seed=2)
    expect_error(capsys, train_argv(train, tmp_path / "o", "--test-data", str(test),
                                    "--test-fraction", "0.3"), "--test-fraction", "--test-data")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("how", ["same path", "same bytes"])
def test_a_test_file_equal_to_the_training_file_is_refused(tmp_path, capsys, how):
    train = tiny_csv(tmp_path / "train.csv", seed=1)
    test = train
    if how == "same bytes":
        test = tmp_path / "copy.csv"
        test.write_bytes(train.read_bytes())
    expect_error(capsys, train_argv(train, tmp_path / "o", "--test-data", str(test)),
                 "--test-data", "training")
    assert not (tmp_path / "o").exists()


def test_every_float_setting_must_be_finite():
    import dataclasses

    from sol_ext.driver.config import TrainConfig

    floats = [f.name for f in dataclasses.fields(TrainConfig)
              if isinstance(getattr(TrainConfig(), f.name), float)]
    assert {"lr", "margin", "disc_weight", "kappa"} <= set(floats)
    for name in floats + ["cs_theta", "weight_decay"]:  # weight_decay: "auto" or a number
        for bad in (float("inf"), float("nan")):
            with pytest.raises(ValueError):
                TrainConfig(**{name: bad}).validate()


def test_a_failing_validation_split_names_val_fraction(tmp_path, capsys):
    data = write_csv(tmp_path / "d.csv", [(i, -i, 20 + i % 3) for i in range(5)])
    expect_error(capsys, train_argv(data, tmp_path / "o", *SIGMA1), "--val-fraction",
                 absent=("--test-fraction",))


def test_a_tiny_fitted_part_is_warned_about(tmp_path, capsys):
    data = tiny_csv(tmp_path / "d.csv")
    assert main(train_argv(data, tmp_path / "o", *SIGMA1, "--val-fraction", "0.9",
                           "--epochs", "1")) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "warning:" in err[0] and "--val-fraction" in err[0], err
    # the usual split of the same data says nothing
    assert main(train_argv(data, tmp_path / "o2", *SIGMA1, "--epochs", "1")) == 0
    assert capsys.readouterr().err == ""


def test_results_table_shows_label_mae_in_label_units(tmp_path):
    from sol_ext.driver.report import format_table

    results = {"config": {"method": "sol", "noise": "gaussian", "kappa": 0.3},
               "data": {"name": "grid", "step": 0.01, "min_value": 0.0},
               "test": {"mae": 0.636, "cs": 40.0, "qwk": 0.5, "macro_mae": 0.7}, "cs_theta": 0.02,
               "labels_changed": 3, "label_noise_given": {"mae": 37.98},
               "label_noise_final": {"mae": 30.0}}
    table = format_table([results])
    assert "0.380->0.300" in table and "37.98" not in table
    assert "label units" in table.splitlines()[0]


@pytest.mark.parametrize("action", ["ignore", "error"])
def test_own_data_warnings_print_whatever_python_s_warning_filters_say(tmp_path, capsys, action):
    """PYTHONWARNINGS=ignore (common in CI) or =error: sol-ext's data warnings are the command's
    output, printed as one line, and the run goes on."""
    import warnings

    rows = [(i % 7, "" if i % 20 == 0 else i % 3, 20 + i % 5) for i in range(100)]
    data = write_csv(tmp_path / "d.csv", rows)
    with warnings.catch_warnings():
        warnings.simplefilter(action)  # as PYTHONWARNINGS sets it
        assert main(train_argv(data, tmp_path / "o", *SIGMA1, "--epochs", "1", "--missing", "skip")) == 0
    assert "sol-ext: warning: " in capsys.readouterr().err


# -- a command's --help without torch ---------------------------------------------------------------

def test_the_saved_command_parsers_are_today_s():
    """sol_ext/driver/command_help.json, from which the launcher answers COMMAND --help, describes
    the parsers build_parser makes now."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("write_command_help", REPO_ROOT / "scripts" / "write_command_help.py")
    writer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(writer)
    saved = (REPO_ROOT / "sol_ext" / "driver" / "command_help.json").read_text(encoding="utf-8")
    assert saved == writer.command_help_text(), "an option changed: run python scripts/write_command_help.py"


@pytest.mark.parametrize("command", ["train", "predict", "export", "audit", "compare"])
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_a_command_s_help_answers_without_importing_torch(command, flag, monkeypatch):
    """sol-ext COMMAND --help is answered by the launcher without loading sol_ext (torch), with the
    text of the program's own parser."""
    import io
    from contextlib import redirect_stdout

    from sol_ext.driver.cli import build_parser

    monkeypatch.setenv("COLUMNS", "100")
    code = ("import sys, sol_ext_launcher\n"
            f"sys.argv = ['sol-ext', {command!r}, {flag!r}]\n"
            "status = sol_ext_launcher.main()\n"
            "print('torch loaded:', 'torch' in sys.modules, 'status:', status)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert proc.returncode == 0, proc.stderr
    answer, last = proc.stdout.rsplit("torch loaded:", 1)
    assert last.split() == ["False", "status:", "0"]
    program = io.StringIO()
    with redirect_stdout(program), pytest.raises(SystemExit):
        build_parser().parse_args([command, flag])
    assert answer == program.getvalue()
