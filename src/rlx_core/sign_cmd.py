"""``rlx keygen``, ``rlx sign`` and ``rlx verify`` (listed lazily by rlx_core.cli.LAZY_COMMANDS).

The commands over :mod:`rlx_core.signing`; kept apart from it because ``rlx sign`` loads the model
first (:mod:`rlx_core.ir.serialize`), which itself uses signing for signed loads.
"""

from __future__ import annotations

import json
from typing import Any

import click

from .errors import SignatureError
from .ir import serialize
from .signing import generate_keypair, load_private_key, read_signature, sign_file, verify_file


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


@click.command("keygen", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("key", type=click.Path(dir_okay=False))
@click.option("--pub", "pub_path", type=click.Path(dir_okay=False), default=None,
              help="Where to write the public key (default: KEY.pub).")
@click.option("--force", is_flag=True, help="Overwrite existing key files.")
def keygen_command(key: str, pub_path: str | None, force: bool) -> None:
    """Make an ed25519 key pair for signing models.

    Writes the private key to KEY (PEM, mode 0600: keep it secret) and the public key to KEY.pub
    (give it to whoever loads your models). Existing files are never overwritten without --force.

    \b
    Examples:
      rlx keygen ~/.rlx/signing.key
      rlx sign model.rlx --key ~/.rlx/signing.key
      rlx verify model.rlx --pub ~/.rlx/signing.key.pub
    """
    priv, pub, fp = generate_keypair(key, pub_path, force=force)
    click.echo(f"private key: {priv} (mode 0600; keep it secret)")
    click.echo(f"public key:  {pub}")
    click.echo(f"fingerprint: {fp}")


@click.command("sign", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("--key", "key", required=True, type=click.Path(dir_okay=False),
              help="The private key (from rlx keygen).")
@click.option("--sig", "sig_path", type=click.Path(dir_okay=False), default=None,
              help="Where to write the signature (default: MODEL.sig).")
@click.option("--no-check", is_flag=True, help="Sign without first loading the file as an .rlx model.")
def sign_command(model: str, key: str, sig_path: str | None, no_check: bool) -> None:
    """Sign a model file with ed25519 (a detached signature, MODEL.sig).

    The signature covers the file's exact bytes. The model is loaded first, so that only a valid
    .rlx file is signed (--no-check skips that, e.g. for other file types).

    \b
    Examples:
      rlx keygen signing.key
      rlx sign model.rlx --key signing.key
      rlx sign model.rlx --key signing.key --sig release/model.rlx.sig
    """
    load_private_key(key)  # a bad key is reported before the model is read
    if not no_check:
        serialize.load(model)
    out = sign_file(model, key, sig_path)
    sig = read_signature(out)
    click.echo(f"signed {model} ({sig.size} bytes, sha256 {sig.digest}) with key {sig.key}")
    click.echo(f"signature: {out}")


@click.command("verify", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("--pub", "pub", required=True, type=click.Path(dir_okay=False),
              help="The signer's public key (KEY.pub from rlx keygen, or an ssh-ed25519 .pub).")
@click.option("--sig", "sig_path", type=click.Path(dir_okay=False), default=None,
              help="The signature file (default: MODEL.sig).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout.")
def verify_command(model: str, pub: str, sig_path: str | None, as_json: bool) -> None:
    """Check that a model file is exactly what the holder of a key signed.

    Exit code 0 when the signature is valid, 1 when it is missing, malformed, made with another
    key, or the file was changed after signing. In Python, rlx_core.load(path,
    require_signature=PUB) does the same check before it parses anything.

    \b
    Examples:
      rlx verify model.rlx --pub signing.key.pub
      rlx verify model.rlx --pub signing.key.pub --sig release/model.rlx.sig --json
    """
    try:
        v = verify_file(model, pub, sig_path)
    except SignatureError as e:
        if not as_json:
            raise
        _echo_json({"valid": False, "path": model, "error": {"type": type(e).__name__, "what": e.what,
                                                              "where": e.where, "fix": e.fix}})
        raise click.exceptions.Exit(1) from None
    if as_json:
        _echo_json({"valid": True, "path": v.path, "key": v.key, "sha256": v.digest, "size": v.size})
    else:
        click.echo(f"OK: {model} is signed by {v.key} (sha256 {v.digest}, {v.size} bytes)")
