"""``rlx rocm-compile-check``: every kernel the conformance programs generate, compiled offline for AMD
targets (the stand-in for ``rlx conformance rocm`` where no AMD GPU exists). Imports click only; the
work is imported when the command runs."""

from __future__ import annotations

import click


@click.command("rocm-compile-check", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--arch", "archs", multiple=True, help="AMD target (repeatable); default gfx90a and gfx942.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def compile_check_command(archs: tuple[str, ...], as_json: bool) -> None:
    """Compile every HIP kernel the conformance suite's programs generate for rocm:0, with clang's
    AMDGPU back end. The verdict is "code generated and compiled": nothing executes here."""
    from rlx_core.plugin import echo_json

    from .check import compile_check
    from .offline import ARCHS

    res = compile_check(archs or ARCHS, log=None if as_json else click.echo)
    if as_json:
        echo_json(res.summary())
    else:
        click.echo(f"verdict: {res.summary()['verdict']}")
