// The engine benchmark's rooflines (bench/engine.ts): causal attention's FLOPs against a count of
// query-key pairs, each part of a prefill at the larger of its compute and memory time, a decode step's
// bound at the read bandwidth measured around it, and that bandwidth measurement (the addon's 'read').
import t from 'tap';
import {
  aroundRead,
  attentionFlops,
  type DecodeRow,
  decodeBounds,
  decodeRoundsRow,
  prefillRoofline,
  summarizeDecodeRounds,
} from '../bench/engine.js';
import { native } from '../lib/engine/runtime.js';

const cfg = { num_hidden_layers: 3, num_attention_heads: 4, head_dim: 8, hidden_size: 32, vocab_size: 1000 };

t.test('causal attention FLOPs: QK^T and PV over the pairs a causal mask keeps, every head and layer', async (t) => {
  for (const T of [1, 2, 7, 64]) {
    let pairs = 0;
    for (let q = 0; q < T; q++) for (let k = 0; k <= q; k++) pairs++;
    // Per pair, head and layer: a D-long dot product (QK^T) and a D-long axpy (PV), 2 FLOPs per multiply-add.
    t.equal(attentionFlops(cfg, T), pairs * cfg.num_attention_heads * cfg.num_hidden_layers * 2 * (2 * cfg.head_dim), `T ${T}`);
  }
});

t.test('each part of a prefill at its binding limit', async (t) => {
  const layerParams = 1e6,
    T = 100,
    lim = { f32: 100, read: 10 }; // GFLOP/s, GB/s
  const r = prefillRoofline(cfg, layerParams, 4, T, lim);
  // Projections: 2e8 FLOPs at 100 GFLOP/s = 2 ms, weights 4 MB at 10 GB/s = 0.4 ms -> compute bound.
  t.ok(Math.abs(r.parts.projections - 2e-3) < 1e-12, `projections ${r.parts.projections}`);
  // Head, one row: 64,000 FLOPs = 0.64 µs, weights 128 kB at 10 GB/s = 12.8 µs -> memory bound.
  t.ok(Math.abs(r.parts.head - 12.8e-6) < 1e-12, `head ${r.parts.head}`);
  t.ok(Math.abs(r.parts.attention - attentionFlops(cfg, T) / 100e9) < 1e-15, 'attention at the matmul rate');
  t.equal(r.seconds, r.parts.projections + r.parts.attention + r.parts.head);
  // Slower memory makes the projections memory bound too.
  const slow = prefillRoofline(cfg, layerParams, 4, T, { f32: 100, read: 1 });
  t.ok(Math.abs(slow.parts.projections - 4e-3) < 1e-12, `projections at 1 GB/s: ${slow.parts.projections}`);
});

t.test("a decode step's bound: weights read once at the given bandwidth, or its FLOPs at the matmul rate", async (t) => {
  // 1e8 weights of 2 bytes at 40 GB/s: 5 ms; 2 FLOPs per weight and row at 400 GFLOP/s: 0.5 ms per row.
  const b1 = decodeBounds(1e8, 2, 1, 40, 400);
  t.ok(Math.abs(b1.memBound - 5e-3) < 1e-12 && Math.abs(b1.computeBound - 0.5e-3) < 1e-12, JSON.stringify(b1));
  t.equal(b1.bound, b1.memBound, 'batch 1: memory bound');
  const b16 = decodeBounds(1e8, 2, 16, 40, 400);
  t.ok(Math.abs(b16.bound - 8e-3) < 1e-12, `batch 16: compute bound ${b16.bound}`);
  t.ok(Math.abs(decodeBounds(1e8, 2, 1, 20, 400).memBound - 10e-3) < 1e-12, 'half the bandwidth, twice the time');
});

t.test('the bandwidth around a measurement: the better of the reads before and after it, both kept', async (t) => {
  const order: string[] = [];
  // A measurement returning `value` and fake measures handing out the given values in turn, each call logged.
  const fake = (name: string, xs: number[]) => async () => {
    order.push(name);
    return xs.shift()!;
  };
  const r = await aroundRead(fake('run', [7]), fake('read', [31, 52]));
  t.same(r, { value: 7, readGBps: 52, reads: [31, 52] });
  t.same(order, ['read', 'run', 'read'], 'read just before and just after');
  // With a rate measure: the matmul rate before and after too, the better of the two.
  order.length = 0;
  const w = await aroundRead(fake('run', [8]), fake('read', [35, 60]), fake('rate', [213, 185]));
  t.same(w, { value: 8, readGBps: 60, reads: [35, 60], rateGFLOPs: 213, rates: [213, 185] });
  t.same(order, ['read', 'rate', 'run', 'read', 'rate']);
});

t.test("the addon's read bandwidth: a positive rate, and a kind it does not know named in its error", async (t) => {
  const a = native();
  const gbps = await a.measure({ kind: 'read', n: 8 << 20, seconds: 0.02 });
  t.ok(Number.isFinite(gbps) && gbps > 0.1 && gbps < 10_000, `read ${gbps} GB/s`);
  // Not a whole number of the probe's 256 KiB blocks (four streams each): the rest read one word at a time.
  // The probe sums the words it read and throws NATIVE_ERROR unless that is every word once, so a pass
  // that skips the rest (or reads a word twice) fails here instead of reporting a rate.
  const ragged = await a.measure({ kind: 'read', n: (8 << 20) + 3 * 8 + 5, seconds: 0.02 });
  t.ok(Number.isFinite(ragged) && ragged > 0.1 && ragged < 10_000, `read ${ragged} GB/s over a ragged size`);
  t.throws(() => a.measure({ kind: 'write' as 'read', n: 1 << 20, seconds: 0 }), {
    code: 'ARGUMENT_INVALID',
    message: /'matmul', 'copy' or 'read', found 'write'/,
  });
});

t.test("batch-16 decode rounds: each dtype's median fraction, the rounds where bfloat16 was faster", async (t) => {
  const row = (dtype: DecodeRow['dtype'], step_ms: number, fraction_of_roofline: number): DecodeRow => ({
    dtype,
    batch: 16,
    step_ms,
    tokens_per_s: 16 / (step_ms / 1e3),
    roofline_step_ms: step_ms * fraction_of_roofline,
    memory_bound_step_ms: 0,
    compute_bound_step_ms: 0,
    read_GBps: 15,
    matmul_GFLOPs: 120,
    roofline_tokens_per_s: 0,
    fraction_of_roofline,
    fraction_at_best_rate: fraction_of_roofline,
  });
  // The order within a round flips (bfloat16 first in the second): the summary goes by dtype.
  const d = summarizeDecodeRounds([
    [row('float32', 40, 0.5), row('bfloat16', 38, 0.8)],
    [row('bfloat16', 45, 0.55), row('float32', 44, 0.7)],
    [row('float32', 42, 0.6), row('bfloat16', 41, 0.65)],
  ]);
  t.same(d.median_fraction, { float32: 0.6, bfloat16: 0.65 });
  t.equal(d.bfloat16_faster, 2, 'rounds 1 and 3');
  t.equal(d.batch, 16);
  t.same(d.rounds[1], [
    { dtype: 'bfloat16', step_ms: 45, fraction_of_roofline: 0.55, read_GBps: 15, matmul_GFLOPs: 120 },
    { dtype: 'float32', step_ms: 44, fraction_of_roofline: 0.7, read_GBps: 15, matmul_GFLOPs: 120 },
  ]);
  t.equal(
    decodeRoundsRow(d),
    '| decode batch 16, 3 alternated rounds (fraction of the roofline at the read and matmul rate around each decode) | float32 0.5, 0.7, 0.6 (median 0.6); bfloat16 0.8, 0.55, 0.65 (median 0.65); bfloat16 faster in 2 of 3 | | |',
  );
  t.throws(() => summarizeDecodeRounds([[row('float32', 40, 0.5)]]), /without its bfloat16 decode/);
  t.throws(() => summarizeDecodeRounds([]), /no rounds/);
});
