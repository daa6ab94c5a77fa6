// Node.js half of bench/wasm_vs_ortweb.py: runs RLX's exported wasm module and onnxruntime-web's
// WebAssembly build in this one V8 process on the same inputs, interleaved, and prints JSON.
//
//   node bench/wasm_vs_ortweb.mjs CONFIG.json
//
// CONFIG (written by the Python driver): {rlx_dir, onnx, ortweb_dir, inputs: [{name, file, shape}],
// threads, warmup, repeats, out_dir}. Timings are whole calls (inputs in, outputs copied out) so
// both runtimes pay the same boundary costs; the outputs of the last call go to out_dir as raw f32.
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { pathToFileURL } from "node:url";

const cfg = JSON.parse(readFileSync(process.argv[2], "utf8"));

// onnxruntime-web lives in a private npm folder (build/ortweb), not next to this script.
const req = createRequire(path.join(cfg.ortweb_dir, "package.json"));
const ort = await import(pathToFileURL(req.resolve("onnxruntime-web")).href);
const { load } = await import(pathToFileURL(path.join(cfg.rlx_dir, "rlx_model.mjs")).href);

ort.env.wasm.numThreads = cfg.threads;
ort.env.wasm.proxy = false;
ort.env.logLevel = "error";

const feeds = {};
const rlxIn = {};
for (const spec of cfg.inputs) {
  const buf = readFileSync(spec.file);
  const data = new BigInt64Array(buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength));
  feeds[spec.name] = new ort.Tensor("int64", data, spec.shape);
  rlxIn[spec.name] = data;
}

const session = await ort.InferenceSession.create(cfg.onnx, {
  executionProviders: ["wasm"], graphOptimizationLevel: "all",
  intraOpNumThreads: cfg.threads, interOpNumThreads: 1,
});
const model = await load();

const runOrt = async () => {
  const r = await session.run(feeds);
  return r[session.outputNames[0]].data;
};
const runRlx = () => model.run(rlxIn)[model.outputs[0].name];

let outOrt = null;
let outRlx = null;
for (let i = 0; i < cfg.warmup; i++) {
  outOrt = await runOrt();
  outRlx = runRlx();
}
// Wall time is what a user waits; CPU time (user, this process) is also recorded because on a
// shared machine the wall time includes waiting for a core, which CPU time does not.
const times = { rlx: [], ortweb: [] };
const cpu = { rlx: [], ortweb: [] };
const now = () => Number(process.hrtime.bigint()) / 1e6;
for (let i = 0; i < cfg.repeats; i++) {
  // Alternate which goes first so neither always inherits the other's cache/thermal state.
  const order = i % 2 === 0 ? ["rlx", "ortweb"] : ["ortweb", "rlx"];
  for (const who of order) {
    const c = process.cpuUsage();
    const t = now();
    if (who === "rlx") outRlx = runRlx();
    else outOrt = await runOrt();
    times[who].push(now() - t);
    cpu[who].push(process.cpuUsage(c).user / 1e3);
  }
}
writeFileSync(path.join(cfg.out_dir, "out_rlx.f32"), Buffer.from(outRlx.buffer, outRlx.byteOffset, outRlx.byteLength));
writeFileSync(path.join(cfg.out_dir, "out_ortweb.f32"), Buffer.from(outOrt.buffer, outOrt.byteOffset, outOrt.byteLength));
await session.release();
console.log(JSON.stringify({
  node: process.versions.node, v8: process.versions.v8, ortweb: ort.env.versions?.web ?? "?",
  threads: cfg.threads, simd: model.manifest.simd, times, cpu,
}));
