"""rlx-cpu's ``RLX_CPU_*`` settings, declared once (``rlx doctor --settings`` lists them).

Stdlib and ``rlx_core.plugin`` only: imported by the plugin module, so discovery stays fast."""

from __future__ import annotations

from rlx_core.plugin import Setting, declare_setting

OWNER = "rlx-cpu"

THREADS = declare_setting(
    "RLX_CPU_THREADS", "int", None,
    "Threads of rlx-cpu's row pool (GEMMs left to NumPy follow OPENBLAS_NUM_THREADS: set both to cap all).",
    owner=OWNER, min=1,
    default_text="the cores this process may run on")
ADAPT = declare_setting(
    "RLX_CPU_ADAPT", "bool", True,
    "Without RLX_CPU_THREADS: run fewer threads (and cap NumPy's BLAS threads) while other processes "
    "keep some of the allowed CPUs busy (measured from /proc/stat every 0.25 s).", owner=OWNER)
REUSE_DISTANCE = declare_setting(
    "RLX_CPU_REUSE_DISTANCE", "int", 8,
    "Steps a freed arena buffer waits before reuse (lets row chains overlap); 0 = tightest memory plan.",
    owner=OWNER, min=0)
CHAIN = declare_setting("RLX_CPU_CHAIN", "bool", True,
                        "Chain consecutive row kernels into one threaded dispatch.", owner=OWNER)
CHAIN_PIECES = declare_setting(
    "RLX_CPU_CHAIN_PIECES", "int", 4,
    "Pieces a thread takes of a row chain, in turn (1 = one fixed piece: faster on a quiet machine).",
    owner=OWNER, min=1)
DIRECT_BLAS = declare_setting(
    "RLX_CPU_DIRECT_BLAS", "bool", True,
    "Fused training kernels call NumPy's OpenBLAS directly (GEMM with beta, in-place AXPY; 0: NumPy only).",
    owner=OWNER)
PRIVATE_BLAS = declare_setting(
    "RLX_CPU_PRIVATE_BLAS", "bool", True,
    "GEMMs use rlx-cpu's private single-threaded BLAS (oneDNN/OpenBLAS; 0: both off, np.matmul).",
    owner=OWNER)
ONEDNN = declare_setting(
    "RLX_CPU_ONEDNN", "bool", True,
    "f32 GEMMs use oneDNN's sgemm where its wheel is installed (0: OpenBLAS).", owner=OWNER)
NUMBA_MIN = declare_setting(
    "RLX_CPU_NUMBA_MIN", "int", 8192,
    "Elements from which a fused elementwise kernel runs as compiled Numba code instead of NumPy.",
    owner=OWNER, min=0)
FUSE_BIND = declare_setting(
    "RLX_CPU_FUSE_BIND", "bool", True,
    "Training programs fuse GEMM+update patterns into BLAS calls when they are bound.", owner=OWNER)
WEIGHT_LAYOUT = declare_setting(
    "RLX_CPU_WEIGHT_LAYOUT", "bool", True,
    "Training programs may store weights column-major so no GEMM transposes (0: all row-major).",
    owner=OWNER)
PAIR_MIN_FLOPS = declare_setting(
    "RLX_CPU_PAIR_MIN_FLOPS", "int", 1 << 62,
    "Two adjacent independent GEMMs of at least this many flops each run at once, one core each.",
    owner=OWNER, min=0, default_text="off (2**62)")
DENSE = declare_setting(
    "RLX_CPU_DENSE", "bool", True,
    "Programs of only linears, ReLUs and softmaxes (MLPs) load no Numba: NumPy kernels, oneDNN via ctypes "
    "(0: the general kernels).",
    owner=OWNER)
CONV_CHAIN = declare_setting(
    "RLX_CPU_CONV_CHAIN", "bool", True,
    "Chains of convs/max pools keep activations in oneDNN's blocked layout between convs (0: each conv "
    "reorders NCHW in and out, as before).", owner=OWNER)
DENSE_OPENMP = declare_setting(
    "RLX_CPU_DENSE_OPENMP", "bool", True,
    "MLPs' linears of >= 128K multiply-adds are one oneDNN matmul primitive (weights packed once, bias "
    "and ReLU fused) on an OpenMP team of the threads the load leaves (0: np.matmul for 1-2 rows, "
    "one-thread pieces on the row pool for more; loads no oneDNN at batch 1-2: ~15 MB less RSS).",
    owner=OWNER)
CONV_OPENMP = declare_setting(
    "RLX_CPU_CONV_OPENMP", "bool", True,
    "Each oneDNN conv (in a conv chain or alone) is one primitive on an OpenMP team of the threads the "
    "load leaves (0: one-thread primitives cut into pieces for rlx-cpu's row pool, as before).", owner=OWNER)
POOL_NUMPY = declare_setting(
    "RLX_CPU_POOL_NUMPY", "bool", True,
    "Conv chains' max pools (oneDNN's blocked layout) run as NumPy while Numba is not loaded, so a CNN "
    "without other Numba kernels loads no Numba/LLVM (ResNet-18: ~117 MB less peak RSS; 0: the Numba "
    "kernel).", owner=OWNER)
NATIVE_DISPATCH = declare_setting(
    "RLX_CPU_NATIVE_DISPATCH", "bool", True,
    "A run of oneDNN primitives (an MLP's linears and softmax, merged; with the input's and output's "
    "copies where it is the whole program) is one call of rlx-cpu's compiled dispatch loop where the "
    "rlx_cpu._dispatch extension was built at install (0: a Python loop of ctypes calls, as before; "
    "`rlx doctor --json` gives which runs, in the cpu device's details).", owner=OWNER)
STEM_CONV = declare_setting(
    "RLX_CPU_STEM_CONV", "bool", True,
    "A conv chain's convs with few input channels (a CNN's stem, such as ResNet's 3->64 7x7) run on "
    "rlx-cpu's own direct kernel (the optional rlx_cpu._stemconv extension, AVX-512 CPUs) instead of "
    "oneDNN's, on the same OpenMP team (0: oneDNN's, as before; `rlx doctor --json` gives which, in "
    "the cpu device's details).", owner=OWNER)
WINOGRAD = declare_setting(
    "RLX_CPU_WINOGRAD", "bool", True,
    "A conv chain's 3x3 stride-1 convs run as Winograd's F(4x4, 3x3) (the optional rlx_cpu._winograd "
    "extension, AVX-512 CPUs) where that measured faster than oneDNN's direct conv, in the chain's "
    "finite variant only (inputs without NaN or Inf: a NaN would spread over a 4x4 tile); results "
    "differ from the direct conv's by rounding, within 2e-5 of the outputs' largest magnitude (0: oneDNN's "
    "direct conv for all of them; `rlx doctor --json` gives which, in the cpu device's details).",
    owner=OWNER)

SETTINGS: list[Setting] = [THREADS, ADAPT, REUSE_DISTANCE, CHAIN, CHAIN_PIECES, DIRECT_BLAS, PRIVATE_BLAS,
                           ONEDNN, NUMBA_MIN, FUSE_BIND, WEIGHT_LAYOUT, PAIR_MIN_FLOPS, DENSE,
                           DENSE_OPENMP, CONV_CHAIN, CONV_OPENMP, POOL_NUMPY, NATIVE_DISPATCH,
                           STEM_CONV, WINOGRAD]
