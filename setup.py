"""Build of the fused_layernorm extension.

Build against the torch you already have:  pip install --no-build-isolation .
CUDA sources are compiled whenever torch is a CUDA build and nvcc is found
(FLN_NO_CUDA=1 turns them off).  Targets: sm_80, sm_90 and PTX for newer GPUs
(override with TORCH_CUDA_ARCH_LIST)."""
import glob
import os
import sys

from setuptools import find_packages, setup

try:
    import torch
    from torch.utils import cpp_extension
except ImportError as e:  # pragma: no cover - build-time message
    raise RuntimeError(
        "fused_layernorm builds against an installed torch: install torch first, then "
        "`pip install --no-build-isolation .`"
    ) from e

ROOT = os.path.dirname(os.path.abspath(__file__))

# Our C++ autograd uses torch's internal autograd API (torch/csrc/autograd),
# which changes between minor versions (2.13 moved nodes to intrusive_ptr):
# a torch outside the tested range stops here with the reason instead of in
# the compiler.  FLN_ALLOW_UNTESTED_TORCH=1 tries the build anyway.
_TORCH_TESTED = "2.11 and 2.15"
_TORCH_MAJOR_MINOR = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2])
if not (2, 11) <= _TORCH_MAJOR_MINOR < (2, 16) and os.environ.get("FLN_ALLOW_UNTESTED_TORCH") != "1":
    raise RuntimeError(
        f"fused_layernorm is not tested with torch {torch.__version__} (tested: {_TORCH_TESTED}; its C++ "
        "autograd API changes between versions); install a tested torch first, e.g. "
        "pip install 'torch>=2.11,<2.16', or set FLN_ALLOW_UNTESTED_TORCH=1 to try the build"
    )


def check_build_tools():
    """pip builds a wheel: with setuptools older than 70.1 that needs the
    `wheel` package, whose absence otherwise shows as "invalid command
    'bdist_wheel'".  Without ninja the sources compile one at a time and
    every build starts from scratch."""
    if any(cmd in sys.argv for cmd in ("bdist_wheel", "dist_info", "editable_wheel")):
        try:
            import setuptools.command.bdist_wheel  # noqa: F401  (setuptools >= 70.1)
        except ImportError:
            try:
                import wheel  # noqa: F401
            except ImportError:
                raise RuntimeError("fused_layernorm: building a wheel needs the `wheel` package with this "
                                   "setuptools: pip install wheel (or pip install -U setuptools)") from None
    if not cpp_extension.is_ninja_available():
        print("fused_layernorm: ninja not found, compiling one source at a time with no incremental "
              "rebuilds (pip install ninja)", file=sys.stderr)


check_build_tools()


def with_cuda() -> bool:
    if os.environ.get("FLN_NO_CUDA") == "1":
        return False
    return torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None


def extension():
    rel = lambda pattern: sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern)))
    sources = ["csrc/registration.cpp", "csrc/torch/checks.cpp", "csrc/torch/norm_ops.cpp",
               "csrc/torch/cpu_backend.cpp", "csrc/torch/meta_ops.cpp", "csrc/torch/autograd.cpp",
               "csrc/torch/add_norm_ops.cpp", "csrc/torch/add_norm_autograd.cpp",
               "csrc/torch/rope_ops.cpp", "csrc/torch/rope_autograd.cpp",
               "csrc/torch/softmax_ops.cpp", "csrc/torch/softmax_autograd.cpp"]
    # The CPU kernels, once per instruction set (csrc/torch/cpu_kernels.h).
    sources += ["csrc/torch/cpu_kernels_base.cpp", "csrc/torch/cpu_kernels_avx2.cpp",
                "csrc/torch/cpu_kernels_avx512.cpp"]
    # No -fvisibility=hidden: it duplicates libstdc++ template statics (the locale
    # facet ids behind operator<<) and crashed error formatting with g++ 13.
    # -g0: debug info doubles the compile time of every torch-including file
    # (FLN_DEBUG=1 keeps it).
    cxx = ["-O3"] + ([] if os.environ.get("FLN_DEBUG") == "1" else ["-g0"])
    link = []
    # at::parallel_for is inline: without -fopenmp it runs every loop on one
    # thread.  The library links libgomp.so.1, which resolves to the copy torch
    # has already loaded, so torch.set_num_threads governs our loops too.
    if sys.platform.startswith("linux"):
        cxx.append("-fopenmp")
        link.append("-fopenmp")
    if not with_cuda():
        return cpp_extension.CppExtension("fused_layernorm._C", sources, extra_compile_args={"cxx": cxx},
                                          extra_link_args=link)
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.0;9.0+PTX")
    sources += ["csrc/torch/cuda_backend.cpp"] + rel("csrc/kernels/cuda/inst_*.cu") + rel("csrc/kernels/add_norm/cuda/inst_*.cu")
    sources += rel("csrc/kernels/rope/cuda/inst_*.cu") + rel("csrc/kernels/softmax/cuda/inst_*.cu")
    nvcc = ["-O3", "-lineinfo", "--expt-relaxed-constexpr"]
    if os.environ.get("FLN_PTXAS_VERBOSE") == "1":
        nvcc.append("-Xptxas=-v")
    return cpp_extension.CUDAExtension(
        "fused_layernorm._C",
        sources,
        define_macros=[("FLN_WITH_CUDA", None)],
        extra_compile_args={"cxx": cxx, "nvcc": nvcc},
        extra_link_args=link,
    )


setup(
    name="fused_layernorm",
    version="0.1.0",
    description="Fused LayerNorm and RMSNorm kernels (CPU and CUDA) for PyTorch",
    packages=find_packages(include=["fused_layernorm", "fused_layernorm.*"]),
    ext_modules=[extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
    python_requires=">=3.10",
    install_requires=["torch"],
)
