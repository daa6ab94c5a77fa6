"""Symbolic dimension expressions: polynomials with int coefficients over shape symbols.

A dimension (:data:`rlx_core.ir.types.Dim`) is an int, a symbol name (``"batch"``) or the canonical
string of a polynomial over symbols (``"batch*seq"``, ``"4*batch"``, ``"past+seq"``, ``"seq-1"``).
Dynamic-axes ONNX exports compute such sizes (Flatten of (batch, seq), Reshape to heads*batch,
Concat of past and new keys), so the IR carries them instead of refusing the model.

The grammar is deliberately tiny and parsed by hand (never ``eval``): ``expr := ['-'] term (('+' | '-')
term)*``, ``term := factor ('*' factor)*``, ``factor := INT | IDENT``. The canonical form sorts factors
within a term and terms by degree then name, so equal polynomials are equal strings: structure
hashing, the compile-cache key and ``==`` on shapes need no special case. This module is the one home
of dimension arithmetic: shape inference uses :func:`add`, :func:`mul`, :func:`div_exact` ... instead
of ``+``/``*`` on dims, so an op works on ints, symbols and expressions alike.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any, Union

from ..errors import ShapeError

#: A dimension: a size, a symbol name, or the canonical string of a polynomial over symbols.
Dim = Union[int, str]
#: monomial (sorted symbol names, repeated for powers) -> non-zero coefficient
Poly = dict[tuple[str, ...], int]

_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|([-+*]))")
_FIX = ("a dimension is an int >= 0, a symbol name ('batch') or a polynomial over symbols with int "
        "coefficients ('batch*seq', '4*batch', 'past+seq')")


def _bad(text: str, why: str) -> ShapeError:
    return ShapeError(f"invalid dimension expression {text!r}: {why}", fix=_FIX)


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    stripped = text.rstrip()
    while pos < len(stripped):
        m = _TOKEN.match(stripped, pos)
        if m is None or m.end() == pos:
            raise _bad(text, f"unexpected character {stripped[pos:].lstrip()[:1]!r}")
        out.append(m.group(m.lastindex or 0))
        pos = m.end()
    return out


@lru_cache(maxsize=4096)
def _parse_cached(text: str) -> tuple[tuple[tuple[str, ...], int], ...]:
    toks = _tokens(text)
    if not toks:
        raise _bad(text, "it is empty")
    poly: Poly = {}
    i = 0
    sign = 1
    if toks[0] in ("+", "-"):
        sign = -1 if toks[0] == "-" else 1
        i = 1
    while True:
        coef, syms = 1, []
        while True:
            if i >= len(toks):
                raise _bad(text, "it ends after an operator")
            tok = toks[i]
            if tok.isdigit():
                coef *= int(tok)
            elif tok.isidentifier():
                syms.append(tok)
            else:
                raise _bad(text, f"{tok!r} where a number or symbol should be")
            i += 1
            if i < len(toks) and toks[i] == "*":
                i += 1
                continue
            break
        key = tuple(sorted(syms))
        poly[key] = poly.get(key, 0) + sign * coef
        if i >= len(toks):
            break
        if toks[i] not in ("+", "-"):
            raise _bad(text, f"{toks[i]!r} where '+', '-' or '*' should be")
        sign = -1 if toks[i] == "-" else 1
        i += 1
    return tuple(sorted((k, c) for k, c in poly.items() if c))


def parse(text: str) -> Poly:
    """The polynomial a dimension string spells (a plain symbol is ``{(name,): 1}``)."""
    return dict(_parse_cached(text))


def _order(item: tuple[tuple[str, ...], int]) -> tuple[int, tuple[str, ...]]:
    return (-len(item[0]), item[0])


def to_dim(poly: Mapping[tuple[str, ...], int]) -> Dim:
    """The canonical :data:`Dim` of a polynomial: an int when it has no symbols."""
    terms = sorted(((k, c) for k, c in poly.items() if c), key=_order)
    if not terms:
        return 0
    if len(terms) == 1 and not terms[0][0]:
        return terms[0][1]
    parts: list[str] = []
    for n, (mono, c) in enumerate(terms):
        body = "*".join(mono)
        if not mono:
            text = str(abs(c))
        elif abs(c) == 1:
            text = body
        else:
            text = f"{abs(c)}*{body}"
        parts.append(("-" if c < 0 else ("+" if n else "")) + text)
    return "".join(parts)


def as_poly(d: Dim) -> Poly:
    if isinstance(d, str):
        return parse(d) if not d.isidentifier() else {(d,): 1}
    return {(): int(d)} if d else {}


@lru_cache(maxsize=4096)
def canonical(text: str) -> Dim:
    """Validate and canonicalise a dimension string (raises :class:`ShapeError` when malformed)."""
    if text.isidentifier():
        return text
    return to_dim(parse(text))


def is_expr(d: Any) -> bool:
    """True for an expression dim (a string that is not a single symbol name)."""
    return isinstance(d, str) and not d.isidentifier()


def is_symbolic(d: Any) -> bool:
    return isinstance(d, str)


def symbols(d: Dim) -> frozenset[str]:
    if not isinstance(d, str):
        return frozenset()
    if d.isidentifier():
        return frozenset((d,))
    return frozenset(s for mono in parse(d) for s in mono)


def add(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    p = as_poly(a)
    for k, c in as_poly(b).items():
        p[k] = p.get(k, 0) + c
    return to_dim(p)


def neg(a: Dim) -> Dim:
    if isinstance(a, int):
        return -a
    return to_dim({k: -c for k, c in as_poly(a).items()})


def sub(a: Dim, b: Dim) -> Dim:
    return add(a, neg(b))


def mul(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    out: Poly = {}
    for ka, ca in as_poly(a).items():
        for kb, cb in as_poly(b).items():
            k = tuple(sorted(ka + kb))
            out[k] = out.get(k, 0) + ca * cb
    return to_dim(out)


def prod(ds: Iterable[Dim]) -> Dim:
    out: Dim = 1
    for d in ds:
        out = mul(out, d)
    return out


def total(ds: Iterable[Dim]) -> Dim:
    out: Dim = 0
    for d in ds:
        out = add(out, d)
    return out


def _mono_div(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...] | None:
    rest = list(a)
    for s in b:
        if s not in rest:
            return None
        rest.remove(s)
    return tuple(rest)


def _leading(p: Mapping[tuple[str, ...], int]) -> tuple[str, ...]:
    return max(p, key=lambda m: (len(m), m))


def div_exact(a: Dim, b: Dim) -> Dim | None:
    """``a / b`` when it is a polynomial with int coefficients for every binding, else None.

    Multivariate division by one polynomial (graded order): one divisor is a Groebner basis of the
    ideal it generates, so the remainder is 0 exactly when ``b`` divides ``a`` (``(4*b*p+4*b)/(p+1)``
    is ``4*b``); a quotient with a fractional coefficient is refused as well.
    """
    if isinstance(a, int) and isinstance(b, int):
        return a // b if b and a % b == 0 else None
    num, den = as_poly(a), as_poly(b)
    if not den:
        return None
    lead = _leading(den)
    lc = den[lead]
    out: Poly = {}
    while num:
        m = _leading(num)
        q = _mono_div(m, lead)
        if q is None or num[m] % lc:
            return None
        c = num[m] // lc
        out[q] = out.get(q, 0) + c
        for mono, coef in den.items():
            k = tuple(sorted(q + mono))
            num[k] = num.get(k, 0) - c * coef
            if not num[k]:
                del num[k]
    return to_dim(out)


def substitute(d: Dim, bindings: Mapping[str, int]) -> Dim:
    """Replace bound symbols by their sizes (an expression may stay partly symbolic)."""
    if not isinstance(d, str):
        return d
    if d.isidentifier():
        return int(bindings[d]) if d in bindings else d
    out: Poly = {}
    for mono, c in parse(d).items():
        rest: list[str] = []
        for s in mono:
            if s in bindings:
                c *= int(bindings[s])
            else:
                rest.append(s)
        key = tuple(rest)
        out[key] = out.get(key, 0) + c
    return to_dim(out)


def evaluate(d: Dim, bindings: Mapping[str, int], default: int | None = None) -> int:
    """The size of ``d`` under ``bindings``; an unbound symbol takes ``default`` or raises."""
    if isinstance(d, int):
        return d
    if default is not None:
        bindings = {**{s: default for s in symbols(d)}, **bindings}
    v = substitute(d, bindings)
    if isinstance(v, str):
        missing = sorted(symbols(v))
        raise ShapeError(f"dimension {d!r} needs the size of {', '.join(map(repr, missing))}",
                         fix="bind every symbol (Graph.specialize({...}) or feed the inputs that carry it)")
    return v


def numel(shape: Iterable[Dim]) -> Dim:
    return prod(shape)

