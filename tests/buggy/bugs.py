"""Planted bugs: each is a one-line replacement in the reference backend ``numpy_backend.py``.

``source(name)`` is the correct backend renamed to ``name``; ``source(name, bug)`` has one bug
planted. A patch must match exactly one line of the template, so a template edit that breaks a
patch fails loudly instead of silently planting nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TEMPLATE = Path(__file__).with_name("numpy_backend.py")


@dataclass(frozen=True)
class Bug:
    what: str
    old: str
    new: str


BUGS: dict[str, Bug] = {
    # 1. Ignores the permutation: always reverses the axes. Right for rank <= 2 and for reversing
    #    perms; wrong values (right shape, since results are stored flat) otherwise.
    "transpose_wrong_axes": Bug(
        "transpose reverses all axes instead of applying perm",
        '"transpose": lambda xs, a, o: np.transpose(xs[0], a["perm"]),',
        '"transpose": lambda xs, a, o: np.transpose(xs[0]),'),
    # 2. Broadcasting by flat index modulo the operand size (np.resize): right for equal shapes,
    #    scalars and trailing-row broadcasts, wrong for column/outer/rank broadcasts.
    "broadcast_equal_shapes_only": Bug(
        "binary ops index operands by flat output index modulo their size",
        "return [np.broadcast_to(x, shape) for x in xs]",
        "return [np.resize(x, shape) for x in xs]"),
    # 3. Half precision accumulated in half: f16 reduce_sum and matmul sum term by term in f16.
    "f16_accumulates_in_f16": Bug(
        "f16 reduce_sum/matmul accumulate in f16",
        "_ACC = {np.dtype(np.float16): np.dtype(np.float32)}",
        "_ACC: dict[np.dtype, np.dtype] = {}"),
    # 4. Claims f64 and i32 add but computes in f32 (rounds f64, saturates/rounds large i32).
    "add_computes_in_f32": Bug(
        "add claims f32/f64/i32 but computes in f32",
        '"add": lambda a, b: np.add(a, b),',
        '"add": lambda a, b: np.add(a, b, dtype=np.float32),'),
    # 5a. Ignores the planner's Step.in_place: every elementwise step writes over its first
    #     operand's buffer even when that value is still live (memory corruption).
    "in_place_ignores_plan": Bug(
        "elementwise steps write into their first operand's buffer whatever the plan says",
        "target = s.outputs[0]",
        "target = s.inputs[0] if s.op in IN_PLACE and views[s.inputs[0]].shape == "
        "views[s.outputs[0]].shape else s.outputs[0]"),
    # 5b. exp is routed to a library call: the report says the native kernel ran, it never did.
    "exp_kernel_never_called": Bug(
        "exp steps call a library routine instead of the claimed kernel (report lies)",
        "calls = s.kernel",
        'calls = "vendorlib.exp" if s.op == "exp" else s.kernel'),
    # 5c. The exp kernel exponentiates its input buffer in place, then copies it to the output.
    "exp_clobbers_input": Bug(
        "exp writes its result into its input buffer (not in-place)",
        '"exp": lambda xs, a, o: np.exp(xs[0]),',
        '"exp": lambda xs, a, o: np.exp(xs[0], out=xs[0]),'),
}


def source(name: str, bug: str | None = None) -> str:
    text = TEMPLATE.read_text()
    text = _replace(text, 'NAME = "refnp"', f'NAME = "{name}"')
    if bug is not None:
        b = BUGS[bug]
        text = _replace(text, b.old, b.new)
    return text


def _replace(text: str, old: str, new: str) -> str:
    n = text.count(old)
    if n != 1:
        raise AssertionError(f"patch target {old!r} occurs {n} times in {TEMPLATE.name}")
    return text.replace(old, new)
