// The engine benchmark's prefill roofline (bench/engine.ts): causal attention's FLOPs against a count
// of query-key pairs, and each part of a prefill at the larger of its compute and memory time.
import t from 'tap';
import { attentionFlops, prefillRoofline } from '../bench/engine.js';

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
    lim = { f32: 100, copy: 10 }; // GFLOP/s, GB/s
  const r = prefillRoofline(cfg, layerParams, 4, T, lim);
  // Projections: 2e8 FLOPs at 100 GFLOP/s = 2 ms, weights 4 MB at 10 GB/s = 0.4 ms -> compute bound.
  t.ok(Math.abs(r.parts.projections - 2e-3) < 1e-12, `projections ${r.parts.projections}`);
  // Head, one row: 64,000 FLOPs = 0.64 µs, weights 128 kB at 10 GB/s = 12.8 µs -> memory bound.
  t.ok(Math.abs(r.parts.head - 12.8e-6) < 1e-12, `head ${r.parts.head}`);
  t.ok(Math.abs(r.parts.attention - attentionFlops(cfg, T) / 100e9) < 1e-15, 'attention at the matmul rate');
  t.equal(r.seconds, r.parts.projections + r.parts.attention + r.parts.head);
  // Slower memory makes the projections memory bound too.
  const slow = prefillRoofline(cfg, layerParams, 4, T, { f32: 100, copy: 1 });
  t.ok(Math.abs(slow.parts.projections - 4e-3) < 1e-12, `projections at 1 GB/s: ${slow.parts.projections}`);
});
