"""Detached ed25519 signatures for model files: ``rlx keygen``, ``rlx sign``, ``rlx verify`` and
``rlx_core.load(path, require_signature=KEY)``.

What is signed is the file's exact bytes (docs/FORMAT.md, "Signatures"): a statement naming their
SHA-256, their length and the signing key is signed with ed25519 and stored next to the model as
``MODEL.rlx.sig``. Exact bytes rather than a re-serialisation, because the bytes are what a loader
parses: nothing the signature does not cover can reach the parser, and signing needs no RLX code.

A signed load reads the file once, hashing it into a private in-memory copy, and parses that copy
only after the signature, the key and the digest all check out, so the file cannot change between
the check and the use. Every failure is a :class:`~rlx_core.errors.SignatureError`, raised before
anything in the model is parsed.

Needs the ``cryptography`` package: ``pip install 'rlx-core[sign]'``.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar, Union

from .errors import SerializationError, SignatureError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
    from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes, PublicKeyTypes

_T = TypeVar("_T")
PathLike = Union[str, "os.PathLike[str]"]
#: A public key: a key file's path, its text or bytes (PEM, OpenSSH ``ssh-ed25519 ...``, or the raw
#: 32 bytes), or a ``cryptography`` Ed25519PublicKey.
PublicKeyLike = Union[str, "os.PathLike[str]", bytes, "Ed25519PublicKey"]
PrivateKeyLike = Union[str, "os.PathLike[str]", bytes, "Ed25519PrivateKey"]

SIG_SUFFIX = ".sig"
MAGIC = "rlx-signature 1"
_MAX_SIG_BYTES = 4096  # a real one is ~330 bytes; never read an unbounded file
_MAX_KEY_BYTES = 16384
_CHUNK = 1 << 20
_EXTRA_FIX = "install it with: pip install 'rlx-core[sign]' (or pip install cryptography)"
_SIG_RE = re.compile(
    r"rlx-signature 1\n"
    r"algorithm ed25519\n"
    r"file sha256 (?P<digest>[0-9a-f]{64})\n"
    r"size (?P<size>0|[1-9][0-9]{0,18})\n"
    r"key (?P<key>ed25519:[0-9a-f]{32})\n"
    r"signature (?P<sig>[A-Za-z0-9+/]{86}==)\n")


def _crypto() -> Any:
    """The ed25519 module of ``cryptography``, or an error naming the extra that installs it."""
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as e:
        raise SignatureError(f"signing and verifying models needs the 'cryptography' package, which is "
                             f"not installed ({e})", where="rlx_core.signing", fix=_EXTRA_FIX) from None
    return ed25519


def _where(path: PathLike) -> str:
    return f"file {os.fspath(path)}"


# ---------------------------------------------------------------------------------------------
# Keys


def fingerprint(public_key: Ed25519PublicKey) -> str:
    """A short, stable name for a public key: ``ed25519:`` + 32 hex digits of SHA-256 of its raw bytes."""
    from cryptography.hazmat.primitives import serialization

    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "ed25519:" + hashlib.sha256(raw).hexdigest()[:32]


def _key_bytes(key: str | os.PathLike[str] | bytes, kind: str) -> tuple[bytes, str]:
    """The key's bytes and where they came from (for messages); text that is a key is used as is."""
    if isinstance(key, bytes):
        return key, f"the {kind} key given as bytes"
    if isinstance(key, str) and (key.lstrip().startswith(("-----BEGIN", "ssh-ed25519 "))):
        return key.encode(), f"the {kind} key given as text"
    path = Path(os.fspath(key))
    try:
        with open(path, "rb") as f:
            if kind == "private" and os.name == "posix":
                st = os.fstat(f.fileno())
                if st.st_mode & 0o077:
                    raise SignatureError(
                        f"the private key file is readable or writable by other users (mode "
                        f"{stat.S_IMODE(st.st_mode):o})", where=_where(path),
                        fix=f"chmod 600 {path}; if others could read it, make a new key with rlx keygen")
            data = f.read(_MAX_KEY_BYTES + 1)
    except OSError as e:
        raise SignatureError(f"cannot read the {kind} key: {e.strerror or e}", where=_where(path),
                             fix="check the path; make a key pair with: rlx keygen KEY") from None
    if len(data) > _MAX_KEY_BYTES:
        raise SignatureError(f"the {kind} key file is over {_MAX_KEY_BYTES} bytes: not a key",
                             where=_where(path), fix="pass the key written by rlx keygen")
    return data, _where(path)


def load_public_key(key: PublicKeyLike) -> Ed25519PublicKey:
    """An Ed25519PublicKey from a path, PEM/OpenSSH text or bytes, the raw 32 bytes, or a key object."""
    ed25519 = _crypto()
    if isinstance(key, ed25519.Ed25519PublicKey):
        return key
    if isinstance(key, ed25519.Ed25519PrivateKey):
        raise SignatureError("a private key was given where the public key is needed", where="public key",
                             fix="pass the public key (KEY.pub from rlx keygen); keep the private key "
                                 "with whoever signs")
    if not isinstance(key, (str, bytes, os.PathLike)):
        raise SignatureError(f"a public key must be a path, bytes or an Ed25519PublicKey, not "
                             f"{type(key).__name__}", where="public key", fix="pass KEY.pub from rlx keygen")
    data, where = _key_bytes(key, "public")
    from cryptography.hazmat.primitives import serialization

    loaded: PublicKeyTypes  # any key type the loaders read; checked for ed25519 below
    try:
        if len(data) == 32:
            return ed25519.Ed25519PublicKey.from_public_bytes(data)
        text = data.strip()
        if text.startswith(b"ssh-"):
            loaded = serialization.load_ssh_public_key(text)
        else:
            loaded = serialization.load_pem_public_key(text)
    except (ValueError, TypeError) as e:
        raise SignatureError(f"this is not a public key RLX can read ({e})", where=where,
                             fix="pass the .pub file written by rlx keygen (PEM), an OpenSSH "
                                 "ssh-ed25519 public key, or the raw 32 key bytes") from None
    if not isinstance(loaded, ed25519.Ed25519PublicKey):
        raise SignatureError(f"the public key is a {type(loaded).__name__.removeprefix('_')}, not an "
                             "ed25519 key", where=where, fix="make an ed25519 key pair with rlx keygen")
    return loaded


def load_private_key(key: PrivateKeyLike) -> Ed25519PrivateKey:
    """An Ed25519PrivateKey from a path (mode 0600), PEM/OpenSSH bytes, or a key object."""
    ed25519 = _crypto()
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return key
    if not isinstance(key, (str, bytes, os.PathLike)):
        raise SignatureError(f"a private key must be a path, bytes or an Ed25519PrivateKey, not "
                             f"{type(key).__name__}", where="private key", fix="pass the KEY from rlx keygen")
    data, where = _key_bytes(key, "private")
    from cryptography.hazmat.primitives import serialization

    loaded: PrivateKeyTypes  # any key type the loaders read; checked for ed25519 below
    try:
        if b"OPENSSH PRIVATE KEY" in data:
            loaded = serialization.load_ssh_private_key(data, password=None)
        else:
            loaded = serialization.load_pem_private_key(data, password=None)
    except TypeError as e:  # cryptography: "Password was not given but private key is encrypted"
        raise SignatureError(f"the private key is encrypted ({e}); RLX reads unencrypted keys only",
                             where=where, fix="keep the key in a 0600 file (rlx keygen writes one), or "
                                              "decrypt a copy for signing") from None
    except ValueError as e:
        raise SignatureError(f"this is not a private key RLX can read ({e})", where=where,
                             fix="pass the private key file written by rlx keygen") from None
    if not isinstance(loaded, ed25519.Ed25519PrivateKey):
        raise SignatureError(f"the private key is a {type(loaded).__name__.removeprefix('_')}, not an "
                             "ed25519 key", where=where, fix="make an ed25519 key pair with rlx keygen")
    return loaded


def _write_new(path: Path, data: bytes, mode: int, *, force: bool) -> None:
    """Write ``data`` with ``mode`` from the first byte (never a moment with wider permissions)."""
    if not force:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(path, flags, mode)
        except FileExistsError:
            raise SignatureError("the file exists; keys are never overwritten silently", where=_where(path),
                                 fix="choose another name, or pass --force (force=True)") from None
        except OSError as e:
            raise SignatureError(f"cannot create the file: {e.strerror or e}", where=_where(path),
                                 fix="check that the folder exists and is writable") from None
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as e:
        raise SignatureError(f"cannot create the file: {e.strerror or e}", where=_where(path),
                             fix="check that the folder exists and is writable") from None
    try:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def generate_keypair(private_path: PathLike, public_path: PathLike | None = None, *,
                     force: bool = False) -> tuple[Path, Path, str]:
    """Write a new ed25519 private key (PEM PKCS#8, mode 0600) and its public key (PEM, ``KEY.pub``).

    Returns both paths and the key's fingerprint. Existing files are refused unless ``force``."""
    ed25519 = _crypto()
    from cryptography.hazmat.primitives import serialization

    priv = Path(os.fspath(private_path))
    pub = Path(os.fspath(public_path)) if public_path is not None else priv.with_name(priv.name + ".pub")
    if priv.resolve() == pub.resolve():
        raise SignatureError("the private and public key paths are the same file", where=_where(priv),
                             fix="give the public key another name (default KEY.pub)")
    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    pub_pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                            serialization.PublicFormat.SubjectPublicKeyInfo)
    if not force and pub.exists():  # check both before writing either
        raise SignatureError("the file exists; keys are never overwritten silently", where=_where(pub),
                             fix="choose another name, or pass --force (force=True)")
    _write_new(priv, pem, 0o600, force=force)
    _write_new(pub, pub_pem, 0o644, force=force)
    return priv, pub, fingerprint(key.public_key())


# ---------------------------------------------------------------------------------------------
# Signatures


@dataclass(frozen=True)
class Signature:
    """A parsed ``.sig`` file: what was signed (digest, size), by which key, and the signature."""

    digest: str
    size: int
    key: str
    signature: bytes

    def statement(self) -> bytes:
        """The exact bytes the ed25519 signature covers."""
        return _statement(self.digest, self.size, self.key)

    def text(self) -> str:
        return self.statement().decode() + f"signature {base64.b64encode(self.signature).decode()}\n"


def _statement(digest: str, size: int, key: str) -> bytes:
    return f"{MAGIC}\nalgorithm ed25519\nfile sha256 {digest}\nsize {size}\nkey {key}\n".encode()


def signature_path(path: PathLike) -> Path:
    """Where the detached signature of ``path`` lives by default: ``path`` + ``.sig``."""
    p = Path(os.fspath(path))
    return p.with_name(p.name + SIG_SUFFIX)


def read_signature(sig_path: PathLike) -> Signature:
    """Parse a ``.sig`` file strictly (one exact layout, bounded size)."""
    p = Path(os.fspath(sig_path))
    try:
        with open(p, "rb") as f:
            raw = f.read(_MAX_SIG_BYTES + 1)
    except FileNotFoundError:
        raise SignatureError("the model has no signature: the signature file does not exist",
                             where=_where(p), fix="sign the model with: rlx sign MODEL --key KEY, or pass "
                                                  "the signature's path (--sig, signature=)") from None
    except OSError as e:
        raise SignatureError(f"cannot read the signature file: {e.strerror or e}", where=_where(p),
                             fix="check the path and its permissions") from None
    m = None
    if len(raw) <= _MAX_SIG_BYTES:
        try:
            m = _SIG_RE.fullmatch(raw.decode("ascii"))
        except UnicodeDecodeError:
            m = None
    if m is None:
        raise SignatureError("the signature file is malformed: not an RLX signature (version 1)",
                             where=_where(p), fix="sign the model again with rlx sign; see docs/FORMAT.md, "
                                                  "Signatures, for the layout")
    return Signature(m["digest"], int(m["size"]), m["key"], base64.b64decode(m["sig"], validate=True))


def _hash_file(path: PathLike, copy_to: IO[bytes] | None = None) -> tuple[str, int]:
    """SHA-256 and length of the file, optionally copying the very bytes hashed into ``copy_to``."""
    h = hashlib.sha256()
    size = 0
    try:
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
                size += len(chunk)
                if copy_to is not None:
                    copy_to.write(chunk)
    except OSError as e:
        raise SignatureError(f"cannot read the model: {e.strerror or e}", where=_where(path),
                             fix="check that the path exists and is readable") from None
    return h.hexdigest(), size


def sign_file(path: PathLike, private_key: PrivateKeyLike, sig_path: PathLike | None = None) -> Path:
    """Sign the exact bytes of ``path``; write the detached signature (default ``path.sig``)."""
    key = load_private_key(private_key)
    digest, size = _hash_file(path)
    fp = fingerprint(key.public_key())
    sig = Signature(digest, size, fp, key.sign(_statement(digest, size, fp)))
    out = Path(os.fspath(sig_path)) if sig_path is not None else signature_path(path)
    _write_new(out, sig.text().encode(), 0o644, force=True)
    return out


def _check(sig: Signature, public_key: Ed25519PublicKey, where: str) -> None:
    """The signature is by ``public_key`` and covers its statement (not yet: that the file matches)."""
    from cryptography.exceptions import InvalidSignature

    want = fingerprint(public_key)
    if sig.key != want:
        raise SignatureError(f"the model is signed by key {sig.key}, not by the expected key {want}",
                             where=where, fix="verify with the public key of whoever signed it, or have "
                                              "the model signed with the expected key")
    try:
        public_key.verify(sig.signature, sig.statement())
    except InvalidSignature:
        raise SignatureError("the signature is invalid: the signature file was altered, or it was not "
                             "made with this key", where=where,
                             fix="do not use this model; get it and its .sig again from its source") from None


def _match(sig: Signature, digest: str, size: int, where: str) -> None:
    if (digest, size) != (sig.digest, sig.size):
        raise SignatureError(f"the model does not match its signature: it was changed after signing "
                             f"(now {size} bytes, sha256 {digest[:16]}...; signed: {sig.size} bytes, "
                             f"sha256 {sig.digest[:16]}...)", where=where,
                             fix="do not use this model; get it again from its source, or sign the new "
                                 "version with rlx sign")


@dataclass(frozen=True)
class Verified:
    """A successful verification: which key signed which bytes."""

    path: str
    key: str
    digest: str
    size: int


def verify_file(path: PathLike, public_key: PublicKeyLike, sig_path: PathLike | None = None) -> Verified:
    """Check that ``path`` is exactly the file ``public_key``'s owner signed; raise SignatureError if not."""
    pub = load_public_key(public_key)
    sp = Path(os.fspath(sig_path)) if sig_path is not None else signature_path(path)
    sig = read_signature(sp)
    where = f"{_where(path)}, signature {sp}"
    _check(sig, pub, where)
    digest, size = _hash_file(path)
    _match(sig, digest, size, where)
    return Verified(os.fspath(path), sig.key, digest, size)


@contextlib.contextmanager
def _private_copy() -> Iterator[tuple[IO[bytes], str]]:
    """A file only this process can reach, and a path that opens it (for the memory-mapping loader)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("rlx-signed-model", getattr(os, "MFD_CLOEXEC", 0))
        proc = f"/proc/self/fd/{fd}"
        if os.path.exists(proc):
            with os.fdopen(fd, "w+b") as f:
                yield f, proc
            return
        os.close(fd)
    folder = tempfile.mkdtemp(prefix="rlx-signed-")  # mode 0700
    path = os.path.join(folder, "model.rlx")
    try:
        with open(path, "w+b") as f:
            yield f, path
    finally:  # a live memory map keeps the data on POSIX; elsewhere the folder may have to stay
        with contextlib.suppress(OSError):
            os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(folder)


def load_signed(path: PathLike, public_key: PublicKeyLike, sig_path: PathLike | None,
                parse: Callable[[str], _T]) -> _T:
    """``rlx_core.load(path, require_signature=public_key)``: verify, then ``parse`` the verified
    bytes (a private copy's path). The parser is passed in (:func:`rlx_core.ir.serialize.load`):
    signing is below the model format and knows nothing of it."""
    pub = load_public_key(public_key)
    sp = Path(os.fspath(sig_path)) if sig_path is not None else signature_path(path)
    sig = read_signature(sp)
    where = f"{_where(path)}, signature {sp}"
    _check(sig, pub, where)  # cheap checks first: a bad signature never costs a read of the model
    original = os.fspath(path)
    with _private_copy() as (f, private):
        digest, size = _hash_file(path, copy_to=f)
        _match(sig, digest, size, where)
        f.flush()
        try:
            return parse(private)
        except SerializationError as e:  # name the user's file, not the private copy
            raise type(e)(e.what.replace(private, original),
                          where=e.where.replace(private, original) if e.where else None,
                          fix=e.fix) from None
