"""erf and the logistic sigmoid (expit) as vectorised NumPy code.

Why here and not SciPy: these two functions were rlx-cpu's only use of SciPy, a 113 MB install
(plus its own OpenBLAS copy) for two ufuncs. erf uses the rational approximations of Cephes'
``ndtr.c`` (W. J. Cody's forms; what ``scipy.special.erf`` computes too): max relative error about
1e-16 in float64 (tests/test_cpu_special.py checks it against ``math.erf``). Inputs narrower than
float64 are evaluated in float64 and rounded once, so float32 results are correctly rounded in
practice; expit keeps float32 in float32 (one ``exp``, ~1 ulp), like SciPy's float32 loop.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# Cephes ndtr.c: erfc(x) = exp(-x^2) P(x)/Q(x) for 1 <= x < 8, exp(-x^2) R(x)/S(x) for x >= 8
# (Q and S monic, leading 1 left out); erf(x) = x T(x^2)/U(x^2) for |x| < 1 (U monic).
_P = (2.46196981473530512524e-10, 5.64189564831068821977e-1, 7.46321056442269912687e0,
      4.86371970985681366614e1, 1.96520832956077098242e2, 5.26445194995477358631e2,
      9.34528527171957607540e2, 1.02755188689515710272e3, 5.57535335369399327526e2)
_Q = (1.32281951154744992508e1, 8.67072140885989742329e1, 3.54937778887819891062e2,
      9.75708501743205489753e2, 1.82390916687909736289e3, 2.24633760818710981792e3,
      1.65666309194161350182e3, 5.57535340817727675546e2)
_R = (5.64189583547755073984e-1, 1.27536670759978104416e0, 5.01905042251180477414e0,
      6.16021097993053585195e0, 7.40974269950448939160e0, 2.97886665372100240670e0)
_S = (2.26052863220117276590e0, 9.39603524938001434673e0, 1.20489539808096656605e1,
      1.70814450747565897222e1, 9.60896809063285878198e0, 3.36907645100081516050e0)
_T = (9.60497373987051638749e0, 9.00260197203842689217e1, 2.23200534594684319226e3,
      7.00332514112805075473e3, 5.55923013010394962768e4)
_U = (3.35617141647503099647e1, 5.21357949780152679795e2, 4.59432382970980127987e3,
      2.26290000613890934246e4, 4.92673942608635921086e4)
# exp(-x^2) underflows to 0 in float64 past here, so erfc(x) = 0 and erf(x) = +-1 exactly.
_MAXLOG = 7.09782712893383996843e2


def _polevl(x: np.ndarray, coef: tuple[float, ...], monic: bool) -> np.ndarray:
    acc = np.ones_like(x) if monic else np.full_like(x, coef[0])
    for c in coef if monic else coef[1:]:
        acc *= x
        acc += c
    return acc


def _erfc_tail(ax: np.ndarray) -> np.ndarray:
    """erfc(|x|) for |x| >= 1 (float64 in, float64 out)."""
    z = np.exp(-ax * ax)
    mid = ax < 8.0
    num = np.where(mid, _polevl(ax, _P, False), _polevl(ax, _R, False))
    den = np.where(mid, _polevl(ax, _Q, True), _polevl(ax, _S, True))
    return np.where(ax * ax > _MAXLOG, 0.0, z * num / den)


def erf(x: Any, out: np.ndarray | None = None) -> np.ndarray:
    """The error function, elementwise; ``out`` (any float dtype, x's shape) receives it if given."""
    a = np.asarray(x)
    x64 = a.astype(np.float64, copy=False)
    ax = np.abs(x64)
    small = ax < 1.0
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        z = x64 * x64
        inner = x64 * _polevl(z, _T, False) / _polevl(z, _U, True)
        outer = np.copysign(1.0 - _erfc_tail(np.where(small, 1.0, ax)), x64)
    r = np.where(small, inner, outer)  # NaN stays NaN: both branches carry it
    if out is None:
        res: np.ndarray = r.astype(a.dtype if a.dtype.kind not in "biu" else np.float64, copy=False)
        return res
    np.copyto(out, r, casting="unsafe")
    return out


def expit(x: Any, out: np.ndarray | None = None) -> np.ndarray:
    """The logistic sigmoid 1 / (1 + exp(-x)), elementwise, without overflow for any x."""
    a = np.asarray(x)
    # float32/float64 keep their precision; narrower floats (float16, bfloat16) and ints go through
    # float64 so the one rounding at the end is the only error.
    w = a if a.dtype in (np.float32, np.float64) else a.astype(np.float64)
    # exp(-x) overflows to inf for very negative x, and 1 / (1 + inf) = 0 is then the right answer;
    # elsewhere both steps round once, so the result is within ~2 ulp for every x.
    with np.errstate(over="ignore"):
        r = np.asarray(np.exp(-w))  # a 0-d input gives a NumPy scalar: make it an array to update in place
    r += 1.0
    np.reciprocal(r, out=r)
    if out is None:
        res: np.ndarray = r.astype(a.dtype if a.dtype.kind not in "biu" else np.float64, copy=False)
        return res
    np.copyto(out, r, casting="unsafe")
    return out
