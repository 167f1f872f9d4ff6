"""Build of the fused_layernorm extension.

Build against the torch you already have:  pip install --no-build-isolation .
CUDA sources are compiled whenever torch is a CUDA build and nvcc is found
(FLN_NO_CUDA=1 turns them off).  Targets: sm_80, sm_90 and PTX for newer GPUs
(override with TORCH_CUDA_ARCH_LIST)."""
import glob
import os

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


def with_cuda() -> bool:
    if os.environ.get("FLN_NO_CUDA") == "1":
        return False
    return torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None


def extension():
    rel = lambda pattern: sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern)))
    sources = ["csrc/registration.cpp", "csrc/torch/checks.cpp", "csrc/torch/norm_ops.cpp",
               "csrc/torch/cpu_backend.cpp", "csrc/torch/meta_ops.cpp", "csrc/torch/autograd.cpp",
               "csrc/torch/add_norm_ops.cpp", "csrc/torch/add_norm_autograd.cpp"]
    # No -fvisibility=hidden: it duplicates libstdc++ template statics (the locale
    # facet ids behind operator<<) and crashed error formatting with g++ 13.
    cxx = ["-O3"]
    if not with_cuda():
        return cpp_extension.CppExtension("fused_layernorm._C", sources, extra_compile_args={"cxx": cxx})
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.0;9.0+PTX")
    sources += ["csrc/torch/cuda_backend.cpp"] + rel("csrc/kernels/cuda/inst_*.cu") + rel("csrc/kernels/add_norm/cuda/inst_*.cu")
    nvcc = ["-O3", "-lineinfo", "--expt-relaxed-constexpr"]
    if os.environ.get("FLN_PTXAS_VERBOSE") == "1":
        nvcc.append("-Xptxas=-v")
    return cpp_extension.CUDAExtension(
        "fused_layernorm._C",
        sources,
        define_macros=[("FLN_WITH_CUDA", None)],
        extra_compile_args={"cxx": cxx, "nvcc": nvcc},
    )


setup(
    name="fused_layernorm",
    version="0.1.0",
    description="Fused LayerNorm and RMSNorm kernels (CPU and CUDA) for PyTorch",
    packages=find_packages(include=["fused_layernorm", "fused_layernorm.*"]),
    ext_modules=[extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
    python_requires=">=3.9",
    install_requires=["torch"],
)
