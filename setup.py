"""Build sol_ext: fused C++ (and, when possible, CUDA) kernels for Stochastic Order Learning.

The extension is compiled against the torch installed in the environment it goes into:
`pip install .` finds that torch through the in-tree build backend (build_backend/), and
`pip install --no-build-isolation .` imports it directly. No torch is downloaded for the build.

The CUDA kernels are compiled, as torchvision's are, when this machine can run them: a GPU is visible
to a CUDA build of torch and a CUDA toolkit is found. They are then built for the visible GPU's
architecture. Compiling them for other GPUs on a machine without one takes minutes; ask for it.

Switches (environment variables):
  SOL_EXT_FORCE_CUDA=1   compile the CUDA kernels without a visible GPU too (fails if it can't)
  SOL_EXT_CPU_ONLY=1     never compile the CUDA kernels
  SOL_EXT_DEBUG=1        -O0 -g host code, -G -lineinfo device code
  SOL_EXT_CPU_CAPABILITIES  the CPU kernel builds besides DEFAULT, comma separated (default on x86-64:
                         "avx2,avx512", those the compiler can build; "" for DEFAULT only). The best one the
                         CPU supports runs (SOL_EXT_CPU_CAPABILITY at run time overrides; docs/performance.md)
  SOL_EXT_NVCC_FLAGS     extra nvcc flags, space separated
  TORCH_CUDA_ARCH_LIST   GPU architectures (default: the visible GPU's; "8.0;9.0", i.e. A100 and
                         H100/H200, when forced without one)
  CUDA_HOME              CUDA toolkit root (default /usr/local/cuda when it exists)
  MAX_JOBS               parallel compile jobs
"""
import glob
import os
import shutil
import sys

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def _flag(name: str) -> bool:
    return os.environ.get(name, "0").strip().lower() in ("1", "true", "yes", "on")


def _say(message: str) -> None:
    print(f"[sol_ext setup] {message}", file=sys.stderr)


# torch finds the toolkit from CUDA_HOME, else from the `nvcc` on PATH; a wrapper script there
# (such as /usr/local/bin/nvcc -> /usr/local/cuda-X/bin/nvcc) makes it guess the root wrongly and the
# link fails on -lcudart. Point it at the real toolkit before torch reads the variable.
if not os.environ.get("CUDA_HOME") and not os.environ.get("CUDA_PATH"):
    if os.path.isfile("/usr/local/cuda/bin/nvcc"):
        os.environ["CUDA_HOME"] = "/usr/local/cuda"

try:
    import torch
    from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension
except ImportError:
    sys.exit(
        "sol_ext builds against the torch installed where it will run, and none is importable.\n"
        "Install torch first, then sol_ext:\n"
        "    pip install torch\n"
        "    pip install ."
    )


def _want_cuda() -> bool:
    if _flag("SOL_EXT_CPU_ONLY"):
        _say("CUDA kernels: off (SOL_EXT_CPU_ONLY=1)")
        return False
    has_toolkit = CUDA_HOME is not None and os.path.isfile(os.path.join(CUDA_HOME, "bin", "nvcc"))
    has_cuda_torch = torch.version.cuda is not None
    if _flag("SOL_EXT_FORCE_CUDA"):
        if not (has_toolkit and has_cuda_torch):
            sys.exit(
                f"SOL_EXT_FORCE_CUDA=1 but the CUDA toolkit (CUDA_HOME={CUDA_HOME}) or a CUDA build of torch "
                f"(torch {torch.__version__}, CUDA {torch.version.cuda}) is missing."
            )
        _say("CUDA kernels: on (SOL_EXT_FORCE_CUDA=1)")
        return True
    if has_toolkit and has_cuda_torch and torch.cuda.is_available():
        _say(f"CUDA kernels: on ({torch.cuda.get_device_name(0)} visible, toolkit at {CUDA_HOME}, "
             f"torch built with CUDA {torch.version.cuda})")
        return True
    if not has_cuda_torch:
        why = f"torch {torch.__version__} is a CPU build"
    elif not has_toolkit:
        why = "no CUDA toolkit found (set CUDA_HOME)"
    else:
        why = "no GPU visible; SOL_EXT_FORCE_CUDA=1 compiles them anyway"
    _say(f"CUDA kernels: off ({why})")
    return False


def _cuda_header_fallbacks() -> list:
    """torch's CUDA headers include cuBLAS/cuSPARSE headers that a slim toolkit may lack; the
    nvidia-* wheels that come with a CUDA build of torch carry them. They are added with -isystem
    so that the toolkit's own headers win wherever both exist."""
    toolkit_include = os.path.join(CUDA_HOME, "include")
    if os.path.isfile(os.path.join(toolkit_include, "cublas_v2.h")):
        return []
    found = []
    for site in {os.path.dirname(os.path.dirname(torch.__file__))}:
        for header in glob.glob(os.path.join(site, "nvidia", "*", "include", "cublas_v2.h")):
            found.append(os.path.dirname(header))
    if found:
        _say(f"cuBLAS/cuSPARSE headers from {found[0]}")
    return [flag for path in found[:1] for flag in ("-isystem", path)]


# What each CPU capability's kernels (csrc/cpu/isa/<name>.cpp) need of the compiler: their target (GCC's
# pragma, clang's attribute) over a function using an intrinsic of the width.
_CPU_CAPABILITY_TARGETS = {
    "avx2": ("avx2,fma,bmi,bmi2,popcnt", "__m256 f(__m256 a, __m256 b) { return _mm256_fmadd_ps(a, b, _mm256_max_ps(a, b)); }"),
    "avx512": ("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,bmi,bmi2,popcnt",
               "__m512 f(__m512 a, __m512 b) { return _mm512_fmadd_ps(a, b, _mm512_max_ps(a, b)); }"),
}


def _probe_source(target: str, function: str) -> str:
    return (f"#include <immintrin.h>\n#if defined(__clang__)\n"
            f"#pragma clang attribute push(__attribute__((target(\"{target}\"))), apply_to = function)\n"
            f"{function}\n#pragma clang attribute pop\n#else\n#pragma GCC target(\"{target}\")\n{function}\n#endif\n")


def _cpu_capabilities() -> list:
    """The CPU capabilities built besides DEFAULT: on x86-64 those asked for (all by default) that the
    compiler builds; none elsewhere (the DEFAULT kernels are then the architecture's own)."""
    import platform
    import subprocess
    import sysconfig
    import tempfile

    if platform.machine().lower() not in ("x86_64", "amd64"):
        _say(f"CPU kernels: DEFAULT only ({platform.machine()} is not x86-64)")
        return []
    asked = os.environ.get("SOL_EXT_CPU_CAPABILITIES", "avx2,avx512")
    wanted = [name.strip().lower() for name in asked.split(",") if name.strip()]
    unknown = sorted(set(wanted) - set(_CPU_CAPABILITY_TARGETS))
    if unknown:
        sys.exit(f"SOL_EXT_CPU_CAPABILITIES={asked!r} names {unknown}: use a comma-separated subset of "
                 f"{', '.join(_CPU_CAPABILITY_TARGETS)} (or '' for DEFAULT only)")
    compiler = (os.environ.get("CXX") or sysconfig.get_config_var("CXX") or "c++").split()
    built = []
    with tempfile.TemporaryDirectory() as folder:
        for name in wanted:
            source = os.path.join(folder, f"{name}.cpp")
            with open(source, "w") as f:
                f.write(_probe_source(*_CPU_CAPABILITY_TARGETS[name]))
            result = subprocess.run(compiler + ["-O2", "-c", source, "-o", os.path.join(folder, f"{name}.o")],
                                    capture_output=True, text=True)
            if result.returncode == 0:
                built.append(name)
            else:
                _say(f"CPU kernels: no {name.upper()} build ({' '.join(compiler)} cannot compile it)")
    _say(f"CPU kernels: {', '.join(['DEFAULT'] + [name.upper() for name in built])}; the best the CPU supports runs")
    return built


def _extension():
    debug = _flag("SOL_EXT_DEBUG")
    with_cuda = _want_cuda()
    sources = sorted(glob.glob("csrc/*.cpp") + glob.glob("csrc/cpu/*.cpp") + glob.glob("csrc/cpu/isa/*.cpp"))
    # OpenMP: without it at::parallel_for runs every kernel on one thread. -fno-trapping-math lets
    # GCC vectorize the hinge loops (it changes no result; sol_ext never enables FP traps).
    # No -march: the kernels of each capability are compiled for it by a target pragma in their own
    # file (csrc/cpu/isa/), and the binary runs on any machine of its architecture.
    cxx_flags = ["-O0", "-g"] if debug else ["-O3", "-fno-trapping-math"]
    cxx_flags += ["-fopenmp", f'-DSOL_EXT_TORCH_VERSION="{torch.__version__}"']
    cxx_flags += [f"-DSOL_EXT_CPU_{name.upper()}" for name in _cpu_capabilities()]
    extra_compile_args = {"cxx": cxx_flags}
    extension = CppExtension
    if with_cuda:
        if not os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip():
            # torch's build helper compiles for the visible GPUs; without one to query it fails.
            if torch.cuda.is_available():
                capabilities = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
                os.environ["TORCH_CUDA_ARCH_LIST"] = ";".join(f"{major}.{minor}" for major, minor in capabilities)
            else:
                os.environ["TORCH_CUDA_ARCH_LIST"] = "8.0;9.0"
        _say(f"CUDA architectures: {os.environ['TORCH_CUDA_ARCH_LIST']}")
        sources += sorted(glob.glob("csrc/cuda/*.cu") + glob.glob("csrc/cuda/*.cpp"))
        nvcc_flags = ["-G", "-lineinfo"] if debug else ["-O3", "-lineinfo"]
        nvcc_flags += [f'-DSOL_EXT_TORCH_VERSION="{torch.__version__}"']
        nvcc_flags += _cuda_header_fallbacks()
        nvcc_flags += os.environ.get("SOL_EXT_NVCC_FLAGS", "").split()
        extra_compile_args["nvcc"] = nvcc_flags
        extra_compile_args["cxx"] = cxx_flags + ["-DSOL_EXT_WITH_CUDA"]
        extension = CUDAExtension
    _say(f"torch {torch.__version__}; {len(sources)} sources; {'debug' if debug else 'release'} build")
    return extension(
        name="sol_ext._C",
        sources=sources,
        include_dirs=[os.path.join(ROOT, "csrc")],
        extra_compile_args=extra_compile_args,
        extra_link_args=["-fopenmp"],
        py_limited_api=False,
    )


if shutil.which("ninja") is None:
    _say("ninja not found: compiling one file at a time (pip install ninja to build faster)")

# The program and the integrations, each an extra; `dev` is everything the test suite, the lint and the
# documentation site use, pinned where the tests compare against a package exactly (scripts/setup.sh
# installs it).
TRAIN = [  # sol-ext and what it is built of (sol_ext.driver: load_run, SOLRanker)
    "matplotlib", "tqdm", "pillow",
    "pyarrow>=16",  # table files (CSV, Parquet, Feather) and data frames
    "tomli; python_version < '3.11'", "tomli-w",  # reads and writes --config files and a run's config.toml
    "scikit-learn>=1.6",  # the estimator SOLRanker (sol_ext.driver.sklearn)
]
EXTRAS = {
    "train": TRAIN,
    "vision": ["torchvision"],  # the driver's image backbones (--encoder resnet18, ...)
    "baselines": ["coral-pytorch"],  # --method corn
    "torchmetrics": ["torchmetrics"],  # sol_ext.torchmetrics
    "lightning": ["lightning>=2.0"],  # sol_ext.lightning.SOLModule
    "hf": ["transformers>=4.46", "accelerate"],  # sol_ext.hf
    "text": ["transformers>=4.46"],  # sol-ext train --text-column/--text-encoder (sol_ext.driver.text)
    # export a trained run to ONNX (onnx, onnxscript) and run it without torch (onnxruntime)
    "onnx": ["onnx>=1.17", "onnxscript>=0.3", "onnxruntime>=1.20"],
    # the documentation site: mkdocs build --strict (mkdocs.yml); the math rendered to MathML as it builds;
    # ruff wraps the API reference's signatures (mkdocstrings formats them with it when it is there)
    "docs": ["mkdocs-material>=9.6", "mkdocstrings[python]>=1.0", "mkdocstrings-python>=2.0",
             "latex2mathml>=3.77", "ruff"],
}
EXTRAS["dev"] = TRAIN + [
    "pytest", "pytest-benchmark", "ruff==0.16.9",  # ruff pinned: new releases add checks
    "coral-pytorch", "cleanlab==2.9.*",  # the baselines the tests and benchmarks compare with
    "pandas==3.1.*", "polars==2.1.*",  # data frames as input (tests/driver/test_frames.py)
    "torchmetrics==1.9.*", "lightning==2.6.*", "transformers==5.24.*", "accelerate==1.15.*",
    "onnx==1.23.*", "onnxscript==0.7.*", "onnxruntime==1.32.*",
    # pinned: new releases change what mkdocs build --strict warns about
    "mkdocs-material==9.8.2", "mkdocstrings[python]==1.0.8", "mkdocstrings-python==2.0.11", "latex2mathml==3.81.1",
]


setup(
    name="sol_ext",
    version="0.1.0",
    description="Fused C++/CUDA kernels for Stochastic Order Learning: rank estimation from noisy labels",
    long_description=open(os.path.join(ROOT, "README.md"), encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="MIT",
    python_requires=">=3.9",
    packages=find_packages(include=["sol_ext", "sol_ext.*"]),
    py_modules=["sol_ext_launcher"],  # the command's entry point, outside the package (see there)
    # py.typed: the package has type hints; command_help.json: the commands' --help without torch
    package_data={"sol_ext": ["datasets/*", "py.typed", "driver/command_help.json"]},
    # The library (the loss, SOLHead, the ops and their kernels, metrics, intervals, label issues) needs torch
    # and numpy only; the kernels load only beside the torch they were compiled with (_extension.py checks).
    install_requires=[f"torch=={torch.__version__.split('+')[0]}", "numpy"],
    extras_require=EXTRAS,
    ext_modules=[_extension()],
    cmdclass={"build_ext": BuildExtension},
    entry_points={"console_scripts": ["sol-ext = sol_ext_launcher:main"]},
    zip_safe=False,
)
