// The engine benchmark's llama.cpp peer (bench/llama-cpp.ts): a tiny Qwen3 written as a GGUF by
// scripts/hf-to-gguf.py (gguf.GGUFWriter) and loaded by node-llama-cpp's prebuilt llama.cpp gives the
// engine's logits at every prompt position (float32, flash attention off: its CPU path rounds through
// float16) and the engine's greedy continuation, so the conversion is right (names, q/k norms, RoPE
// base, head sizes, the tied head; every norm has its own weights); the F16 and BF16 GGUFs load and stay near
// the float32 logits, and the BF16 GGUF's logits agree with the engine's bfloat16 ones (BF16_TOL); the bench
// rows carry numbers. Outside CI a missing gguf package or node-llama-cpp skips, saying why; under CI=true it fails.
import { closeSync, openSync, readFileSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { ggufPython, llamaCppChild, llamaCppMissing, llamaCppRows, runLlamaCpp, writeGguf } from '../bench/llama-cpp.js';
import { Model } from '../lib/engine/model.js';
import { initModel } from '../lib/model/init.js';
import { readSafetensorsHeader } from '../lib/model/safetensors.js';
import { needs } from './helpers/shared.js';

const python = ggufPython();
const skip = needs(llamaCppMissing(python), t);
const V = 151936;
const PROMPT = Array.from({ length: 12 }, (_, i) => ((i * 7919) % 100000) + 100);
/** Float32 on both sides, different summation orders. */
const TOL = 1e-4; // measured 2.1e-5 (logits up to 19)
/**
 * The BF16 GGUF in llama.cpp against the engine in bfloat16, as a fraction of the largest logit: the
 * same bf16 weights (gguf.quants and torch both round to nearest even), but llama.cpp rounds only each
 * matmul's input to bf16 (its BF16 dot product sums in float32; norms, softmax and the residual stream
 * stay float32) where the engine keeps its activations in bf16, so they differ by bf16 roundings (8-bit
 * mantissa). Measured 2026-11-26 (this test's model, logits up to 20.2): 0.435, 0.022 of the largest
 * logit (without the distinct norms: 0.45, rms 0.058, the argmax equal at 11 of 12 positions);
 * llama.cpp's BF16 is nearer the float32 engine (0.42 here, 0.23 without the distinct norms), which is
 * 0.48 from the engine's bfloat16 (without the distinct norms). A wrong tensor moves logits by whole units.
 */
const BF16_TOL = 0.04;

/**
 * init-model's norms are all ones, so a GGUF with two norms swapped (or a q/k norm left out) would
 * still agree: every norm weight gets its own values here (float32, in place).
 */
function distinctNorms(dir: string): void {
  const file = join(dir, 'model.safetensors');
  const header = readSafetensorsHeader(file);
  const base = 8 + Number(readFileSync(file).readBigUInt64LE(0));
  const fd = openSync(file, 'r+');
  let k = 0;
  for (const [name, e] of Object.entries(header)) {
    if (!name.endsWith('norm.weight')) continue;
    k++;
    const v = Float32Array.from({ length: e.shape[0] }, (_, i) => 1 + 0.5 * Math.sin(k * 1.7 + i * 0.37));
    writeSync(fd, new Uint8Array(v.buffer), 0, v.byteLength, base + e.data_offsets[0]);
  }
  closeSync(fd);
}

interface Greedy {
  tokens: number[];
  vocab: number;
  flash_attention: string;
}

t.test('a tiny Qwen3 as GGUF: llama.cpp logits and greedy tokens equal the engine', { skip, timeout: 600_000 }, async (t) => {
  const tmp = t.testdir();
  const dir = join(tmp, 'tiny');
  // Larger weights than HF's 0.02 (as test/bench-eager): the logits then depend on attention, the MLP and
  // the norms, and greedy decoding does not repeat one token.
  initModel({ preset: 'tiny', out: dir, seed: 3, embedStd: 0.5, overrides: { initializer_range: 0.3 } });
  distinctNorms(dir);
  const m = await Model.load(dir);
  t.teardown(() => m.dispose());
  const ours = await m.logits([PROMPT]);
  const g = await m.generate({ prompts: [Int32Array.from(PROMPT)], maxNewTokens: 16, greedy: true });
  const mine = Array.from(g.tokens[0]);
  const mb = await Model.load(dir, { dtype: 'bfloat16' });
  t.teardown(() => mb.dispose());
  const oursBf16 = await mb.logits([PROMPT]);
  t.ok(new Set(mine).size > 2, `the engine's continuation is not one repeated token (${mine})`);

  for (const dtype of ['f32', 'f16', 'bf16'] as const) {
    const gguf = join(tmp, `tiny.${dtype}.gguf`);
    writeGguf(dir, gguf, { python: python!, dtype });
    const logitsOut = join(tmp, `logits.${dtype}.bin`);
    const r = llamaCppChild<Greedy>({ mode: 'greedy', gguf, threads: 2, prompt: PROMPT, n: 16, logitsOut, flashAttention: false }, 300);
    t.equal(r.vocab, V, `${dtype}: one logit per row of the embedding`);
    const theirs = new Float32Array(readFileSync(logitsOut).buffer.slice(0));
    t.equal(theirs.length, ours.data.length, `${dtype}: logits after all ${PROMPT.length} prompt positions`);
    let maxDiff = 0,
      maxAbs = 0;
    for (let i = 0; i < theirs.length; i++) {
      maxDiff = Math.max(maxDiff, Math.abs(theirs[i] - ours.data[i]));
      maxAbs = Math.max(maxAbs, Math.abs(ours.data[i]));
    }
    if (dtype === 'f32') {
      t.ok(
        maxDiff <= TOL,
        `f32: max |llama.cpp - engine| over ${PROMPT.length} x ${V} logits = ${maxDiff.toExponential(2)} <= ${TOL} (largest logit ${maxAbs.toFixed(2)})`,
      );
      t.same(r.tokens, mine, 'f32: llama.cpp greedy continuation (16 tokens) = the engine greedy continuation');
    } else {
      if (dtype === 'bf16') {
        let d = 0;
        for (let i = 0; i < theirs.length; i++) d = Math.max(d, Math.abs(theirs[i] - oursBf16.data[i]));
        t.ok(
          d <= BF16_TOL * maxAbs,
          `bf16: max |llama.cpp BF16 - engine bfloat16| = ${d.toFixed(4)} <= ${BF16_TOL} x the largest logit ${maxAbs.toFixed(2)} (float32 engine: ${maxDiff.toFixed(4)})`,
        );
      }
      // 16-bit weights: near the float32 logits, not equal (a few hundredths of the largest logit).
      t.ok(
        maxDiff <= 0.05 * maxAbs,
        `${dtype}: max |llama.cpp - engine float32| = ${maxDiff.toFixed(4)} <= 5% of the largest logit ${maxAbs.toFixed(2)}`,
      );
    }
  }
});

t.test('runLlamaCpp measures prefill and batch 1 / 16 decode; the rows carry the numbers', { skip, timeout: 600_000 }, async (t) => {
  const tmp = t.testdir();
  process.env.SLM_TRAIN_CACHE = tmp;
  const dir = join(tmp, 'tiny');
  initModel({ preset: 'tiny', out: dir, seed: 0 });
  const lines: string[] = [];
  const r = runLlamaCpp(dir, { threads: 2, prefill: 32, steps: 4, reps: 1, batches: [1, 16], timeoutS: 300, log: (s) => lines.push(s) });
  if ('skipped' in r) return t.fail(r.skipped);
  t.match(r, { dtype: 'F32', threads: 2, build: 'prebuilt', kv_cache: 'F32', flash_attention: 'auto' });
  t.ok(r.prefill.tokens === 32 && r.prefill.tokens_per_s > 0, `prefill ${r.prefill.tokens_per_s.toFixed(1)} tok/s`);
  t.same(
    r.decode.map((d) => d.batch),
    [1, 16],
  );
  for (const d of r.decode)
    t.ok(d.tokens_per_s > 0 && d.step_ms > 0 && d.steps === 4, `batch ${d.batch}: ${d.tokens_per_s.toFixed(1)} tok/s`);
  t.ok(
    lines.some((l) => l.includes('hf-to-gguf')),
    'the log says where the GGUF comes from',
  );
  const rows = llamaCppRows(r, { prefill: 2 * r.prefill.tokens_per_s, decode: (B) => (B === 1 ? r.decode[0].tokens_per_s : undefined) });
  t.match(rows.join('\n'), /prefill 32 tokens, batch 1 \| [\d.]+ tok\/s/);
  t.match(rows.join('\n'), /slm-train \/ llama\.cpp, prefill 32 tokens \| 2\.00x/);
  t.match(rows.join('\n'), /slm-train \/ llama\.cpp, decode float32 batch 1 \| 1\.00x/);
  t.match(rows.join('\n'), /decode batch 16 \(greedy\) \| [\d.]+ tok\/s/);
});

t.test('missing pieces are named, and a skipped peer is one row saying why', async (t) => {
  t.match(llamaCppMissing(undefined), /no python with the gguf package/);
  t.same(llamaCppRows({ skipped: 'because' }, { prefill: 1, decode: () => 1 }), [
    '| llama.cpp (node-llama-cpp prebuilt) | skipped: because | | |',
  ]);
});
