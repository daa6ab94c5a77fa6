"""What every `rlx` command shares: JSON output, ``NAME=VALUE`` parsing, model loading, the common
options. Exporters and plugin commands reach these through :mod:`rlx_core.plugin`.

Kept apart from :mod:`rlx_core.cli` so that modules the CLI loads (the plugin extension machinery in
``extensions.py``, ``export_cmd.py``) can use them without importing the CLI back: no import cycle.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from . import settings

if TYPE_CHECKING:
    from ._hub import Hub
    from .ir.graph import Graph


def echo_json(data: Any) -> None:
    click.echo(json.dumps(json_safe(data), indent=2, ensure_ascii=False))


def json_safe(x: Any) -> Any:
    """Plain JSON: non-finite floats become strings, tuples lists, unknown objects their str()."""
    if isinstance(x, float):
        return x if math.isfinite(x) else str(x)
    if isinstance(x, (str, int, bool)) or x is None:
        return x
    if isinstance(x, Mapping):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [json_safe(v) for v in x]
    if hasattr(x, "item") and callable(x.item):  # NumPy scalars
        try:
            return json_safe(x.item())
        except (TypeError, ValueError):
            pass
    return str(x)


def parse_pairs(values: Iterable[str], option: str, *, example: str) -> dict[str, str]:
    """``["a=1", "b=2"]`` -> ``{"a": "1", "b": "2"}``; a malformed item is a usage error (exit 2)."""
    out: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE (e.g. {example})", param_hint=option)
        if key in out:
            raise click.BadParameter(f"{key!r} is given twice", param_hint=option)
        out[key] = value
    return out


def parse_bindings(values: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for key, value in parse_pairs(values, "--bind", example="batch=8").items():
        try:
            n = int(value)
        except ValueError:
            n = -1
        if n < 0:
            raise click.BadParameter(f"{key}={value}: the size must be a non-negative integer",
                                     param_hint="--bind")
        out[key] = n
    return out


def export_options(target: str, what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The arguments every plugin's ``rlx export --target TARGET`` command shares, in this order:
    MODEL, ``--target`` (``what`` is its help), ``--output/-o``, ``--bind`` (repeatable), ``--json``.
    The function receives ``model``, ``target_name``, ``out_dir``, ``binds`` and ``as_json``;
    target-specific options go above or below this decorator.

    Example::

        @click.command("export")
        @export_options("mytarget", "mytarget = C sources for the My board")
        @click.option("--opt-level", type=int, default=2)
        def export_command(model, target_name, out_dir, binds, as_json, opt_level): ...
    """
    decorators = [
        click.argument("model", type=click.Path(exists=True, dir_okay=False)),
        click.option("--target", "target_name", type=click.Choice([target]), required=True,
                     help=f"What to generate: {what}."),
        click.option("--output", "-o", "out_dir", type=click.Path(file_okay=False), required=True,
                     help="Directory to write (created if needed)."),
        click.option("--bind", "binds", multiple=True, metavar="SYMBOL=SIZE",
                     help="Size of a symbolic dim, e.g. batch=1 (repeatable; unbound symbols are 1)."),
        click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON."),
    ]

    def apply(f: Callable[..., Any]) -> Callable[..., Any]:
        for d in reversed(decorators):  # click lists parameters in the order they are written
            f = d(f)
        return f
    return apply


def check_bindings(graph: Graph, bindings: Mapping[str, int]) -> None:
    unknown = sorted(set(bindings) - set(graph.symbols))
    if unknown:
        have = ", ".join(sorted(graph.symbols)) or "none (all shapes are static)"
        raise click.BadParameter(f"graph {graph.name!r} has no symbol {', '.join(unknown)}; its symbols: "
                                 f"{have}", param_hint="--bind")


#: Model file suffixes ``load_model`` translates from other formats (everything else is read as .rlx).
MODEL_IMPORTERS: dict[str, str] = {".onnx": "rlx_core.frontends.onnx:load_onnx"}


def load_model(path: str | os.PathLike[str], **options: Any) -> Graph:
    """Read a model file: ``.onnx`` through the ONNX importer, anything else as an ``.rlx`` file.

    ``options`` go to the importer (e.g. ``symbols={"batch": 2}`` for ONNX).
    """
    target = MODEL_IMPORTERS.get(Path(path).suffix.lower())
    if target is not None:
        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)(path, **options)
    from .errors import InputError, SerializationError
    from .ir.serialize import load

    suffix = Path(path).suffix.lower()
    try:
        return load(path)
    except SerializationError as e:
        if suffix == ".rlx":
            raise
        # Any other suffix is read as .rlx (a renamed file still loads), but when that fails the
        # user most likely passed the wrong file (an input .npy): say what a model file is.
        known = " or ".join([".rlx", *MODEL_IMPORTERS])
        hint = ("; input arrays go to --input NAME=FILE.npy" if suffix in (".npy", ".npz") else "")
        raise InputError(f"{os.fspath(path)} is not a model file: expected {known} (reading it as .rlx "
                         f"failed: {e.what})", where=f"model {os.fspath(path)}",
                         fix=f"pass a {known} model file as MODEL{hint}") from e


def load_command_model(path: str, bindings: Mapping[str, int],
                       input_files: Mapping[str, str] | None = None, *,
                       require_signature: str | None = None,
                       signature: str | None = None) -> tuple[Graph, dict[str, int]]:
    """Load a model for `rlx run`/`rlx explain`; returns the graph and the bindings still to apply.

    An ONNX model whose shapes cannot stay symbolic (e.g. a reshape to ``batch*heads``) is imported
    again with its dynamic dims fixed: from ``--bind`` and from the shapes of the ``--input`` arrays.
    ``require_signature``: a public key; the file must carry a valid signature by it (.rlx only).
    """
    if signature is not None and require_signature is None:
        raise click.BadParameter("--sig names a signature to check, but no key to check it with",
                                 param_hint="--require-signature")
    if require_signature is not None:
        if Path(path).suffix.lower() == ".onnx":
            from .errors import SignatureError

            # An .onnx file may read external data files a signature over its bytes would not cover.
            raise SignatureError(f"{path} is an ONNX file; signatures are checked for .rlx files only",
                                 where=f"model {path}",
                                 fix="import it once and save it as .rlx (rlx_core.save(load_onnx(...), "
                                     "'model.rlx')), then sign that file with rlx sign")
        from .ir.serialize import load

        return load(path, require_signature=require_signature, signature=signature), dict(bindings)
    if Path(path).suffix.lower() != ".onnx":
        return load_model(path), dict(bindings)
    from .frontends.onnx import SymbolicShapeError, input_types

    try:
        return load_model(path), dict(bindings)
    except SymbolicShapeError as e:
        fixed = dict(bindings)
        for name, t in input_types(path).items():
            file = (input_files or {}).get(name)
            if file is None:
                continue
            try:
                import numpy as np

                shape = np.load(file, mmap_mode="r", allow_pickle=False).shape
            except Exception:  # reading the input properly later reports the problem
                continue
            if len(shape) == t.rank:
                for d, n in zip(t.shape, shape):
                    if isinstance(d, str):
                        fixed.setdefault(d, int(n))
        if not fixed:
            raise
        graph = load_model(path, symbols=fixed)
        click.echo(f"note: {e.what}; imported with fixed sizes "
                   f"{', '.join(f'{k}={v}' for k, v in sorted(fixed.items()))}", err=True)
        return graph, {k: v for k, v in bindings.items() if k in graph.symbols}


def hub_instance() -> Hub:
    from ._hub import hub

    return hub()


def device_option(help_text: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option("--device", "-d", metavar="DEVICE", default=None, help=help_text)


def json_option() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout.")


def signature_option() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        f = click.option("--sig", "signature", type=click.Path(dir_okay=False), default=None,
                         help="The detached signature (default: MODEL.sig).")(f)
        return click.option("--require-signature", "require_signature", metavar="PUBKEY",
                            type=click.Path(exists=True, dir_okay=False),
                            envvar=settings.REQUIRE_SIGNATURE.name, default=None,
                            help="Load the model only if it carries a valid ed25519 signature by this "
                                 "public key (rlx sign); checked before anything in the file is parsed. "
                                 "Env: RLX_REQUIRE_SIGNATURE.")(f)
    return wrap


def bind_option() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option("--bind", "-b", "binds", multiple=True, metavar="SYM=N",
                        help="Size of a symbolic dimension (repeatable), e.g. --bind batch=8.")


class Progress:
    """Says on stderr which long step a command is in ("compiling for cpu ... 2.31 s").

    Only on a terminal and without ``--quiet``: piped or captured output (scripts, CI, tests) stays
    exactly what the command prints on stdout. One line per step, written when it starts, so a slow
    first run (JIT) shows what it is waiting for.
    """

    def __init__(self, quiet: bool = False, stream: Any = None) -> None:
        import sys

        self.stream = sys.stderr if stream is None else stream
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = not quiet and callable(isatty) and bool(isatty())

    @contextlib.contextmanager
    def step(self, what: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        import time

        from .report import fmt_seconds

        self.stream.write(f"{what} ...")
        self.stream.flush()
        t0 = time.perf_counter()
        try:
            yield
        except BaseException:
            self.stream.write(" failed\n")  # the error itself is reported by the command
            self.stream.flush()
            raise
        self.stream.write(f" {fmt_seconds(time.perf_counter() - t0)}\n")
        self.stream.flush()


def quiet_option() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option("--quiet", "-q", is_flag=True,
                        help="No progress lines on stderr (they are shown only on a terminal anyway).")
