"""The one line the sol-ext command prints for an error in its input, and what it leaves alone."""

import zlib

from sol_ext.driver.cli import build_parser
from sol_ext.driver.errors import UsageError, command_line_flags, user_error_message

FLAGS = command_line_flags(build_parser())


def test_flags_of_every_subcommand():
    assert FLAGS["label_column"] == "--label-column" and FLAGS["T"] == "--T"
    assert FLAGS["seeds"] == "--seeds" and FLAGS["csv"] == "--csv"  # compare and audit
    assert "normalize" not in FLAGS  # only "--no-normalize" sets it: not the spelling of normalize=


def test_library_argument_names_become_the_commands_flags():
    say = lambda text: user_error_message(ValueError(text), FLAGS)  # noqa: E731
    assert say("Pass the right name with label_column=") == "Pass the right name with --label-column"
    assert (say("splitting 9 samples with test_fraction=0.9 leaves an empty part")
            == "splitting 9 samples with --test-fraction 0.9 leaves an empty part")
    assert say("num_ranks=3 is too small; x_label_column=1") == "num_ranks=3 is too small; x_label_column=1"


def test_input_errors_give_their_first_line_and_bugs_none():
    assert user_error_message(UsageError("bad\nsecond line")) == "bad"
    assert user_error_message(zlib.error("Error -3")) == "Error -3"
    assert user_error_message(FloatingPointError("training diverged in epoch 3")).endswith("epoch 3")
    assert user_error_message(RuntimeError("an internal error")) is None
    assert user_error_message(KeyError("x")) is None


def test_out_of_memory_says_what_to_lower():
    exc = RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate "
                       "memory: you tried to allocate 51200000000 bytes.")
    message = user_error_message(exc, FLAGS)
    assert message.startswith("out of memory") and "--batch-size" in message
    assert len(message.splitlines()) == 1
