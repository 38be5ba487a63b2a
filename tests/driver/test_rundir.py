"""The output folder of a run: its lock, atomic writes with private temporary files, checkpoint
checks made before anything in the folder changes, and what an interrupted run says."""

import os
import stat
import threading

import pytest
import torch

from sol_ext.driver.checkpoint import (
    CheckpointMismatch,
    atomic_write_text,
    check_resumable,
    checkpoint_epoch,
    save_checkpoint,
)
from sol_ext.driver.config import TrainConfig
from sol_ext.driver.rundir import (
    LOCK_NAME,
    OutputFolderBusy,
    RunInterrupted,
    interruption_note,
    lock_output_folder,
    run_folder,
)


def test_second_lock_on_a_folder_is_refused_and_names_the_holder(tmp_path):
    out = tmp_path / "run"
    with lock_output_folder(out):
        assert (out / LOCK_NAME).read_text().strip() == str(os.getpid())
        # flock conflicts between two opens of the file, also within one process
        with pytest.raises(OutputFolderBusy, match=f"in use by another sol-ext run \\(process "
                                                   f"{os.getpid()}\\).*--output"):
            with lock_output_folder(out):
                pass
        (out / "results.json").write_text("{}")
    # released: the lock file is gone and the folder can be locked again
    assert not (out / LOCK_NAME).exists()
    with lock_output_folder(out):
        pass
    assert (out / "results.json").exists()


def test_lock_leaves_no_empty_folder_it_created(tmp_path):
    out = tmp_path / "a" / "run"
    with pytest.raises(ValueError):
        with lock_output_folder(out):
            raise ValueError("bad input")
    assert not out.exists()
    existing = tmp_path / "kept"
    existing.mkdir()
    with lock_output_folder(existing):
        pass
    assert existing.is_dir() and list(existing.iterdir()) == []


def test_lock_taken_on_a_removed_lock_file_is_taken_again(tmp_path, monkeypatch):
    """A run that opened the lock file just before the holder removed it must not count the lock
    on the removed file as its own."""
    import fcntl

    import sol_ext.driver.rundir as rundir

    out = tmp_path / "run"
    out.mkdir()
    calls = []
    real_flock = fcntl.flock

    def flock_after_the_file_was_replaced(fd, op):
        if not calls:  # first attempt: the holder removes the file, another run makes a new one
            (out / LOCK_NAME).unlink()
            (out / LOCK_NAME).write_text("")
        calls.append(fd)
        return real_flock(fd, op)

    monkeypatch.setattr(rundir.fcntl, "flock", flock_after_the_file_was_replaced)
    with lock_output_folder(out):
        assert len(calls) == 2
        assert os.path.samestat(os.fstat(calls[1]), os.stat(out / LOCK_NAME))


def test_atomic_writes_never_touch_another_writers_temporary_file(tmp_path):
    target = tmp_path / "results.json"
    # a second run writing the same file at this moment (the old fixed temporary name)
    other = tmp_path / ".results.json.tmp"
    other.write_text("half of another run's results")
    atomic_write_text(target, "mine")
    save_checkpoint(tmp_path / "checkpoint.pt", {"epoch": 1})
    assert target.read_text() == "mine"
    assert other.read_text() == "half of another run's results"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".results.json.tmp", "checkpoint.pt",
                                                          "results.json"]


class _Unsaveable:
    def __reduce__(self):
        raise RuntimeError("cannot be saved")


def test_failed_atomic_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "checkpoint.pt"
    save_checkpoint(target, {"epoch": 1})
    with pytest.raises(RuntimeError, match="cannot be saved"):
        save_checkpoint(target, {"epoch": 2, "bad": _Unsaveable()})
    assert checkpoint_epoch(target) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def _state(config, epoch=3, fingerprint=None):
    return {"config": config.to_dict(), "fingerprint": fingerprint or {"n_train": 10},
            "epoch": epoch, "model": {"w": torch.zeros(2)}}


def test_check_resumable_refuses_other_settings_data_and_damage(tmp_path):
    cfg = TrainConfig()
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, _state(cfg))
    assert check_resumable(path, cfg, {"n_train": 10}) == 3
    with pytest.raises(CheckpointMismatch, match="another configuration"):
        check_resumable(path, TrainConfig(margin=0.123), {"n_train": 10})
    with pytest.raises(CheckpointMismatch, match="other data"):
        check_resumable(path, cfg, {"n_train": 11})
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointMismatch, match="damaged"):
        check_resumable(path, cfg, {"n_train": 10})
    assert checkpoint_epoch(path) is None and checkpoint_epoch(tmp_path / "none.pt") is None


def test_interruption_note_says_what_the_folder_holds(tmp_path):
    note = interruption_note(tmp_path)
    assert "nothing to resume" in note and "--resume" not in note.replace("nothing to resume", "")
    save_checkpoint(tmp_path / "checkpoint.pt", _state(TrainConfig(), epoch=2))
    note = interruption_note(tmp_path)
    assert "checkpoint of epoch 2" in note and "--resume" in note


def test_run_folder_turns_ctrl_c_into_a_note_and_releases_the_lock(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(RunInterrupted, match="nothing to resume"):
        with run_folder(out):
            raise KeyboardInterrupt
    with pytest.raises(RunInterrupted, match="compare.md was not written"):
        with run_folder(out, note=lambda: "compare.md was not written"):
            raise KeyboardInterrupt
    assert not out.exists()  # created here, nothing written: removed with its lock


def test_atomic_writes_follow_links_and_write_into_what_is_not_a_regular_file(tmp_path):
    """A symbolic link keeps pointing at the file, which gets the new text; a named pipe (as
    /dev/null or a terminal) is written into, not replaced by a file."""
    target = tmp_path / "real.csv"
    target.write_text("old")
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    atomic_write_text(link, "new")
    assert link.is_symlink() and target.read_text() == "new"

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    received = []
    reader = threading.Thread(target=lambda: received.append(pipe.read_text()), daemon=True)
    reader.start()
    atomic_write_text(pipe, "through the pipe")
    reader.join(timeout=60)
    assert received == ["through the pipe"] and stat.S_ISFIFO(pipe.stat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.csv", "pipe", "real.csv"]  # no temporary
