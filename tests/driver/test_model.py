"""load_run(...).predict of vector data embeds on one thread (many small products: a second thread only
waits beside a busy process) and gives torch's thread setting back afterwards."""

import numpy as np
import torch

import sol_ext.driver
from sol_ext.driver.cli import main


def test_predict_embeds_vectors_on_one_thread_and_restores_the_setting(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 3)).astype(np.float32)
    labels = np.clip(np.round(2 * x[:, 0] + 5), 0, 9)
    np.savez(tmp_path / "d.npz", features=x, labels=labels)
    threads = torch.get_num_threads()
    try:
        code = main(["train", "--data", str(tmp_path / "d.npz"), "--output", str(tmp_path / "run"), "--epochs", "1",
                     "--batch-size", "32", "--embedding-dim", "4", "--hidden", "8", "--quiet", "--no-plots"])
        assert code == 0
        model = sol_ext.driver.load_run(tmp_path / "run")
        seen = []
        model.model.register_forward_pre_hook(lambda module, args: seen.append(torch.get_num_threads()))
        torch.set_num_threads(2)
        assert model.predict(x).shape == (200,)
        assert seen and set(seen) == {1}
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
