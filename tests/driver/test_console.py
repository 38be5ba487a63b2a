"""The lines a command prints beside its results (sol_ext.driver.console)."""

from sol_ext.driver.console import note, say, warn


def test_progress_goes_to_stdout_and_warnings_and_notes_to_stderr(capsys):
    say("epoch 1/2")
    warn("few samples")
    note("no plots")
    out, err = capsys.readouterr()
    assert out == "epoch 1/2\n"
    assert err == "sol-ext: warning: few samples\nsol-ext: note: no plots\n"
