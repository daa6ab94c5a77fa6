"""Names from model files, made safe for generated source.

Graph, node, input and parameter names come from untrusted .rlx/.onnx files. Every generator that
puts one into source text (C/CUDA/OpenCL/Metal/GLSL/WGSL/HLSL kernels, Verilog, WAT, the JS loader,
Numba-Python modules, Makefiles, READMEs) goes through this module, so that a name can only ever be
*data*: an identifier made of ``[A-Za-z0-9_]``, a comment body that cannot end its comment, or a
string literal escaped for its language. One place to get right instead of one per backend.

* :func:`identifier` / :class:`Namer`: a name as an identifier (deterministic, collision-free within
  a program, never a keyword of any target language, never in a namespace a language reserves).
* :func:`safe_comment` / :func:`comment`: a name (or any text holding names) inside a comment.
* :func:`string_literal`: a name as a quoted string literal of one language.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable

from ..errors import IRError

#: Languages whose comments :func:`safe_comment` / :func:`comment` write.
COMMENT_LANGS = ("c", "cuda", "opencl", "metal", "glsl", "wgsl", "hlsl", "verilog", "js", "wat", "python",
                 "makefile", "markdown")
#: Languages whose string literals :func:`string_literal` writes (GLSL and WGSL have none).
STRING_LANGS = ("c", "cuda", "opencl", "metal", "hlsl", "verilog", "js", "wat", "python")

#: Longest comment body (characters, after escaping) before it is cut with "...": a 10k-character
#: name must not make 10k-character lines (tools choke, and nobody reads them).
COMMENT_LIMIT = 80
#: Longest part of an identifier kept from the name (a hash suffix keeps long names distinct).
IDENT_LIMIT = 32

# Keywords and reserved words of every target, in one set: an identifier that is safe in all of them
# can be used by any generator (and by one generator that emits several languages) without a
# per-language table going stale.
_RESERVED = frozenset("""
auto break case char const continue default do double else enum extern float for goto if inline int long
register restrict return short signed sizeof static struct switch typedef union unsigned void volatile
while bool true false _Bool _Complex _Imaginary asm typeof alignas alignof static_assert thread_local
nullptr class namespace template typename this new delete operator private protected public virtual friend
mutable explicit using try catch throw export import module concept requires constexpr consteval constinit
decltype noexcept override final co_await co_return co_yield and or not xor bitand bitor compl
half uchar ushort uint ulong size_t ptrdiff_t kernel device constant threadgroup thread global local
__global __local __constant __kernel private read_only write_only read_write
attribute uniform varying buffer shared layout centroid flat smooth noperspective patch sample subroutine
in out inout invariant precise precision lowp mediump highp discard struct vec2 vec3 vec4 ivec2 ivec3 ivec4
uvec2 uvec3 uvec4 bvec2 bvec3 bvec4 dvec2 dvec3 dvec4 mat2 mat3 mat4 sampler2D image2D texture main
fn let var loop array atomic f16 f32 f64 i32 i64 u32 u64 vec mat ptr storage workgroup function
override alias enable requires diagnostic bitcast select fallthrough discard_fragment
cbuffer tbuffer groupshared row_major column_major matrix vector string technique pass
always always_comb always_ff always_latch assign begin end endmodule endfunction endtask endcase endgenerate
generate genvar initial input output integer parameter localparam reg wire logic posedge negedge task case
casex casez default defparam disable edge forever fork join macromodule specify specparam supply0 supply1
tri wand wor event real realtime time trireg vectored scalared small medium large
var let const function yield await async class extends super instanceof typeof void delete in of
with debugger null undefined NaN Infinity arguments eval prototype constructor __proto__ window globalThis
require process
def lambda pass raise global nonlocal assert elif except finally from is None True False print exec
np math numba njit prange self cls
""".split())
_RESERVED_LOWER = frozenset(w.lower() for w in _RESERVED)
#: Prefixes a language reserves (C: ``_X``/``__``; GLSL: ``gl_``; WGSL/GLSL: ``__``) or a generator
#: uses for its own symbols (``rlx_``): a user name never lands in them.
_RESERVED_PREFIXES = ("_", "gl_", "rlx_", "rlx")
_IDENT = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")
_HASHED = re.compile(r"_[0-9a-f]{8}\Z")


def _digest(name: str) -> str:
    # surrogatepass: a name read from a broken file may hold lone surrogates; it still gets a hash.
    return hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def _kept_as_is(name: str, max_len: int) -> bool:
    return (bool(_IDENT.match(name)) and len(name) <= max_len and "__" not in name
            and not name.endswith("_") and name.lower() not in _RESERVED_LOWER
            and not name.lower().startswith(_RESERVED_PREFIXES)
            # looks like our own "<base>_<hash>": would collide with a hashed name
            and not _HASHED.search(name))


def identifier(name: str, *, prefix: str = "", max_len: int = IDENT_LIMIT) -> str:
    """``name`` as an identifier valid in every target language (C family, GLSL, WGSL, HLSL, Verilog,
    JS, WAT ``$`` names, Python), and as a file name.

    A name that is already a plain identifier (letters, digits, single underscores; not a keyword;
    at most ``max_len`` characters) is kept, so generated code stays readable. Any other name becomes
    its ASCII letters and digits (runs of anything else become one ``_``, cut to ``max_len``) plus
    ``_`` and the first 8 hex digits of its SHA-256: deterministic, and two different names give two
    different identifiers unless their hashes collide (use :class:`Namer` for a guarantee).
    ``prefix`` (e.g. ``"v_"``) is put in front of either form; it must itself be an identifier part.
    """
    if prefix and not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", prefix):
        raise IRError(f"identifier prefix {prefix!r} is not a plain identifier",
                      where="rlx_core.codegen.names.identifier", fix="use letters, digits and '_'")
    if _kept_as_is(name, max_len):
        return prefix + name
    base = re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")[:max_len].rstrip("_")
    if not base or not base[0].isalpha():
        base = "n" + ("_" + base if base else "")
    return f"{prefix}{base}_{_digest(name)}"


class Namer:
    """Identifiers for the names of one program: stable (the same name always gets the same
    identifier) and unique (two names never share one, even with a hash collision or a name that
    mimics a hashed one; identifiers in ``taken``, the generator's own symbols, are never handed out).
    """

    def __init__(self, *, prefix: str = "", taken: Iterable[str] = (), max_len: int = IDENT_LIMIT) -> None:
        self.prefix = prefix
        self.max_len = max_len
        self._by_name: dict[str, str] = {}
        self._used: set[str] = set(taken)

    def __call__(self, name: str) -> str:
        got = self._by_name.get(name)
        if got is not None:
            return got
        base = identifier(name, prefix=self.prefix, max_len=self.max_len)
        out, k = base, 1
        while out in self._used:
            out = f"{base}_{k}"
            k += 1
        self._used.add(out)
        self._by_name[name] = out
        return out

    def __contains__(self, name: str) -> bool:
        return name in self._by_name


# Comment bodies keep printable ASCII, minus characters that start strings, macros, templates or
# escapes in some target: quotes, backtick, backslash, dollar, angle brackets. Everything else is
# written as \xNN / \uNNNN / \UNNNNNNNN. A backslash therefore never ends the body (no C/Makefile
# line continuation), and no line terminator survives (CR, LF, VT, FF, NEL, U+2028/U+2029 end lines
# in C, Python or JS).
_COMMENT_OK = frozenset(chr(c) for c in range(0x20, 0x7F)) - set("\"'`\\$<>")
# Pairs that open or close a comment (C/Verilog/JS ``/* */`` and ``//``, WAT ``(; ;)``, which
# nest) or form a C trigraph (``??/`` is a backslash in -std=c99): split by a space.
_BREAK = re.compile(r"(?<=\*)(?=/)|(?<=/)(?=[*/])|(?<=\()(?=;)|(?<=;)(?=\))|(?<=\?)(?=\?)")
# Python reads an encoding declaration from a comment in the first two lines (PEP 263): a name
# saying "coding: utf-7" there would change how the rest of the module decodes.
_PEP263 = re.compile(r"(coding)([:=])", re.IGNORECASE)


def _escape_char(ch: str) -> str:
    o = ord(ch)
    if o < 0x100:
        return f"\\x{o:02x}"
    if o < 0x10000:
        return f"\\u{o:04x}"
    return f"\\U{o:08x}"


def _check_lang(lang: str, langs: tuple[str, ...], what: str) -> None:
    if lang not in langs:
        raise IRError(f"no {what} rule for language {lang!r}", where="rlx_core.codegen.names",
                      fix=f"use one of {', '.join(langs)}")


def safe_comment(text: str, lang: str = "c", *, limit: int = COMMENT_LIMIT) -> str:
    """``text`` as the body of a comment in ``lang`` (see :data:`COMMENT_LANGS`): one line of
    printable ASCII that cannot end the comment, start a new one, continue onto the next line, or be
    read as a directive; at most ``limit`` characters plus ``...``. Safe in both the line and the
    block comment forms of every listed language, so callers need not know which one surrounds it."""
    _check_lang(lang, COMMENT_LANGS, "comment")
    out = "".join(ch if ch in _COMMENT_OK else _escape_char(ch) for ch in text)
    out = _BREAK.sub(" ", out)
    out = _PEP263.sub(r"\1 \2", out)
    if len(out) > limit:
        out = out[:limit].rstrip() + "..."
    # A cut may end on "/" or "*" next to the closing "*/" a caller adds: a trailing space keeps
    # them apart (and never ends the body on a character that pairs with the next one).
    if out.endswith(("*", "/", "(", ";", "?")):
        out += " "
    return out


_COMMENT_FORM = {"c": "/* {} */", "cuda": "/* {} */", "opencl": "/* {} */", "metal": "/* {} */",
                 "glsl": "/* {} */", "wgsl": "/* {} */", "hlsl": "/* {} */", "verilog": "// {}",
                 "js": "// {}", "wat": ";; {}", "python": "# {}", "makefile": "# {}",
                 "markdown": "<!-- {} -->"}


def comment(text: str, lang: str = "c", *, limit: int = COMMENT_LIMIT) -> str:
    """A whole one-line comment of ``lang`` holding ``text`` (delimiters included)."""
    return _COMMENT_FORM[lang].format(safe_comment(text, lang, limit=limit)) if lang in _COMMENT_FORM \
        else safe_comment(text, lang, limit=limit)


def _c_string(text: str, question: bool) -> str:
    out = []
    for b in text.encode("utf-8", "surrogatepass"):
        ch = chr(b)
        if ch == '"' or ch == "\\":
            out.append("\\" + ch)
        elif ch == "?" and question:
            out.append("\\?")  # no trigraphs (-std=c99 reads "??/" as a backslash)
        elif 0x20 <= b < 0x7F:
            out.append(ch)
        else:
            out.append(f"\\{b:03o}")  # octal: never swallows a following digit (a hex escape would)
    return '"' + "".join(out) + '"'


def _wat_string(text: str) -> str:
    out = []
    for b in text.encode("utf-8", "surrogatepass"):
        ch = chr(b)
        if ch in ('"', "\\") or not 0x20 <= b < 0x7F:
            out.append(f"\\{b:02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _js_string(text: str) -> str:
    # ensure_ascii escapes every non-ASCII character, U+2028/U+2029 (line terminators inside JS
    # source) and lone surrogates included; < > & escaped so "</script>" and "<!--" cannot end
    # or change an HTML script element holding the loader.
    s = json.dumps(text, ensure_ascii=True)
    return s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def string_literal(text: str, lang: str) -> str:
    """``text`` as a double-quoted string literal of ``lang`` (see :data:`STRING_LANGS`) that
    evaluates to the same characters (UTF-8 bytes for C, Verilog and WAT) and contains only
    printable ASCII. Verilog: the literal is data, not a ``$display`` format; a caller formatting
    with it must pass it as an argument to ``"%s"``."""
    _check_lang(lang, STRING_LANGS, "string literal")
    if lang in ("c", "cuda", "opencl", "metal", "hlsl"):
        return _c_string(text, question=True)
    if lang == "verilog":
        return _c_string(text, question=False)
    if lang == "js":
        return _js_string(text)
    if lang == "wat":
        return _wat_string(text)
    return ascii(text)  # python: escapes every non-ASCII and control character


def js_value(value: object, *, indent: int | None = None) -> str:
    """Any JSON-able value (a manifest) as a JavaScript expression, with the same escaping as
    :func:`string_literal` for ``js`` applied to every string in it."""
    s = json.dumps(value, ensure_ascii=True, indent=indent)
    return s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


__all__ = ["COMMENT_LANGS", "COMMENT_LIMIT", "IDENT_LIMIT", "STRING_LANGS", "Namer", "comment", "identifier",
           "js_value", "safe_comment", "string_literal"]
