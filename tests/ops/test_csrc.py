"""The C++/CUDA sources agree with themselves: the header documents exactly the ops that are registered,
and says which backends have kernels as the registrations do."""
import re

import torch
from torch._library.custom_ops import OPDEFS

import sol_ext  # noqa: F401  (loads the ops)
from common import REPO_ROOT

CSRC = REPO_ROOT / "csrc"

# "//   name(args..." at the header's op indentation: one per op it documents.
HEADER_OP = re.compile(r"^//   (\w+)\(", re.MULTILINE)
SCHEMA_DEF = re.compile(r'm\.def\(\s*"(\w+)\(')
IMPL = re.compile(r'm\.impl\("(\w+)"')


def header_ops() -> dict:
    """Each op the header lists, with the text that documents it (up to the next op)."""
    text = (CSRC / "sol_ext.h").read_text().split("#pragma once")[0]
    starts = list(HEADER_OP.finditer(text))
    return {m.group(1): text[m.start():(starts[i + 1].start() if i + 1 < len(starts) else len(text))]
            for i, m in enumerate(starts)}


def schema_ops() -> set:
    source = (CSRC / "sol_ext.cpp").read_text()
    return set(SCHEMA_DEF.findall(re.sub(r'"\s*"', "", source)))  # joins the split string literals


def ops_with_kernels_in(folder: str) -> set:
    return {name for path in (CSRC / folder).iterdir() if path.suffix in (".cpp", ".cu")
            for name in IMPL.findall(path.read_text())}


def test_the_header_lists_every_registered_op_and_no_other():
    # Ops defined in Python (torch.library.custom_op, e.g. grouped.py's plain-torch grouped sum) are not C++'s.
    registered = {name.split("::", 1)[1] for name in torch._C._dispatch_get_all_op_names()
                  if name.startswith("sol_ext::") and name not in OPDEFS}
    assert schema_ops() == registered
    assert set(header_ops()) == registered


def test_the_header_calls_no_op_cpu_only_that_has_a_cuda_kernel():
    # The composites (stochastic_order_loss.cpp) register for CUDA beside their device ops.
    composite = set(IMPL.findall((CSRC / "stochastic_order_loss.cpp").read_text()))
    with_cuda = ops_with_kernels_in("cuda") | composite
    with_cpu = ops_with_kernels_in("cpu") | composite
    assert with_cpu == schema_ops(), "every op has a CPU kernel"
    for name, doc in header_ops().items():
        if name in with_cuda:
            assert "CPU only" not in doc.replace("\n//", " ").replace("  ", " "), name


def test_each_cuda_kernel_file_has_its_cpu_twin_of_the_same_name():
    cuda = {path.stem for path in (CSRC / "cuda").glob("*.cu") if not path.stem.endswith("_common")}
    cpu = {path.stem for path in (CSRC / "cpu").glob("*.cpp")}
    assert cuda, "no CUDA sources found"
    assert cuda - cpu == set(), "CUDA kernel files without a CPU file of the same name"
