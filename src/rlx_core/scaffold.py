"""``rlx new-backend NAME``: create a new backend plugin package that is certifiable as generated.

The package is rendered from the templates in ``rlx_core/templates/backend/`` (``{{key}}``
placeholders; ``__pkg__`` in a path becomes the import name; the ``.tmpl`` suffix is dropped)::

    rlx-NAME/
      pyproject.toml                    distribution rlx-NAME, entry point rlx.backends: NAME
      README.md                         what to do next, how to run the conformance suite
      src/rlx_NAME/__init__.py          __version__
      src/rlx_NAME/plugin.py            the hooks; claims one kernel: add on f32
      src/rlx_NAME/program.py           the compiled program (planned arena, run and profile)
      src/rlx_NAME/conformance-xfails.txt   the expected-failure manifest (empty)
      tests/test_conformance.py         runs the suite, asserts certified

Python API: :func:`validate_name`, :func:`default_destination`, :func:`render`, :func:`create`.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from importlib import metadata, resources
from importlib.abc import Traversable
from pathlib import Path

import click

from . import API_VERSION, __version__
from .errors import RLXError

#: Backend names: a lowercase Python identifier (it is also the ``rlx_NAME`` import suffix).
NAME_RE = re.compile(r"[a-z][a-z0-9_]*")
MAX_NAME = 32
#: Names that would shadow RLX's own packages (``rlx_core``, ``rlx_conformance``) or mean nothing.
RESERVED = {
    "core": "rlx_core is the RLX hub itself",
    "conformance": "rlx_conformance is the RLX conformance suite",
    "all": "RLX_DISABLE_PLUGINS=all means 'every plugin'",
}
TEMPLATE_SUFFIX = ".tmpl"
PKG_PLACEHOLDER = "__pkg__"


class ScaffoldError(RLXError):
    """``rlx new-backend`` cannot create the package (bad name, name taken, folder exists)."""


class InvalidNameError(ScaffoldError):
    """The backend name is not a lowercase identifier, is too long, or is reserved."""


class NameTakenError(ScaffoldError):
    """An installed distribution already provides this backend name (or the ``rlx_NAME`` module)."""


class DestinationExistsError(ScaffoldError):
    """The target folder exists and is not empty (or is a file)."""


def installed_backends() -> dict[str, str]:
    """Backend names of the installed ``rlx.backends`` entry points -> distribution (no imports)."""
    out: dict[str, str] = {}
    for ep in metadata.entry_points(group="rlx.backends"):
        dist = getattr(ep, "dist", None)
        out.setdefault(ep.name, dist.metadata["Name"] if dist is not None else "?")
    return out


def check_name_format(name: str) -> None:
    """Raise :class:`InvalidNameError` unless ``name`` is a usable backend name."""
    if not name:
        raise InvalidNameError("the backend name is empty", fix="give a short lowercase name such as 'acme'")
    if not NAME_RE.fullmatch(name):
        hint = name.lower().replace("-", "_").replace(" ", "_")
        hint = re.sub(r"[^a-z0-9_]", "", hint).lstrip("0123456789_") or "acme"
        raise InvalidNameError(
            f"backend name {name!r} is not a lowercase identifier",
            fix=f"use lowercase letters, digits and '_', starting with a letter (e.g. {hint!r}); "
                "it names the backend, the entry point and the rlx_NAME package")
    if len(name) > MAX_NAME:
        raise InvalidNameError(f"backend name {name!r} is {len(name)} characters long",
                               fix=f"use at most {MAX_NAME} characters")
    if name in RESERVED:
        raise InvalidNameError(f"backend name {name!r} is reserved: {RESERVED[name]}",
                               fix="choose another name, e.g. your vendor or device name")


def check_name_free(name: str) -> None:
    """Raise :class:`NameTakenError` if an installed plugin or module already uses ``name``."""
    taken = installed_backends()
    if name in taken:
        raise NameTakenError(
            f"backend {name!r} is already installed (distribution {taken[name]})",
            where=f"entry point group rlx.backends: {name}",
            fix="choose another name, or pass --force to generate it anyway (two distributions "
                "providing one backend name conflict: uninstall one before installing the other)")
    try:
        spec = importlib.util.find_spec(f"rlx_{name}")
    except (ImportError, ValueError):
        spec = None
    if spec is not None:
        where = getattr(spec, "origin", None) or ", ".join(spec.submodule_search_locations or [])
        raise NameTakenError(f"a module named rlx_{name} is already importable", where=where,
                             fix="choose another name, or pass --force to generate it anyway")


def validate_name(name: str, *, force: bool = False) -> str:
    """Check ``name`` (format always; not taken by an installed backend unless ``force``)."""
    check_name_format(name)
    if not force:
        check_name_free(name)
    return name


def default_destination(name: str, cwd: Path | None = None, *, into: Path | str | None = None) -> Path:
    """``INTO/rlx-NAME`` (default ``INTO``: the current folder).

    Never guessed from what the folder contains: a ``plugins/`` folder may be someone else's
    project, so writing into it takes ``--into plugins``.
    """
    here = Path.cwd() if cwd is None else Path(cwd)
    return (here / Path(into).expanduser() if into is not None else here) / f"rlx-{name}"


def _minor_range(version: str) -> str:
    """``"0.1.3"`` -> ``">=0.1,<0.2"``: the release's minor series."""
    m = re.match(r"(\d+)(?:\.(\d+))?", version)
    major, minor = (int(m.group(1)), int(m.group(2) or 0)) if m else (0, 0)
    return f">={major}.{minor},<{major}.{minor + 1}"


def template_vars(name: str) -> dict[str, str]:
    """The ``{{key}}`` values for ``name``."""
    try:
        conformance_req = "rlx-conformance" + _minor_range(metadata.version("rlx-conformance"))
    except metadata.PackageNotFoundError:
        conformance_req = "rlx-conformance"
    return {
        "name": name,
        "pkg": f"rlx_{name}",
        "dist": f"rlx-{name}",
        "camel": "".join(p.capitalize() for p in name.split("_") if p) or name.capitalize(),
        "core_req": "rlx-core" + _minor_range(__version__),
        "conformance_req": conformance_req,
        "core_version": __version__,
        "api_version": API_VERSION,
    }


def _templates() -> Traversable:
    return resources.files("rlx_core") / "templates" / "backend"


def _walk(node: Traversable, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Traversable]]:
    out = []
    for child in sorted(node.iterdir(), key=lambda c: c.name):
        if child.name == "__pycache__":
            continue
        if child.is_dir():
            out.extend(_walk(child, prefix + (child.name,)))
        elif child.name.endswith(TEMPLATE_SUFFIX):
            out.append((prefix + (child.name,), child))
    return out


def _fill(text: str, values: dict[str, str], where: str) -> str:
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", value)
    left = re.findall(r"\{\{\s*\w*\s*\}\}", text)
    if left:  # pragma: no cover - a broken template is a bug in rlx-core
        raise ScaffoldError(f"template {where} has unknown placeholders {sorted(set(left))}",
                            fix="this is a bug in rlx-core; please report it")
    return text


def render(name: str) -> dict[str, str]:
    """The generated files of backend ``name``: relative POSIX path -> text (nothing is written)."""
    values = template_vars(name)
    files: dict[str, str] = {}
    for parts, node in _walk(_templates()):
        rel = "/".join(p.replace(PKG_PLACEHOLDER, values["pkg"]) for p in parts)[: -len(TEMPLATE_SUFFIX)]
        files[rel] = _fill(node.read_text(encoding="utf-8"), values, "/".join(parts))
    if not files:  # pragma: no cover - an install without the package data
        raise ScaffoldError("the backend templates are missing from this rlx-core installation",
                            where=str(_templates()), fix="reinstall rlx-core")
    return files


@dataclass(frozen=True)
class Created:
    """What :func:`create` wrote."""

    name: str
    root: Path
    files: tuple[Path, ...]
    overwritten: tuple[Path, ...]


def create(name: str, dest: Path | str | None = None, *, force: bool = False,
           into: Path | str | None = None) -> Created:
    """Write the plugin package of backend ``name`` into ``dest`` (default: :func:`default_destination`,
    ``into`` the folder that gets ``rlx-NAME``; give one of ``dest`` and ``into``).

    Refuses an invalid name, a name an installed plugin already provides (unless ``force``) and a
    ``dest`` that exists and is not empty (unless ``force``: the generated files are then written
    over, other files in the folder are left alone).
    """
    if dest is not None and into is not None:
        raise ScaffoldError("give either the folder to create (--dir) or the folder to create rlx-NAME "
                            "in (--into), not both", fix="drop one of --dir and --into")
    validate_name(name, force=force)
    if into is not None and not Path(into).expanduser().is_dir():
        raise ScaffoldError(f"--into {into}: no such folder", where=str(into),
                            fix="create it first, or give an existing folder (rlx-NAME is made inside it)")
    root = Path(dest) if dest is not None else default_destination(name, into=into)
    root = root.expanduser().absolute()
    if root.exists() and not root.is_dir():
        raise DestinationExistsError(f"{root} exists and is not a folder",
                                     fix="choose another folder with --dir")
    if root.is_dir() and any(root.iterdir()) and not force:
        raise DestinationExistsError(
            f"folder {root} already exists and is not empty", where=str(root),
            fix="choose another folder with --dir, remove it, or pass --force to write the generated "
                "files over it (other files are kept)")
    files = render(name)
    written, overwritten = [], []
    for rel, text in files.items():
        path = root / rel
        if path.exists():
            if path.is_dir():
                raise DestinationExistsError(f"{path} is a folder where the plugin needs a file",
                                             fix="remove it, or choose another folder with --dir")
            overwritten.append(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return Created(name, root, tuple(written), tuple(overwritten))


def tree_lines(created: Created) -> list[str]:
    """The created files as an indented tree (``rlx-NAME/`` first)."""
    rel = sorted(p.relative_to(created.root).parts for p in created.files)
    lines = [f"{created.root.name}/"]
    seen: set[tuple[str, ...]] = set()
    for parts in rel:
        for depth in range(1, len(parts)):
            folder = parts[:depth]
            if folder not in seen:
                seen.add(folder)
                lines.append("  " * depth + folder[-1] + "/")
        lines.append("  " * len(parts) + parts[-1])
    return lines


def _display(path: Path) -> str:
    try:
        rel = os.path.relpath(path, Path.cwd())
    except ValueError:  # another drive (Windows)
        return str(path)
    return rel if not rel.startswith("..") else str(path)


def _name_callback(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        check_name_format(value)
    except InvalidNameError as e:
        raise click.BadParameter(f"{e.what}; {e.fix}", ctx=ctx, param=param) from None
    return value


@click.command("new-backend", context_settings={"help_option_names": ["-h", "--help"],
                                                "max_content_width": 100})
@click.argument("name", callback=_name_callback)
@click.option("--dir", "dest", type=click.Path(path_type=Path), default=None,
              help="Exactly the folder to create (default: ./rlx-NAME).")
@click.option("--into", "into", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="Create rlx-NAME inside the existing folder DIR (e.g. --into plugins in an RLX checkout).")
@click.option("--force", is_flag=True,
              help="Allow a NAME an installed backend already uses, and write into an existing folder "
                   "(generated files are overwritten, others kept).")
def new_backend(name: str, dest: Path | None, into: Path | None, force: bool) -> None:
    """Create a new backend plugin package NAME, certifiable as generated.

    The package (distribution rlx-NAME, module rlx_NAME, entry point NAME in the group
    rlx.backends) implements the hooks with one kernel, `add` on f32, and a compiled program over
    the core's planned arena; it passes `rlx conformance NAME` (every other variant is reported as
    skipped: not certified). NAME is a lowercase identifier.

    \b
    Examples:
      rlx new-backend acme
      rlx new-backend acme --dir ~/src/rlx-acme
      rlx new-backend acme --into plugins
    """
    created = create(name, dest, force=force, into=into)
    click.echo(f"Created backend plugin {name!r} in {_display(created.root)}:")
    for line in tree_lines(created):
        click.echo("  " + line)
    if created.overwritten:
        click.echo(f"(--force: overwrote {len(created.overwritten)} existing file(s))")
    where = _display(created.root)
    if not os.path.isabs(where) and not where.startswith("."):
        where = "./" + where  # pip reads a bare "rlx-NAME" as a package name, not a folder
    click.echo("")
    click.echo("Next:")
    click.echo(f"  pip install -e {where}          # add [test] for rlx-conformance + pytest")
    click.echo("  rlx doctor                       # the backend must show as PASS")
    click.echo(f"  rlx conformance {name} --markdown cert.md")
    click.echo(f"  pytest {_display(created.root / 'tests')}")
    click.echo(f"Then edit {_display(created.root / 'src' / f'rlx_{name}' / 'plugin.py')} "
               "(see its README.md and docs/AUTHORING.md).")


__all__ = ["Created", "DestinationExistsError", "InvalidNameError", "NameTakenError", "ScaffoldError",
           "check_name_format", "check_name_free", "create", "default_destination", "installed_backends",
           "new_backend", "render", "template_vars", "validate_name"]
