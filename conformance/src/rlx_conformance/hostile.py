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


__all__ = ["MARKER", "hostile_names"]
