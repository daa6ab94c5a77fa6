"""Claims of a code-generating backend: which elementwise variants its dialect can render.

The renderer is the one truth: a dialect rule that cannot compute an op on a dtype raises
:class:`~rlx_core.errors.IRError`, so "can this node be rendered" is "render it" (memoised per
program and dtypes), and the reason it cannot is the message the dispatch report shows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache
from typing import Any

from ..dtypes import DType
from ..errors import RLXError
from ..fusion import FUSED, FUSIBLE, decode, encode
from ..ir.schema import REGISTRY
from ..ir.types import TensorType
from ..records import KernelClaim, NodeVariant

#: ``render(program, in_dtypes, out_dtype)``: the backend's kernel source for an elementwise program
Render = Callable[[str, tuple[DType, ...], DType], Any]
#: ``check(program, in_dtypes, out_dtype)``: None when renderable, else why not
Check = Callable[[str, tuple[DType, ...], DType], "str | None"]
#: ``op_ok(op, in_dtypes, out_dtype)``: None when the backend computes ``op`` exactly on these dtypes
OpCheck = Callable[[str, tuple[DType, ...], DType], "str | None"]
Predicate = Callable[[NodeVariant], "str | None"]


def single_op_program(op: str, n_inputs: int, attrs: Mapping[str, Any]) -> str:
    """One elementwise op as a fused program (``i0..`` in, ``t0`` out): backends render a single op
    and a fused chain through the same path."""
    return encode([(op, [f"i{k}" for k in range(n_inputs)], dict(attrs))], "t0")


def program_of(v: NodeVariant) -> str:
    """The elementwise program a variant computes: a fused node's own, or its single op's."""
    if v.op == FUSED:
        return str(v.attrs["program"])
    return single_op_program(v.op, len(v.in_types), dict(v.attrs))


def check_ops(program: str, in_dtypes: tuple[DType, ...], op_ok: OpCheck) -> str | None:
    """The first reason ``op_ok`` refuses an op of ``program`` (each op with its inferred dtypes), or
    None. Raises what the schemas raise for a malformed program."""
    ops, _ = decode(program)
    env = {f"i{k}": t for k, t in enumerate(in_dtypes)}
    for j, (op, args, attrs) in enumerate(ops):
        schema = REGISTRY.get(op)
        ins = tuple(env[x] for x in args)
        odt = schema.infer([TensorType(t, ()) for t in ins], schema.check_attrs(attrs, op))[0].dtype
        why = op_ok(op, ins, odt)
        if why:
            return why
        env[f"t{j}"] = odt
    return None


def render_check(render: Render, label: str, *, op_ok: OpCheck | None = None,
                 source_ok: Callable[[Any], str | None] | None = None, cache_size: int = 8192) -> Check:
    """The render-check predicate: ``check(program, in_dtypes, out_dtype) -> None | why``.

    ``label`` completes "not renderable <label>: ..." (e.g. ``"as GLSL"``). ``op_ok`` is consulted for
    every op of the program first (exactness rules the renderer does not know); ``source_ok`` sees
    the rendered source (e.g. an extension the device lacks). Memoised: claims are asked per variant.
    """

    @lru_cache(maxsize=cache_size)
    def check(program: str, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str | None:
        try:
            if op_ok is not None:
                why = check_ops(program, in_dtypes, op_ok)
                if why:
                    return why
            src = render(program, in_dtypes, out_dtype)
            if source_ok is not None:
                return source_ok(src)
        except RLXError as e:
            return f"not renderable {label}: {e.what}"
        except Exception as e:  # a renderer bug must refuse the claim, not break dispatch
            return f"not renderable {label}: {type(e).__name__}: {e}"
        return None

    return check


def renders(check: Check) -> Predicate:
    """A claim predicate: the variant's program (fused or single op) passes ``check``."""
    def pred(v: NodeVariant) -> str | None:
        return check(program_of(v), tuple(t.dtype for t in v.in_types), v.out_types[0].dtype)
    return pred


def dtypes_in(allowed: frozenset[DType] | Callable[[], frozenset[DType]], message: str) -> Predicate:
    """Every input and output dtype is in ``allowed`` (a set, or a function of the device); else
    ``"<message> <bad dtypes>"``."""
    def pred(v: NodeVariant) -> str | None:
        ok = allowed() if callable(allowed) else allowed
        bad = sorted({t.dtype.value for t in (*v.in_types, *v.out_types) if t.dtype not in ok})
        return f"{message} {', '.join(bad)}" if bad else None
    return pred


def all_of(*preds: Predicate) -> Predicate:
    """The first reason any of ``preds`` gives, in order (None when all accept)."""
    def pred(v: NodeVariant) -> str | None:
        for p in preds:
            why = p(v)
            if why:
                return why
        return None
    return pred


def elementwise_claims(prefix: str, compute: frozenset[DType], predicate: Predicate, *,
                       ops: Iterable[str] | None = None,
                       overrides: Mapping[str, Mapping[str, Any]] | None = None,
                       **common: Any) -> list[KernelClaim]:
    """One in-place claim per fusible elementwise op, named ``prefix + op``: the op's schema dtypes
    within ``compute``; ``where`` also takes its bool condition (its outputs stay ``compute``
    dtypes unless ``out_dtypes`` is given). ``overrides[op]`` replaces any claim field of one op;
    ``common`` sets a field of every claim (e.g. ``out_dtypes``)."""
    claims = []
    for op in sorted(FUSIBLE if ops is None else ops):
        dts = frozenset(REGISTRY.get(op).dtypes) & compute
        kw: dict[str, Any] = {"dtypes": dts, "predicate": predicate, "in_place": True, **common}
        if op == "where":
            kw["dtypes"] = dts | {DType.BOOL}
            kw.setdefault("out_dtypes", dts)
        kw.update((overrides or {}).get(op, {}))
        claims.append(KernelClaim(op, f"{prefix}{op}", **kw))
    return claims


def fused_claim(name: str, predicate: Predicate, constraint: str = "", **kw: Any) -> KernelClaim:
    """The ``fused_elementwise`` claim (in place: its output may take over a dying input)."""
    kw.setdefault("in_place", True)
    return KernelClaim(FUSED, name, dtypes=None, predicate=predicate, constraint=constraint, **kw)
