"""Hostile names: strings a model file may use as a graph, node, input or parameter name.

Names come from untrusted .rlx/.onnx files and end up in generated source (C, CUDA, GLSL, MSL,
WGSL, Verilog, JavaScript, WAT, Python). Each entry aims at one way a careless generator turns a
name into code: ending a line comment with a newline, closing a block comment, ending a string
literal, starting a shell or Verilog system task, a JS template, a NUL that truncates a C string,
line terminators only JavaScript knows (U+2028/U+2029), or sheer length. The conformance suite,
the tests and the fuzz harness all draw from this one list so a new trick is added once.

Every payload that would have an effect writes (or would write) a file called
``RLX_PWNED`` (:data:`MARKER`); tests look for that file and for the payload in generated text.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: The file name a successful injection would create; tests assert it never appears.
MARKER = "RLX_PWNED"

_BASE: tuple[str, ...] = (
    # line-comment escapes: a newline/CR ends a // or # comment and the rest becomes code
    f'x\nsystem("touch {MARKER}");\n//',
    f"x\r\nint {MARKER} = 1;\r//",
    f"x\rimport os; os.system('touch {MARKER}')  #",
    # block-comment escapes (C, CUDA, Metal, GLSL, WGSL, Verilog, JS)
    f"x */ int {MARKER}; /* y",
    "x /* unterminated",
    "x // y",
    # a backslash at the end of a // comment continues it onto the next line in C
    "x\\",
    "x\\\nint y;",
    # string literal escapes
    f'x"; require("child_process").execSync("touch {MARKER}"); "',
    f"x'; require('child_process').execSync('touch {MARKER}'); '",
    f"x`; ${{require('child_process').execSync('touch {MARKER}')}} `",
    # Verilog system tasks and macros; shell metacharacters for Makefiles and runners
    f'x\n initial begin $system("touch {MARKER}"); end\n//',
    f'x $fopen("{MARKER}", "w") `define Y',
    f"x $(shell touch {MARKER}) `touch {MARKER}` ; touch {MARKER} #",
    "$system",
    "${x}",
    # template placeholders: a generator that substitutes one placeholder after another (or formats
    # twice) would put the next substitution, multi-line, inside this name's comment
    "__GRAPH__ __MANIFEST__ {graph} {0} %s %n @@NAME@@",
    # NUL truncates C strings and confuses some tools
    "x\x00y",
    # line terminators JavaScript (but not C or Python) honours
    f"x\u2028require('child_process').execSync('touch {MARKER}')\u2029//",
    # HTML/script context of a JS loader
    "x</script><script>alert(1)</script>",
    # unicode: accents, CJK, RTL override, zero-width, emoji, a lone surrogate-free astral char
    "na\u00efve_\u540d\u524d",
    "x\u202eevil\u200b",
    "\U0001f600",
    # identifiers that are keywords or builtins in some target
    "int", "module", "function", "def", "return", "main", "void", "float", "loop", "export",
    "__proto__", "constructor", "_", "1x", "a b", "-",
    # tab, form feed, vertical tab, other controls, DEL
    "x\ty\fz\vw\x1b[31m\x7f",
    # length: 10k characters (generators must cap comments and keep identifiers short)
    "n" * 10_000,
    f"{'A' * 5000}\n{MARKER}();\n{'B' * 5000}",
)


def hostile_names() -> list[str]:
    """The hostile names, in a fixed order (deterministic tests and fuzz seeds).

    Each is a valid RLX value name (a non-empty string); no two are equal. A caller needing several
    distinct names at once (inputs, params, nodes of one graph) can slice the list or add a suffix.
    """
    return list(_BASE)


#: Names one :func:`hostile_graph` uses: graph, input, parameter, two nodes, the renamed output.
NAMES_PER_GRAPH = 6


def hostile_graph(k: int = 0, *, dtype: str = "f32") -> tuple[Any, dict[str, np.ndarray]]:
    """A small graph (two ``add`` and a ``reshape``, ops every backend has) whose graph, input,
    parameter, node and output names are the ``k``-th group of :data:`NAMES_PER_GRAPH` hostile names
    (wrapping around), and its inputs. ``k`` from 0 to :func:`hostile_graph_count` - 1 covers every
    name in every role at least once."""
    from rlx_core.plugin import GraphBuilder

    names = hostile_names()
    pick = [names[(k * NAMES_PER_GRAPH + j) % len(names)] for j in range(NAMES_PER_GRAPH)]
    rng = np.random.default_rng(k)
    npdt = np.dtype(np.float32 if dtype == "f32" else dtype)
    g = GraphBuilder(pick[0])
    x = g.input(pick[1], dtype, (2, 3))
    w = g.param(pick[2], rng.standard_normal((2, 3)).astype(npdt))
    y = g.op("add", x, w, name=pick[3])
    z = g.op("add", y, w, name=pick[4])
    g.output(z, pick[5])
    return g.build(), {pick[1]: rng.standard_normal((2, 3)).astype(npdt)}


def hostile_graph_count() -> int:
    """How many :func:`hostile_graph` indices it takes to use every hostile name."""
    return -(-len(_BASE) // NAMES_PER_GRAPH)


__all__ = ["MARKER", "NAMES_PER_GRAPH", "hostile_graph", "hostile_graph_count", "hostile_names"]
