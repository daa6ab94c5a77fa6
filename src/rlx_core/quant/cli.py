"""``rlx quantize MODEL --calib DATA.npz -o MODEL_INT8.rlx``: post-training quantization from the CLI."""

from __future__ import annotations

from typing import Any

import click

from .calibrate import METHODS


@click.command("quantize", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("--calib", "calib", type=click.Path(exists=True, dir_okay=False), default=None,
              help="An .npz with one array per graph input, samples along axis 0 (required for INT8).")
@click.option("--output", "-o", "output", type=click.Path(dir_okay=False), required=True,
              help="Where to write the quantized .rlx model.")
@click.option("--method", type=click.Choice(METHODS), default="maxabs", show_default=True,
              help="Calibration: maxabs (no clipping), percentile (clip outliers), minmax.")
@click.option("--percentile", type=float, default=99.99, show_default=True,
              help="Percentile for --method percentile.")
@click.option("--per-tensor", is_flag=True, help="One weight scale per tensor (default: per output channel).")
@click.option("--symmetric-activations", is_flag=True, help="Activations with zero point 0.")
@click.option("--softmax", type=click.Choice(["int8", "argmax"]), default="int8", show_default=True,
              help="A softmax becomes softmax_i8, or (argmax) an output softmax becomes the class index.")
@click.option("--int8-outputs", is_flag=True,
              help="Keep quantized outputs int8 (default: dequantize to f32).")
@click.option("--int4", "int4", is_flag=True, help="INT4 weight-only quantization instead (no calibration).")
@click.option("--group-size", type=int, default=32, show_default=True, help="Columns per INT4 scale.")
@click.option("--batch-size", type=int, default=256, show_default=True, help="Calibration batch size.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def quantize_command(model: str, calib: str | None, output: str, method: str, percentile: float,
                     per_tensor: bool, symmetric_activations: bool, softmax: str, int8_outputs: bool,
                     int4: bool, group_size: int, batch_size: int, as_json: bool) -> None:
    """Quantize a float model: INT8 post-training quantization, or INT4 weight-only.

    INT8 measures every activation's range on --calib samples, stores weights as int8 (symmetric,
    per output channel) and rewrites the graph with the quantized ops (matmul_i8, conv2d_i8,
    requantize, softmax_i8, ...); the interface stays the same (f32 in, f32 out). The result runs
    on any backend (rlx-cpu through decompositions) and natively on rlx-cortexm.

    \b
    Examples:
      rlx quantize mlp.rlx --calib calib.npz -o mlp_int8.rlx
      rlx quantize cnn.rlx --calib calib.npz --method percentile --percentile 99.9 -o cnn_int8.rlx
      rlx quantize llm.rlx --int4 --group-size 64 -o llm_int4.rlx
    """
    import numpy as np

    from ..cliutil import echo_json, load_model
    from ..errors import InputError
    from ..ir.serialize import save
    from . import quantize_graph, quantize_weights_int4

    graph = load_model(model)
    if int4:
        q = quantize_weights_int4(graph, group_size=group_size)
    else:
        if calib is None:
            raise click.UsageError("INT8 quantization needs --calib DATA.npz (or use --int4)")
        try:
            with np.load(calib, allow_pickle=False) as z:
                data = {k: z[k] for k in z.files}
        except (OSError, ValueError) as e:
            raise InputError(f"cannot read {calib!r} as an .npz archive: {e}", where=f"--calib {calib}",
                             fix="write it with numpy.savez(path, x=samples, ...) (one array per input)"
                             ) from None
        q = quantize_graph(graph, data, method=method, percentile=percentile, per_channel=not per_tensor,
                           symmetric_activations=symmetric_activations, softmax=softmax,
                           dequantize_outputs=not int8_outputs, batch_size=batch_size)
    save(q, output)

    def nbytes(g: Any) -> int:
        return int(sum(np.asarray(g.weights[p.name]).nbytes for p in g.params))

    ops = q.op_counts()
    info = {"model": model, "output": output, "mode": "int4 weight-only" if int4 else "int8",
            "method": None if int4 else method, "nodes_before": len(graph.nodes), "nodes_after": len(q.nodes),
            "weight_bytes_before": nbytes(graph), "weight_bytes_after": nbytes(q), "ops": ops}
    if as_json:
        echo_json(info)
        return
    click.echo(f"wrote {output}: {info['mode']}"
               f"{'' if int4 else f' (calibration {method} on {calib})'}")
    click.echo(f"  nodes {info['nodes_before']} -> {info['nodes_after']}, weights "
               f"{info['weight_bytes_before']} B -> {info['weight_bytes_after']} B")
    click.echo("  ops: " + ", ".join(f"{k} x{v}" for k, v in sorted(ops.items())))
