"""The run folder's format: what ``checkpoint.pt`` and ``best.pt`` hold, written atomically and
read back with a configuration check.

A run folder (``sol-ext train --output``) holds

* ``checkpoint.pt``, after every epoch: :class:`RunState` (the epoch's :class:`EpochState`, the
  optimizer, the history, the random states), so a stopped run resumes exactly where it stopped;
* ``best.pt``, the selected epoch: :class:`SelectedEpoch` (its :class:`EpochState`, the test
  embeddings, the audit's per-sample arrays). It is the run's model: the weights, the SOL head,
  and :func:`predictor_record` (the settings and preprocessing that prediction needs), read by
  :func:`sol_ext.driver.model.load_run`;
* ``sigma-search/`` while the trials of sigma ``"auto"`` run (:class:`sol_ext.driver.train.SigmaSearch`): a
  run folder per candidate (``sigma0.25/``, ...) and ``search.json``, the record of the trials that
  finished; kept when the search is interrupted, so that ``--resume`` continues it
  (:func:`sigma_search_progress`), and removed when the winner's run becomes the run;
* ``results.json``, the plots, ``audit.csv`` and ``predictions.csv``, written by the commands.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Optional

import torch

from .config import SIGMA_GRID, TrainConfig, config_mismatches
from .interrupts import removed_if_stopped
from .prepare import PreparedData

__all__ = ["CHECKPOINT_NAME", "BEST_NAME", "SIGMA_SEARCH_NAME", "SIGMA_SEARCH_RECORD", "EpochState",
           "SelectedEpoch", "RunState", "predictor_record", "save_checkpoint", "load_checkpoint",
           "CheckpointMismatch", "check_resumable", "checkpoint_epoch", "check_resume", "load_run_state",
           "run_paths", "run_data", "default_output", "trial_dir", "sigma_search_progress",
           "read_search_record", "atomic_write_bytes", "atomic_write_text", "atomic_write_stream",
           "atomic_write_files"]

CHECKPOINT_NAME = "checkpoint.pt"  # the last epoch: what --resume continues
BEST_NAME = "best.pt"              # the selected epoch: the run's model (sol_ext.driver.load_run)
SIGMA_SEARCH_NAME = "sigma-search"  # the trials of sigma "auto", until the search is done
SIGMA_SEARCH_RECORD = "search.json"  # in SIGMA_SEARCH_NAME: the trials that finished
FORMAT_VERSION = 2  # saved in every file: a file of another format is refused


def _cpu(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.detach().cpu()


def predictor_record(config: TrainConfig, data: PreparedData) -> dict[str, Any]:
    """What :func:`sol_ext.driver.load_run` needs beside the weights to predict on new data: the method
    and encoder settings (sigma resolved), the input shape, and the data's preprocessing; and the
    folder the config's relative paths were read from (:func:`run_paths`)."""
    return {"config": config.to_dict(), "input_shape": list(data.input_shape), "kind": data.kind,
            "preprocessing": data.preprocessing, "read_from": data.read_from}


@dataclass
class EpochState:
    """What both files hold after an epoch (tensors on the CPU), as one record: :meth:`to_dict` is
    the dict saved (``best.pt`` adds :class:`SelectedEpoch`'s entries, ``checkpoint.pt``
    :class:`RunState`'s), :meth:`from_dict` reads one back.

    ``config`` as given (sigma possibly ``"auto"``) and the data's ``fingerprint`` (checked on
    resume); the encoder's ``model`` and the SOL ``head`` state dicts; ``predictor``
    (:func:`predictor_record`); the training labels trained on (``labels``), the run's corrected
    ones, the given and (when known) clean ones; the data-file rows of the fitted samples and of
    the validation split; predicted training and test ranks; the epoch's validation MAE; the
    sigma search's outcome; the relabeling rule's noise std."""

    config: dict[str, Any]
    fingerprint: dict[str, Any]
    epoch: int
    world_size: int
    model: dict[str, torch.Tensor]
    head: Optional[dict[str, torch.Tensor]]
    predictor: dict[str, Any]
    labels: torch.Tensor
    corrected_labels: torch.Tensor
    given_labels: torch.Tensor
    clean_labels: Optional[torch.Tensor]
    train_rows: torch.Tensor
    val_rows: Optional[torch.Tensor]
    train_pred: torch.Tensor
    test_pred: torch.Tensor
    val_mae: Optional[float]
    sigma_choice: Optional[dict[str, Any]]
    label_noise_std: Optional[float]

    @classmethod
    def of_epoch(cls, config: TrainConfig, model: torch.nn.Module, head: Optional[torch.nn.Module],
                 **entries: Any) -> "EpochState":
        """The record of an epoch: ``config``, the ``model``'s and ``head``'s state dicts, and the
        other fields as they are given (tensors moved to the CPU)."""
        tensors = {k: _cpu(v) if isinstance(v, torch.Tensor) or v is None else v for k, v in entries.items()}
        return cls(config=config.to_dict(), model=model.state_dict(),
                   head=None if head is None else {k: v.cpu() for k, v in head.state_dict().items()},
                   **tensors)

    def to_dict(self) -> dict[str, Any]:
        """The saved dict, in the order of the fields (not a deep copy: the tensors are shared)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> "EpochState":
        """The record of a saved dict of the current format (extra entries of ``best.pt`` or
        ``checkpoint.pt`` are left out)."""
        return cls(**{f.name: state[f.name] for f in dataclasses.fields(cls)})


def _checked_format(state: Any, path: Path) -> dict[str, Any]:
    """The state read from ``path``, which must be a sol_ext checkpoint of the current format.

    Raises:
        CheckpointMismatch: no sol_ext checkpoint, or one of another format.
    """
    if not isinstance(state, dict) or state.get("format_version") != FORMAT_VERSION:
        raise CheckpointMismatch(f"{str(path)!r} is not a sol_ext checkpoint of format "
                                 f"{FORMAT_VERSION}; train the run again, or with another --output.")
    return state


@dataclass
class SelectedEpoch:
    """``best.pt``: the selected epoch's :class:`EpochState`, its test embeddings and the audit's
    per-sample arrays (``[N, n]`` probabilities: for the selected epoch only)."""

    state: EpochState
    test_embeddings: torch.Tensor
    audit: Optional[dict[str, torch.Tensor]]

    def to_dict(self) -> dict[str, Any]:
        return {**self.state.to_dict(), "test_embeddings": self.test_embeddings, "audit": self.audit}

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> "SelectedEpoch":
        return cls(EpochState.from_dict(state), state["test_embeddings"], state["audit"])


@dataclass
class RunState:
    """``checkpoint.pt``: the epoch's :class:`EpochState` and what a run needs to continue after it:
    the optimizer, the shuffling generator, the per-epoch history, the selected epoch so far and the
    time spent; with ``weight_ema`` (the state's "model" is then the average), the trained model
    and the average's step count."""

    state: EpochState
    optimizer: torch.optim.Optimizer
    generator: torch.Generator
    history: list[dict[str, Any]]
    best_epoch: int
    elapsed_s: float
    trained_model: Optional[torch.nn.Module] = None
    averaged_steps: Optional[int] = None

    def to_dict(self) -> dict[str, Any]:
        """The saved dict: the epoch's state, then what resuming needs (torch's random state too)."""
        extra = {} if self.trained_model is None else {
            "trained_model": self.trained_model.state_dict(), "weight_ema_steps": self.averaged_steps}
        return {**self.state.to_dict(), "optimizer": self.optimizer.state_dict(),
                "history": self.history, "best_epoch": self.best_epoch,
                "torch_rng": torch.get_rng_state(), "generator_rng": self.generator.get_state(),
                "elapsed_s": self.elapsed_s, **extra}


def load_run_state(run_dir: Path) -> dict[str, Any]:
    """The selected model of the run in ``run_dir``: ``best.pt``, else the last checkpoint."""
    run_dir = Path(run_dir)
    best = run_dir / BEST_NAME
    return load_checkpoint(best if best.is_file() else run_dir / CHECKPOINT_NAME)


def run_paths(config: dict[str, Any], read_from: Optional[str]) -> dict[str, Optional[str]]:
    """``data``, ``test_data`` and ``weights`` of a run's ``config`` (a dict) as that run read them:
    the config keeps them as typed, so a relative path is taken from ``read_from``, the working folder
    of the run (:func:`predictor_record`), where that file or folder still is. A built-in data set's
    name stays a name, and a run saved before this record keeps its paths as typed."""
    from .data import is_builtin

    def located(given: Optional[str]) -> Optional[str]:
        if not given or read_from is None or is_builtin(given) or Path(given).is_absolute():
            return given
        there = Path(read_from) / given
        return str(there) if there.exists() else given

    return {key: located(config.get(key)) for key in ("data", "test_data", "weights")}


def _with_paths_located(config: TrainConfig, read_from: Optional[str]) -> TrainConfig:
    """``config`` with each relative data path that exists from ``read_from`` (the working folder it
    was given in) as a resolved absolute path, and each absolute one resolved, so that two spellings
    of one file compare equal."""
    located = {}
    for key, given in run_paths(dataclasses.asdict(config), read_from).items():
        if given and Path(given).exists() and (read_from is not None or Path(given).is_absolute()):
            located[key] = str(Path(given).resolve())
    return dataclasses.replace(config, **located) if located else config


def run_data(run_dir: Path, model=None) -> list[tuple[str, Optional[str]]]:
    """``(what, path)`` of the data files the run in ``run_dir`` was trained on (from its loaded
    ``model`` where given), found from any working folder: inputs no output may replace."""
    if model is not None:
        config, read_from = dataclasses.asdict(model.config), model.read_from
    else:
        state = load_run_state(run_dir)
        config, read_from = state.get("config", {}), (state.get("predictor") or {}).get("read_from")
    paths = run_paths(config, read_from)
    return [(f"the training data of {run_dir}", paths["data"]),
            (f"the test data of {run_dir}", paths["test_data"])]


class CheckpointMismatch(ValueError):
    """A checkpoint was written by a run with another configuration or other data."""


def _temporary_name(path: Path) -> Path:
    """A name beside ``path`` that no other process or call uses: two runs writing the same
    file never share a half-written temporary."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def _write_error(path: Path, exc: OSError) -> OSError:
    """``exc`` (of opening the temporary or renaming it) as an error about ``path`` itself: the
    temporary's name means nothing to the user."""
    if Path(path).is_dir():
        reason = "is a folder, expected a file path"
    elif not Path(path).parent.is_dir():
        reason = f"the folder {str(Path(path).parent)!r} does not exist"
    else:
        reason = (exc.strerror or type(exc).__name__).lower()
    new = type(exc)(f"cannot write {str(path)!r}: {reason}.")
    new.errno = exc.errno
    return new


def _written_in_place(path: Path) -> bool:
    """Whether ``path`` leads to something other than a regular file (``/dev/null``, a named pipe, a
    terminal): that is written into, as a shell's ``>`` would; renaming a file over it would remove a
    device node or a pipe."""
    target = Path(os.path.realpath(path))
    return target.exists() and not target.is_file()


def _write_in_place(path: Path, write: Callable[[BinaryIO], None]) -> None:
    try:
        with open(path, "wb") as f:
            write(f)
    except OSError as exc:
        raise _write_error(path, exc) from None


def _replace_atomically(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Call ``write`` on a fresh temporary file, flush it to disk and rename it to ``path``; a
    reader sees the old file or the new one, never a part. The temporary goes on failure.

    A symbolic link is followed (its target is replaced, not the link), and a path that is not a
    regular file is written in place (:func:`_written_in_place`)."""
    if _written_in_place(path):
        _write_in_place(path, write)
        return
    path = Path(os.path.realpath(path)) if Path(path).is_symlink() else Path(path)
    tmp = _temporary_name(path)
    with removed_if_stopped(tmp):  # also by a second Ctrl-C, which ends the command at once
        try:
            # O_EXCL: never write through a file someone else made; the umask sets the mode
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            except OSError as exc:
                raise _write_error(path, exc) from None
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.replace(tmp, path)
            except OSError as exc:
                raise _write_error(path, exc) from None
        except BaseException:  # also Ctrl-C: leave no temporary behind
            tmp.unlink(missing_ok=True)
            raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename, so that a reader never
    sees a half-written file."""
    _replace_atomically(path, lambda f: f.write(data))


def atomic_write_stream(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Call ``write`` on a temporary file beside ``path`` (it writes the content in as many pieces as it
    likes) and rename it to ``path``: a reader never sees a half-written file, and an error or a Ctrl-C
    in ``write`` leaves the old file and no temporary."""
    _replace_atomically(path, write)


def atomic_write_files(contents: dict[Path, bytes]) -> None:
    """Write several files that belong together (a program and its sidecar): every temporary
    first, then the renames, so that an error or a Ctrl-C while writing leaves the old files and
    no temporary."""
    written: list[tuple[Path, Path]] = []
    with contextlib.ExitStack() as removed:  # also by a second Ctrl-C, which ends the command at once
        try:
            for path, data in contents.items():
                if _written_in_place(Path(path)):
                    _write_in_place(Path(path), lambda f, data=data: f.write(data))
                    continue
                path = Path(os.path.realpath(path)) if Path(path).is_symlink() else Path(path)
                tmp = _temporary_name(Path(path))
                removed.enter_context(removed_if_stopped(tmp))
                try:
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
                except OSError as exc:
                    raise _write_error(Path(path), exc) from None
                written.append((tmp, Path(path)))
                try:
                    with os.fdopen(fd, "wb") as f:
                        f.write(data)
                        f.flush()
                        os.fsync(f.fileno())
                except OSError as exc:  # a full disk: one line naming the file
                    raise _write_error(Path(path), exc) from None
            for tmp, path in written:
                try:
                    os.replace(tmp, path)
                except OSError as exc:
                    raise _write_error(path, exc) from None
        except BaseException:  # also Ctrl-C: leave no temporary behind
            for tmp, _ in written:
                tmp.unlink(missing_ok=True)
            raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def save_checkpoint(path: Path, state: dict[str, Any] | SelectedEpoch | RunState) -> None:
    """Save ``state`` (a record, or a dict of tensors and plain Python values) atomically to ``path``."""
    entries = state if isinstance(state, dict) else state.to_dict()
    _replace_atomically(path, lambda f: torch.save({"format_version": FORMAT_VERSION, **entries}, f))


def verify_checksums(path: Path) -> None:
    """Check every entry of the checkpoint ``path`` (a zip file, as ``torch.save`` writes it) against
    the CRC-32 stored beside it when it was written: ``torch.load`` does not, so bytes changed on
    the disk would otherwise load as other weights.

    Raises:
        CheckpointMismatch: an entry's content no longer matches its checksum, or the file is no
            zip file (damaged, or not written by sol-ext).
    """
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise CheckpointMismatch(f"cannot read checkpoint {str(path)!r} ({type(exc).__name__}); it is "
                                 f"damaged or not a sol_ext checkpoint: restore it from a copy, or "
                                 f"train the run again.") from None
    if bad is not None:
        raise CheckpointMismatch(f"checkpoint {str(path)!r} is damaged: its part {bad.split('/')[-1]!r} "
                                 f"no longer matches the checksum stored when sol-ext wrote it; "
                                 f"restore the file from a copy, or train the run again.")


def load_checkpoint(path: Path, config: TrainConfig | None = None,
                    fingerprint: dict[str, Any] | None = None, *,
                    mmap: bool = False) -> dict[str, Any]:
    """Load a checkpoint; with ``config``/``fingerprint`` given, check that it belongs to them.

    ``mmap=True`` maps the tensors from the file instead of reading them (fast for a check);
    otherwise the file's checksums are verified first (:func:`verify_checksums`).

    Raises:
        FileNotFoundError: no checkpoint at ``path``.
        CheckpointMismatch: the checkpoint's configuration or data differ.
    """
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {str(path)!r}; expected the output folder of a "
                                f"'sol-ext train' run.")
    if not mmap:
        verify_checksums(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # a truncated or foreign file: say which file, not the pickle detail
        raise CheckpointMismatch(f"cannot read checkpoint {str(path)!r} ({type(exc).__name__}); "
                                 f"it is damaged or not a sol_ext checkpoint.") from exc
    state = _checked_format(state, path)
    if config is not None:
        saved = TrainConfig.from_dict(state["config"])
        # a data path names a file: the run's config.toml names it by an absolute path, the run by
        # the path it was typed as
        read_from = (state.get("predictor") or {}).get("read_from")
        diff = config_mismatches(_with_paths_located(saved, read_from), _with_paths_located(config, os.getcwd()))
        if diff:
            raise CheckpointMismatch(
                f"checkpoint {str(path)!r} was written with another configuration "
                f"({'; '.join(diff)}). Resume with the same options, or choose another --output.")
    if fingerprint is not None and state.get("fingerprint") != fingerprint:
        raise CheckpointMismatch(
            f"checkpoint {str(path)!r} was trained on other data (saved {state.get('fingerprint')}, "
            f"now {fingerprint}). Resume with the same data, or choose another --output.")
    return state


def check_resumable(path: Path, config: TrainConfig, fingerprint: dict[str, Any]) -> int:
    """Check that the checkpoint at ``path`` can continue a run of ``config`` on data with
    ``fingerprint``, without reading its tensors; return its epoch. Call it before changing
    anything in the output folder, so that a refused ``--resume`` leaves the folder as it was.

    Raises:
        FileNotFoundError, CheckpointMismatch: as :func:`load_checkpoint`.
    """
    return int(load_checkpoint(path, config, fingerprint, mmap=True)["epoch"])


def checkpoint_epoch(path: Path) -> int | None:
    """The epoch of the checkpoint at ``path``, or None when there is none or it is unreadable."""
    try:
        return int(load_checkpoint(path, mmap=True)["epoch"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_search_record(search_dir: Path) -> dict[str, Any]:
    """The record of a sigma search in ``search_dir`` (``{"finished": {"0.25": {"val_mae": ...,
    "selected_epoch": ...}, ...}}``); an empty one where there is none or it is unreadable."""
    try:
        record = json.loads((Path(search_dir) / SIGMA_SEARCH_RECORD).read_text())
    except (OSError, ValueError):
        return {"finished": {}}
    if not isinstance(record, dict) or not isinstance(record.get("finished"), dict):
        return {"finished": {}}
    return record


def trial_dir(work_dir: Path, sigma: float) -> Path:
    """Where :class:`~sol_ext.driver.train.SigmaSearch` trains the candidate ``sigma`` inside ``work_dir``."""
    return Path(work_dir) / f"sigma{sigma:g}"


def check_resume(out_dir: Path, config: TrainConfig, fingerprint: dict[str, Any]) -> int:
    """Check, without changing anything, that the run in ``out_dir`` (its checkpoint, or the
    trials of its interrupted sigma search) can continue as a run of ``config`` on data with
    ``fingerprint``; return the epochs it has run.

    Raises:
        FileNotFoundError: nothing to resume in ``out_dir``.
        CheckpointMismatch: another configuration or other data.
        ValueError: naming ``epochs=``: fewer epochs than the run has already run.
    """
    out_dir = Path(out_dir)
    search = None
    if not (out_dir / CHECKPOINT_NAME).is_file() and config.searches_sigma:
        search = sigma_search_progress(out_dir)
    if search is None:
        done = check_resumable(out_dir / CHECKPOINT_NAME, config, fingerprint)
    else:
        done = 0
        for sigma in SIGMA_GRID:
            path = trial_dir(out_dir / SIGMA_SEARCH_NAME, sigma) / CHECKPOINT_NAME
            if path.is_file():
                trial = dataclasses.replace(config, sigma=float(sigma))
                done = max(done, check_resumable(path, trial, fingerprint))
    if config.epochs < done:
        raise ValueError(f"epochs={config.epochs} is fewer than the {done} epochs the run in "
                         f"{out_dir} has already run; resume with epochs={done} or more.")
    return done


def default_output(cfg: TrainConfig, paper: bool = False) -> Path:
    """``runs/<data>-<method>[-paper]-<noise><kappa>-seed<k>``: ``sol-paper`` as ``sol-ext
    compare`` names sol with ``--paper``; ``none`` without a kappa where no noise is added."""
    data = Path(cfg.data).name.split(".")[0] or "data"
    method = f"{cfg.method}-paper" if paper else cfg.method
    noise = "none" if cfg.noise == "none" else f"{cfg.noise}{cfg.kappa:g}"
    return Path("runs") / f"{data}-{method}-{noise}-seed{cfg.seed}"


def sigma_search_progress(out_dir: Path) -> Optional[dict[str, Any]]:
    """The interrupted sigma search in ``out_dir``: ``{"finished": [sigma, ...], "epochs":
    {sigma: last checkpointed epoch, ...}}`` (sigmas as ``"0.25"``), or None when there is none
    to resume (no trial has a checkpoint)."""
    search = Path(out_dir) / SIGMA_SEARCH_NAME
    if not search.is_dir():
        return None
    epochs = {}
    for trial in sorted(search.glob("sigma*")):
        epoch = checkpoint_epoch(trial / CHECKPOINT_NAME) if trial.is_dir() else None
        if epoch is not None:
            epochs[trial.name[len("sigma"):]] = epoch
    if not epochs:
        return None
    finished = [s for s in read_search_record(search)["finished"] if s in epochs]
    return {"finished": finished, "epochs": epochs}
