"""Tests of benchmarks/bench_human_noise.py: its label draws, splits and fitted cuts on small arrays, and
its --smoke run on the VADER ratings (skipped where ../shared/data/vader_dev.npz is absent); and of
benchmarks/bench_human_noise_builtin.py, the same settings on a built-in data set."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from common import REPO_ROOT, load_benchmark

ROOT = str(REPO_ROOT)
SCRIPT = os.path.join(ROOT, "benchmarks", "bench_human_noise.py")


def _bench():
    return load_benchmark("bench_human_noise")


def test_a_mean_of_k_raters_draws_only_present_ratings_and_k_distinct_ones():
    bench = _bench()
    missing = bench.MISSING
    # sentence 0: ratings 2 and 4 only; sentence 1: three raters, -1, 0, 4
    ratings = np.array([[2, missing, 4, missing], [-1, 0, missing, 4]])
    for seed in range(20):
        one = bench.mean_of_raters(ratings, 1, seed)
        assert one[0] in (2, 4) and one[1] in (-1, 0, 4)
        both = bench.mean_of_raters(ratings, 2, seed)
        assert both[0] == 3  # both of sentence 0's ratings: never an absent one, never one twice
    assert np.array_equal(bench.mean_of_raters(ratings, 1, 3), bench.mean_of_raters(ratings, 1, 3))
    draws = {tuple(bench.mean_of_raters(ratings, 1, seed)) for seed in range(20)}
    assert len(draws) > 1  # the seed draws another rater
    with pytest.raises(ValueError, match="k=3 raters per sentence: expected 1 <= k <= 2"):
        bench.mean_of_raters(ratings, 3, 0)


def test_the_test_sentences_stay_out_of_training_and_out_of_the_dev_split():
    bench = _bench()
    n = 1000
    train, test = bench.split_sentences(n, seed=4)
    assert len(test) == 200 and np.intersect1d(train, test).size == 0 and len(train) + len(test) == n
    dev_train, dev = bench.split_sentences(n, seed=4, dev=True)
    assert len(dev) == 160 and np.intersect1d(dev_train, dev).size == 0
    assert np.intersect1d(np.concatenate([dev_train, dev]), test).size == 0  # --dev never sees the test rows
    assert not np.array_equal(bench.split_sentences(n, seed=5)[1], test)


def test_the_rank_grid_is_the_rating_scale_even_where_the_training_labels_miss_an_end():
    bench = _bench()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(30, 4)).astype(np.float32)
    y_train = rng.integers(-2, 3, 20)                        # no -4 … -3 nor 3 … 4
    y_test = np.array([-4, 4, 0, 1, 2, -1, 0, 0, 3, -3])
    data = bench.prepared_data(x[:20], y_train, x[20:], y_test)
    assert data.num_ranks == 9 and data.grid.min_value == -4
    assert np.array_equal(data.grid.decode(data.test_ranks).numpy(), y_test)
    assert np.allclose(data.train_x.mean(0).numpy(), 0, atol=1e-5)  # standardized on the training rows


def test_a_variant_names_training_fields_and_bad_ones_are_refused():
    bench = _bench()
    assert bench.parse_variant("wd=weight_decay=5e-4,sigma=0.5") == (
        "sol+wd", {"weight_decay": 5e-4, "sigma": 0.5})
    assert bench.parse_variant("post=readout=nearest") == ("sol+post", {"readout": "nearest"})
    for bad, needle in (("wd", "expected NAME=KEY=VALUE"), ("x=nonsense=1", "'nonsense=1' is not"),
                        ("e=weight_ema=2", "weight EMA decay")):
        with pytest.raises(ValueError, match=needle):
            bench.parse_variant(bad)


@pytest.mark.skipif(not os.path.isfile(os.path.join(ROOT, "..", "shared", "data", "vader_dev.npz")),
                    reason="needs the VADER ratings in ../shared/data/vader_dev.npz")
def test_smoke_run_trains_every_method_on_one_rater_and_judges_against_the_consensus(tmp_path):
    methods = ["sol", "sol-no-noise", "l1", "ce"]
    if importlib.util.find_spec("coral_pytorch") is not None:
        methods.append("corn")
    result = subprocess.run([sys.executable, SCRIPT, "--smoke", "--methods", ",".join(methods),
                             "--variant", "wd=weight_decay=5e-4", "--output", str(tmp_path)],
                            capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-4000:]
    records = json.loads((tmp_path / "human_noise.json").read_text())
    assert [r["method"] for r in records] == [*methods, "sol+wd"]
    for r in records:
        assert r["raters"] == "1" and r["seed"] == 0 and r["split"] == "test"
        assert 0 <= r["mae"] <= 8 and r["macro_mae"] >= 0 and -1 <= r["qwk"] <= 1
        assert 0.3 < r["train_label_mae"] < 1.0  # one rater against the crowd
    sol = records[0]
    assert set(sol["readouts"]) == {"posterior", "nearest", "expected", "sqrt-prior", "flat", "cuts"}
    assert sol["readouts"]["cuts"]["mae"] == pytest.approx(sol["mae"])  # the driver's own read-out (default)
    assert records[-1]["options"] == {"weight_decay": 5e-4}
    md = (tmp_path / "human_noise.md").read_text()
    assert "| method | k=1 |" in md and "| sol / nearest |" in md and "macro-MAE" in md


def test_the_built_in_check_reads_out_every_run_both_ways(tmp_path):
    builtin = load_benchmark("bench_human_noise_builtin")
    mae, macro = builtin.mae_and_macro(np.array([0, 0, 0, 2]), np.array([0, 0, 0, 1]), step=0.5)
    assert mae == pytest.approx(0.125) and macro == pytest.approx(0.25)  # rank 1's one error counts as much as rank 0
    assert builtin.main(["--data", "wine-red", "--kappas", "0.3", "--seeds", "0", "--epochs", "1",
                         "--variant", "d=disc_weight=0.1", "--output", str(tmp_path)]) == 0
    records = json.loads((tmp_path / "builtin.json").read_text())
    assert [r["method"] for r in records] == ["sol", "sol+d"] and records[1]["options"] == {"disc_weight": 0.1}
    for r in records:
        assert set(r) >= {"posterior", "cuts"} and all(0 <= r[k]["mae"] <= 5 for k in ("posterior", "cuts"))
    assert "| wine-red | 0.3 | sol+d |" in (tmp_path / "builtin.md").read_text()


def test_a_missing_data_file_or_bad_option_is_refused_before_any_run(tmp_path):
    for args, needle in ((["--data", str(tmp_path / "none.npz")], "no such file"),
                         (["--methods", "sol,svm"], "--methods: unknown svm"),
                         (["--raters", "0"], "--raters '0'"),
                         (["--variant", "x=foo=1"], "--variant 'x=foo=1'")):
        result = subprocess.run([sys.executable, SCRIPT, *args, "--output", str(tmp_path / "o")],
                                capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert result.returncode == 2 and needle in result.stderr, result.stderr[-2000:]
        assert "Traceback" not in result.stderr and not (tmp_path / "o").exists()


def test_tables_from_several_result_files_count_a_repeated_run_once(tmp_path, capsys):
    bench = _bench()

    def record(method, seed, mae):
        return {"raters": "1", "method": method, "seed": seed, "split": "dev", "mae": mae, "macro_mae": 1.0,
                "qwk": 0.5, "pearson": 0.5, "train_label_mae": 0.5}

    first = [record("sol", 0, 0.6), record("sol", 1, 0.8), record("corn", 0, 0.7)]
    second = [record("sol", 0, 0.6), record("sol+wd", 0, 0.5)]  # sol seed 0 again: the same run
    for name, records in (("a.json", first), ("b.json", second)):
        (tmp_path / name).write_text(json.dumps(records))
    assert bench.main(["--tables-from", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    md = capsys.readouterr().out
    assert "| sol | 0.700 ± 0.141 |" in md  # (0.6 + 0.8) / 2, not (0.6 + 0.6 + 0.8) / 3
    assert "| sol+wd | **0.500 ± 0.000** |" in md and "on the dev rows" in md
