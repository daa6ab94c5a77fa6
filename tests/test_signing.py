"""Signed IR (issue 14, item 8): `rlx keygen`, `rlx sign`, `rlx verify`, load(require_signature=)."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner, Result

from rlx_core import GraphBuilder, load, save
from rlx_core.cli import cli
from rlx_core.errors import SerializationError, SignatureError

pytest.importorskip("cryptography")

from rlx_core import signing


def _model(path: Path, value: float = 1.0) -> Path:
    g = GraphBuilder("signed")
    x = g.input("x", "f32", (4,))
    g.output(x + g.param("w", np.full(4, value, np.float32)))
    save(g.build(), path)
    return path


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    priv, pub, _ = signing.generate_keypair(tmp_path / "signing.key")
    return priv, pub


@pytest.fixture
def signed(tmp_path: Path, keys: tuple[Path, Path]) -> Path:
    model = _model(tmp_path / "m.rlx")
    signing.sign_file(model, keys[0])
    return model


def _cli(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="rlx")


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


# ---------------------------------------------------------------------------------------------
# Keys

def test_keygen_writes_a_private_0600_key_and_a_public_key(tmp_path: Path) -> None:
    priv, pub, fp = signing.generate_keypair(tmp_path / "k")
    assert pub == tmp_path / "k.pub"
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600
    assert b"PRIVATE KEY" in priv.read_bytes() and b"PUBLIC KEY" in pub.read_bytes()
    assert fp == signing.fingerprint(signing.load_public_key(pub))
    assert fp.startswith("ed25519:") and len(fp) == len("ed25519:") + 32
    with pytest.raises(SignatureError, match="never overwritten"):
        signing.generate_keypair(tmp_path / "k")
    _, _, fp2 = signing.generate_keypair(tmp_path / "k", force=True)
    assert fp2 != fp and stat.S_IMODE(priv.stat().st_mode) == 0o600


def test_a_private_key_others_can_read_is_refused(signed: Path, keys: tuple[Path, Path]) -> None:
    os.chmod(keys[0], 0o644)
    with pytest.raises(SignatureError, match="readable or writable by other users") as e:
        signing.sign_file(signed, keys[0])
    assert "chmod 600" in str(e.value)


def test_public_keys_in_every_accepted_form(signed: Path, keys: tuple[Path, Path]) -> None:
    from cryptography.hazmat.primitives import serialization

    pub = signing.load_public_key(keys[1])
    raw = pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    ssh = pub.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    forms = (keys[1], str(keys[1]), keys[1].read_bytes(), keys[1].read_text(), raw, ssh, ssh.decode(), pub)
    for form in forms:
        assert load(signed, require_signature=form).weights["w"].tolist() == [1, 1, 1, 1]


def test_wrong_kinds_of_key_are_named(tmp_path: Path, keys: tuple[Path, Path], signed: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    with pytest.raises(SignatureError, match="private key was given where the public key"):
        load(signed, require_signature=signing.load_private_key(keys[0]))
    junk = tmp_path / "junk.pub"
    junk.write_text("hello")
    with pytest.raises(SignatureError, match="not a public key"):
        load(signed, require_signature=junk)
    from cryptography.hazmat.primitives import serialization

    ec_pub = ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    with pytest.raises(SignatureError, match="not an ed25519 key"):
        load(signed, require_signature=ec_pub)
    with pytest.raises(SignatureError, match="cannot read the public key"):
        load(signed, require_signature=tmp_path / "nope.pub")


# ---------------------------------------------------------------------------------------------
# Sign, verify, load

def test_sign_verify_and_load_roundtrip(signed: Path, keys: tuple[Path, Path]) -> None:
    sig = signing.read_signature(signing.signature_path(signed))
    assert sig.size == signed.stat().st_size
    v = signing.verify_file(signed, keys[1])
    assert v.key == sig.key and v.size == sig.size
    g = load(signed, require_signature=keys[1])
    plain = load(signed)
    assert g.structure() == plain.structure()
    assert np.array_equal(g.weights["w"], plain.weights["w"])


def test_every_tampered_byte_is_refused_before_parsing(signed: Path, keys: tuple[Path, Path],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import rlx_core.ir.serialize as ser

    size = signed.stat().st_size
    original = signed.read_bytes()

    def parse(*a: Any, **k: Any) -> Any:
        raise AssertionError("a tampered file was parsed")

    monkeypatch.setattr(ser, "read_safetensors", parse)
    # The length prefix, the header (graph JSON) and the weights.
    for offset in (0, 9, size // 2, size - 1):
        _flip(signed, offset)
        with pytest.raises(SignatureError, match="changed after signing"):
            load(signed, require_signature=keys[1])
        with pytest.raises(SignatureError, match="changed after signing"):
            signing.verify_file(signed, keys[1])
        signed.write_bytes(original)
    signed.write_bytes(original + b" ")  # appended bytes
    with pytest.raises(SignatureError, match="changed after signing"):
        load(signed, require_signature=keys[1])


def test_wrong_key_missing_and_altered_signatures_are_refused(tmp_path: Path, signed: Path,
                                                              keys: tuple[Path, Path]) -> None:
    _, other_pub, other_fp = signing.generate_keypair(tmp_path / "other.key")
    with pytest.raises(SignatureError, match=f"not by the expected key {other_fp}"):
        load(signed, require_signature=other_pub)
    sig_path = signing.signature_path(signed)
    text = sig_path.read_text()
    # The statement edited to claim another digest: the signature no longer covers it.
    digest = signing.read_signature(sig_path).digest
    sig_path.write_text(text.replace(digest, "0" * 64))
    with pytest.raises(SignatureError, match="signature is invalid"):
        load(signed, require_signature=keys[1])
    for bad in ("", "rlx-signature 1\n", "x" * 10_000, text.replace("ed25519\n", "rsa\n"), "\x00" * 40):
        sig_path.write_text(bad)
        with pytest.raises(SignatureError, match="malformed"):
            load(signed, require_signature=keys[1])
    sig_path.unlink()
    with pytest.raises(SignatureError, match="has no signature"):
        load(signed, require_signature=keys[1])


def test_a_signature_of_another_model_is_refused(tmp_path: Path, keys: tuple[Path, Path],
                                                 signed: Path) -> None:
    other = _model(tmp_path / "other.rlx", value=2.0)
    signing.sign_file(other, keys[0])
    with pytest.raises(SignatureError, match="changed after signing"):
        load(signed, require_signature=keys[1], signature=signing.signature_path(other))


def test_a_signed_load_parses_its_private_copy(signed: Path, keys: tuple[Path, Path]) -> None:
    # Changing the file in place after the check must not reach the loaded graph (no check/use race).
    g = load(signed, require_signature=keys[1])
    data = bytearray(signed.read_bytes())
    data[-16:] = bytes(16)
    with open(signed, "r+b") as f:
        f.write(bytes(data))
    assert g.weights["w"].tolist() == [1, 1, 1, 1]


def test_a_signed_file_that_is_not_a_model_names_the_users_file(tmp_path: Path,
                                                                keys: tuple[Path, Path]) -> None:
    from rlx_core.formats.safetensors import write_safetensors

    p = tmp_path / "weights.rlx"
    write_safetensors(p, {"w": np.ones(2, np.float32)}, {})
    signing.sign_file(p, keys[0])
    with pytest.raises(SerializationError, match="plain safetensors file") as e:
        load(p, require_signature=keys[1])
    assert not isinstance(e.value, SignatureError)
    assert str(p) in str(e.value) and "/proc/self/fd" not in str(e.value)


def test_signature_without_key_is_an_error(signed: Path) -> None:
    with pytest.raises(SerializationError, match="without the key"):
        load(signed, signature=signing.signature_path(signed))


def test_missing_cryptography_names_the_extra(monkeypatch: pytest.MonkeyPatch, signed: Path,
                                              keys: tuple[Path, Path]) -> None:
    for name in [m for m in sys.modules if m == "cryptography" or m.startswith("cryptography.")]:
        monkeypatch.setitem(sys.modules, name, None)  # None in sys.modules: "import fails"
    with pytest.raises(SignatureError, match=r"rlx-core\[sign\]"):
        load(signed, require_signature=keys[1])
    r = _cli("verify", str(signed), "--pub", str(keys[1]))
    assert r.exit_code == 1 and "rlx-core[sign]" in r.stderr


# ---------------------------------------------------------------------------------------------
# Commands

def test_cli_keygen_sign_verify(tmp_path: Path) -> None:
    model = _model(tmp_path / "m.rlx")
    key = tmp_path / "k"
    r = _cli("keygen", str(key))
    assert r.exit_code == 0, r.output
    assert "fingerprint: ed25519:" in r.stdout and stat.S_IMODE(key.stat().st_mode) == 0o600
    assert _cli("keygen", str(key)).exit_code == 1  # never overwritten silently
    r = _cli("sign", str(model), "--key", str(key))
    assert r.exit_code == 0, r.output
    assert (tmp_path / "m.rlx.sig").exists()
    r = _cli("verify", str(model), "--pub", f"{key}.pub")
    assert r.exit_code == 0 and r.stdout.startswith("OK:"), r.output
    r = _cli("verify", str(model), "--pub", f"{key}.pub", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["valid"] is True
    # Tampered, wrong key, missing signature: exit 1 with what/where/fix; a usage error is 2.
    _flip(model, model.stat().st_size - 1)
    r = _cli("verify", str(model), "--pub", f"{key}.pub")
    assert r.exit_code == 1 and "changed after signing" in r.stderr and "fix:" in r.stderr
    r = _cli("verify", str(model), "--pub", f"{key}.pub", "--json")
    rep = json.loads(r.stdout)
    assert r.exit_code == 1 and rep["valid"] is False and rep["error"]["type"] == "SignatureError"
    _cli("keygen", str(tmp_path / "k2"))
    model2 = _model(tmp_path / "m2.rlx")
    assert _cli("sign", str(model2), "--key", str(tmp_path / "k2")).exit_code == 0
    r = _cli("verify", str(model2), "--pub", f"{key}.pub")
    assert r.exit_code == 1 and "not by the expected key" in r.stderr
    (tmp_path / "m2.rlx.sig").unlink()
    r = _cli("verify", str(model2), "--pub", f"{key}.pub")
    assert r.exit_code == 1 and "has no signature" in r.stderr
    assert _cli("verify", str(model2)).exit_code == 2


def test_cli_sign_checks_the_model_first(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    junk = tmp_path / "junk.rlx"
    junk.write_bytes(b"not a model")
    r = _cli("sign", str(junk), "--key", str(keys[0]))
    assert r.exit_code == 1 and not (tmp_path / "junk.rlx.sig").exists()
    r = _cli("sign", str(junk), "--key", str(keys[0]), "--no-check", "--sig", str(tmp_path / "j.sig"))
    assert r.exit_code == 0, r.output
    assert signing.verify_file(junk, keys[1], tmp_path / "j.sig").size == len(b"not a model")


@pytest.mark.parametrize("command", ["keygen", "sign", "verify"])
def test_signing_commands_have_help_with_an_example(command: str) -> None:
    r = _cli(command, "--help")
    assert r.exit_code == 0 and "Example" in r.output, r.output
    assert command in _cli("--help").output


def test_run_and_explain_require_a_signature(tmp_path: Path, signed: Path, keys: tuple[Path, Path],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    pub = str(keys[1])
    ok = _cli("run", str(signed), "--random", "--device", "cpu", "--require-signature", pub, "--json")
    assert ok.exit_code == 0, ok.output
    assert _cli("explain", str(signed), "--require-signature", pub).exit_code == 0
    _flip(signed, signed.stat().st_size - 1)
    for command in ("run", "explain"):
        args = [command, str(signed), "--require-signature", pub] + (["--random"] if command == "run" else [])
        res = _cli(*args)
        assert res.exit_code != 0 and "signature" in res.output.lower() and "Traceback" not in res.output
    unsigned = _model(tmp_path / "unsigned.rlx")
    monkeypatch.setenv("RLX_REQUIRE_SIGNATURE", pub)  # a deployment's policy, set once
    res = _cli("run", str(unsigned), "--random")
    assert res.exit_code != 0 and "signature" in res.output.lower()
    onnx_file = tmp_path / "m.onnx"
    onnx_file.write_bytes(b"\x08\x07")
    res = _cli("explain", str(onnx_file))
    assert res.exit_code != 0 and ".rlx files only" in res.output
