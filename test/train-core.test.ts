// The LoRA training step against hand computations: finite differences, checkpointing on/off,
// frozen base, loss masks, SFT convergence, clipped surrogate and KL estimators, NaN handling,
// exact optimizer restore, value head, learning-rate schedules.
import t from 'tap';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Model, type TrainBatch } from '../lib/engine/model.js';
import { learningRate } from '../lib/train/schedule.js';
import { initModel } from '../lib/model/init.js';
import { fixture } from './helpers/shared.js';

const base = fixture('qwen3', 'tiny-qwen3-f32');
const seq = [204, 125, 373, 399, 458, 17, 300, 457, 205, 161, 125, 489, 119, 182];
const mask: number[] = seq.map((_, i) => (i >= 5 ? 1 : 0)); // a prompt of 5 tokens, then trained tokens
const ALL = ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'] as const;

async function withLora(seed = 1, targets: readonly string[] = ALL, r = 2): Promise<Model> {
  const m = await Model.load(base);
  m.attachLora({ r, alpha: 2 * r, dropout: 0, rslora: false, targets: [...targets] as never }, seed);
  // Non-zero B so that every LoRA tensor has a gradient.
  for (const [name, v] of Object.entries(m.trainable()))
    if (name.endsWith('lora_B.weight'))
      m.setTrainable(
        name,
        v.map((_, i) => 0.05 * Math.cos(i * 1.7 + name.length)),
      );
  return m;
}

const sft = (m: Model, batch: TrainBatch, extra: Record<string, unknown> = {}) =>
  m.trainStep(batch, { loss: 'sft', lr: 0, maxGradNorm: 0, update: false, checkpoint: false, ...extra });

t.test('LoRA gradients match central finite differences', async (t) => {
  const m = await withLora();
  t.teardown(() => m.dispose());
  const batch = { sequences: [seq], masks: [mask] };
  await sft(m, batch);
  const grads = m.trainable({ grad: true });
  const params = m.trainable();
  const names = [
    'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight',
    'base_model.model.model.layers.1.mlp.down_proj.lora_B.weight',
    'base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight',
  ];
  const eps = 1e-2;
  for (const name of names) {
    const g = grads[name];
    // the three largest-gradient entries of this tensor
    const idx = Array.from(g.keys())
      .sort((a, b) => Math.abs(g[b]) - Math.abs(g[a]))
      .slice(0, 3);
    for (const i of idx) {
      const p = params[name].slice();
      p[i] += eps;
      m.setTrainable(name, p);
      const up = (await sft(m, batch)).loss;
      p[i] -= 2 * eps;
      m.setTrainable(name, p);
      const down = (await sft(m, batch)).loss;
      p[i] += eps;
      m.setTrainable(name, p);
      const fd = (up - down) / (2 * eps);
      t.ok(
        Math.abs(fd - g[i]) <= 2e-2 * Math.abs(g[i]) + 1e-5,
        `${name.split('.').slice(3).join('.')}[${i}]: analytic ${g[i].toExponential(4)} vs finite difference ${fd.toExponential(4)}`,
      );
    }
  }
});

t.test('a bfloat16 model trains through the same fused head: loss and gradients close to float32', async (t) => {
  const grads = async (dtype: 'float32' | 'bfloat16') => {
    const m = await Model.load(base, { dtype });
    t.teardown(() => m.dispose());
    m.attachLora({ r: 2, alpha: 4, dropout: 0, rslora: false, targets: [...ALL] as never }, 1);
    for (const [name, v] of Object.entries(m.trainable()))
      if (name.endsWith('lora_B.weight'))
        m.setTrainable(
          name,
          v.map((_, i) => 0.05 * Math.cos(i * 1.7 + name.length)),
        );
    const st = await sft(m, { sequences: [seq], masks: [mask] });
    return { loss: st.loss, g: Object.values(m.trainable({ grad: true })).flatMap((x) => Array.from(x)) };
  };
  const f = await grads('float32'),
    b = await grads('bfloat16');
  t.ok(Math.abs(b.loss - f.loss) <= 1e-3 * Math.abs(f.loss), `loss ${b.loss} vs float32 ${f.loss}`);
  let dot = 0,
    nf = 0,
    nb = 0;
  f.g.forEach((x, i) => ((dot += x * b.g[i]), (nf += x * x), (nb += b.g[i] * b.g[i])));
  const cos = dot / Math.sqrt(nf * nb);
  t.ok(nb > 0 && cos > 0.999, `gradient cosine ${cos.toFixed(5)} against float32's`);
});

t.test("longer than one chunk of the fused head (Qwen's 151,936 ids): loss, KL and gradient against the teacher-forced path", async (t) => {
  // The head runs 441 positions per chunk at this vocabulary (~256 MB of float32 logits,
  // head_chunk_rows in native/core/losses.h), reusing one logits buffer; 600 tokens take two chunks, in
  // the reference forward (KL), in the trained one and in the teacher-forced log-probs.
  const dir = mkdtempSync(join(tmpdir(), 'slm-chunks-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  initModel({ preset: 'tiny', out: dir, seed: 5 });
  const m = await Model.load(dir);
  t.teardown(() => m.dispose());
  m.attachLora({ r: 2, alpha: 4, dropout: 0, rslora: false, targets: [...ALL] as never }, 2);
  for (const [name, v] of Object.entries(m.trainable()))
    if (name.endsWith('lora_B.weight'))
      m.setTrainable(
        name,
        v.map((_, i) => 0.05 * Math.sin(i * 0.9 + name.length)),
      );
  const ids = Array.from({ length: 600 }, (_, i) => (i * 7919 + 11) % 151000);
  const msk = ids.map((_, i) => (i >= 10 ? 1 : 0));
  const n = msk.reduce((a: number, b) => a + b, 0);
  const [lp] = await m.sequenceLogprobs([ids]);
  const base0 = await Model.load(dir); // the KL reference: the base model, no adapter
  t.teardown(() => base0.dispose());
  const [ref] = await base0.sequenceLogprobs([ids]);
  let want = 0,
    kl = 0;
  for (let i = 0; i < ids.length; i++) if (msk[i]) (want -= lp[i] / n), (kl += (lp[i] - ref[i]) / n);
  const batch = { sequences: [ids], masks: [msk], advantages: [ids.map(() => 0)], oldLogprobs: [Array.from(lp)] };
  const st = await m.trainStep(batch, {
    loss: 'pg',
    clipLow: 0.2,
    clipHigh: 0.2,
    klCoef: 1,
    klEstimator: 'k1',
    tokenLevel: true,
    lr: 0,
    maxGradNorm: 0,
    checkpoint: true,
    update: false,
  });
  t.ok(Math.abs(st.kl - kl) <= 1e-5 * Math.max(1, Math.abs(kl)) && Math.abs(kl) > 1e-4, `KL ${st.kl} = teacher-forced ${kl}`);
  const s2 = await sft(m, { sequences: [ids], masks: [msk] }, { checkpoint: true });
  t.equal(s2.headRows, n, 'every trained position went through the head');
  t.equal(s2.headChunks, 2, `its ${n} rows in two chunks`);
  t.equal(st.headChunks, 2, "the policy step's too");
  t.ok(Math.abs(s2.loss - want) <= 1e-5 * Math.abs(want), `SFT loss ${s2.loss} = teacher-forced ${want}`);
  const g = m.trainable({ grad: true }),
    theta = m.trainable();
  let g2 = 0;
  for (const k of Object.keys(g)) for (const x of g[k]) g2 += x * x;
  const eps = 1e-2 / Math.sqrt(g2);
  const lossAt = async (sgn: number) => {
    for (const k of Object.keys(g))
      m.setTrainable(
        k,
        Float32Array.from(theta[k], (x, i) => x + sgn * eps * g[k][i]),
      );
    return (await sft(m, { sequences: [ids], masks: [msk] })).loss;
  };
  const fd = ((await lossAt(1)) - (await lossAt(-1))) / (2 * eps);
  t.ok(g2 > 0 && Math.abs(fd - g2) <= 0.02 * g2, `finite difference along the gradient ${fd} = |g|^2 ${g2}`);
});

t.test('checkpointing on and off give the same gradients (relative difference <= 1e-5)', async (t) => {
  const m = await withLora();
  t.teardown(() => m.dispose());
  const batch = { sequences: [seq, seq.slice(0, 9)], masks: [mask, mask.slice(0, 9)] };
  const a = await sft(m, batch, { checkpoint: false });
  const ga = m.trainable({ grad: true });
  const b = await sft(m, batch, { checkpoint: true });
  const gb = m.trainable({ grad: true });
  t.equal(a.loss, b.loss);
  let num = 0;
  let den = 0;
  for (const k of Object.keys(ga))
    for (let i = 0; i < ga[k].length; i++) {
      num += (ga[k][i] - gb[k][i]) ** 2;
      den += ga[k][i] ** 2;
    }
  t.ok(den > 0);
  t.ok(Math.sqrt(num / den) <= 1e-5, `relative difference ${Math.sqrt(num / den).toExponential(2)}`);
  // Micro-batching gives the same gradient as the whole batch at once.
  await sft(m, batch, { microBatch: 1 });
  const gc = m.trainable({ grad: true });
  let dn = 0;
  for (const k of Object.keys(ga)) for (let i = 0; i < ga[k].length; i++) dn += (ga[k][i] - gc[k][i]) ** 2;
  t.ok(Math.sqrt(dn / den) < 1e-5, `micro-batches: relative difference ${Math.sqrt(dn / den).toExponential(2)}`);
});

t.test('with LoRA dropout, checkpointing replays the same dropout masks', async (t) => {
  const m = await Model.load(base);
  t.teardown(() => m.dispose());
  m.attachLora({ r: 2, alpha: 4, dropout: 0.3, rslora: false, targets: ['q_proj', 'up_proj'] }, 1);
  for (const [name, v] of Object.entries(m.trainable()))
    if (name.endsWith('lora_B.weight'))
      m.setTrainable(
        name,
        v.map((_, i) => 0.05 * Math.cos(i)),
      );
  const batch = { sequences: [seq], masks: [mask] };
  const run = async (seed: number, checkpoint: boolean) => {
    await sft(m, batch, { checkpoint, seed });
    return m.trainable({ grad: true });
  };
  const a = await run(5, false);
  const b = await run(5, true);
  const c = await run(6, false);
  for (const k of Object.keys(a)) t.same(Array.from(b[k]), Array.from(a[k]), `${k}: same gradient with and without checkpointing`);
  t.ok(
    Object.keys(a).some((k) => a[k].some((x, i) => x !== c[k][i])),
    'another seed draws other masks (dropout is active)',
  );
});

t.test('after one step every trained LoRA tensor changed and every base tensor is bit-identical', async (t) => {
  const m = await withLora();
  t.teardown(() => m.dispose());
  const digest = m.baseDigest();
  const before = m.trainable();
  const s = await m.trainStep({ sequences: [seq], masks: [mask] }, { loss: 'sft', lr: 1e-3 });
  t.equal(s.step, 1);
  t.notOk(s.skipped);
  const after = m.trainable();
  for (const k of Object.keys(before))
    t.ok(
      after[k].some((x, i) => x !== before[k][i]),
      `${k} changed`,
    );
  t.equal(m.baseDigest(), digest, 'base weights bit-identical');
  // A fresh adapter (B = 0): B moves in step 1; A, whose gradient is zero while B = 0, in step 2.
  m.attachLora({ r: 2, alpha: 4, dropout: 0, rslora: false, targets: ['q_proj'] }, 3);
  const p0 = m.trainable();
  await m.trainStep({ sequences: [seq], masks: [mask] }, { loss: 'sft', lr: 1e-3 });
  const p1 = m.trainable();
  await m.trainStep({ sequences: [seq], masks: [mask] }, { loss: 'sft', lr: 1e-3 });
  const p2 = m.trainable();
  const a = 'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight';
  const b = 'base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight';
  t.ok(
    p1[b].some((x, i) => x !== p0[b][i]),
    'B changed in step 1',
  );
  t.ok(
    p2[a].some((x, i) => x !== p1[a][i]),
    'A changed in step 2',
  );
  t.equal(m.baseDigest(), digest);
});

t.test('the loss mask removes tokens from the gradient', async (t) => {
  const m = await withLora();
  t.teardown(() => m.dispose());
  // The last three tokens are masked out: changing them (nothing after them is trained) changes
  // neither the loss nor the gradient.
  const m1 = mask.map((x, i) => (i >= seq.length - 3 ? 0 : x));
  const a = await sft(m, { sequences: [seq], masks: [m1] });
  const ga = m.trainable({ grad: true });
  const seq2 = seq.map((x, i) => (i >= seq.length - 3 ? (x + 101) % 512 : x));
  const b = await sft(m, { sequences: [seq2], masks: [m1] });
  const gb = m.trainable({ grad: true });
  t.equal(a.loss, b.loss);
  t.equal(a.tokens, mask.reduce((s, x) => s + x, 0) - 3);
  for (const k of Object.keys(ga)) t.same(Array.from(ga[k]), Array.from(gb[k]), `${k}: same gradient`);
  // Unmasking them changes the gradient (the test can fail).
  await sft(m, { sequences: [seq2], masks: [mask] });
  const gc = m.trainable({ grad: true });
  t.ok(Object.keys(ga).some((k) => ga[k].some((x, i) => x !== gc[k][i])));
  // A masked token's advantage and old log-prob do not matter either.
  const lp = (await m.sequenceLogprobs([seq]))[0];
  const adv = seq.map(() => 1);
  const pgA = await m.trainStep(
    { sequences: [seq], masks: [m1], advantages: [adv], oldLogprobs: [Array.from(lp)] },
    { loss: 'pg', clipLow: 0.2, lr: 0, maxGradNorm: 0, update: false },
  );
  const gpa = m.trainable({ grad: true });
  const adv2 = adv.map((x, i) => (m1[i] ? x : -50));
  const pgB = await m.trainStep(
    { sequences: [seq], masks: [m1], advantages: [adv2], oldLogprobs: [Array.from(lp, (x, i) => (m1[i] ? x : x - 3))] },
    { loss: 'pg', clipLow: 0.2, lr: 0, maxGradNorm: 0, update: false },
  );
  t.equal(pgA.loss, pgB.loss);
  const gpb = m.trainable({ grad: true });
  for (const k of Object.keys(gpa)) t.same(Array.from(gpa[k]), Array.from(gpb[k]));
});

t.test('the vocabulary head projects the trained positions alone, with each row its own temperature', async (t) => {
  const m = await withLora(3);
  t.teardown(() => m.dispose());
  const ref = await Model.load(base); // the KL reference: the base model
  t.teardown(() => ref.dispose());
  // Rows of different lengths (padding), a prompt, a masked tool output mid-row, a row trained from
  // its second token, and a temperature per row.
  const seqs = [seq, seq.slice(3, 12), seq.slice(1, 8).reverse()];
  const masks = [
    mask.map((x, i) => (i >= 8 && i < 11 ? 0 : x)),
    seqs[1].map((_, i) => (i >= 2 ? 1 : 0)),
    seqs[2].map((_, i) => (i >= 1 ? 1 : 0)),
  ];
  const temperature = [0.7, 1.3, 1];
  const trained = masks.reduce((s, mm) => s + mm.slice(1).reduce((a, b) => a + b, 0), 0);
  const lp = await m.sequenceLogprobs(seqs, temperature);
  const rl = await ref.sequenceLogprobs(seqs, temperature);
  let sftWant = 0,
    klWant = 0;
  seqs.forEach((r, s) => {
    for (let i = 1; i < r.length; i++) if (masks[s][i]) (sftWant -= lp[s][i] / trained), (klWant += (lp[s][i] - rl[s][i]) / trained);
  });
  const st = await sft(m, { sequences: seqs, masks, temperature });
  t.equal(
    st.headRows,
    trained,
    `the head projected the ${trained} trained positions, not all ${seqs.reduce((s, r) => s + r.length - 1, 0)}`,
  );
  t.ok(Math.abs(st.loss - sftWant) <= 1e-6 * Math.abs(sftWant), `SFT loss ${st.loss} = teacher-forced ${sftWant}`);
  // Advantages and old log-probs at untrained positions are NaN: they are never read.
  const adv = seqs.map((r, s) => r.map((_, i) => (masks[s][i] ? 0.5 : NaN)));
  const old = lp.map((row, s) => Array.from(row, (x, i) => (masks[s][i] ? x : NaN)));
  const pg = await m.trainStep(
    { sequences: seqs, masks, temperature, advantages: adv, oldLogprobs: old },
    { loss: 'pg', clipLow: 0.2, klCoef: 1, klEstimator: 'k1', tokenLevel: true, lr: 0, maxGradNorm: 0, update: false },
  );
  t.notOk(pg.skipped, `not skipped (${pg.skipReason})`);
  t.ok(Math.abs(pg.pgLoss + 0.5) <= 1e-6, `surrogate at ratio 1: -mean advantage, found ${pg.pgLoss}`);
  t.ok(Math.abs(pg.kl - klWant) <= 1e-6 && Math.abs(klWant) > 1e-5, `KL ${pg.kl} = teacher-forced ${klWant}`);
  t.equal(pg.headRows, trained);
  // Every position trained: every position projected.
  const all = await sft(m, { sequences: seqs, masks: seqs.map((r) => r.map(() => 1)), temperature });
  t.equal(
    all.headRows,
    seqs.reduce((s, r) => s + r.length - 1, 0),
  );
  // A micro-batch with nothing trained adds nothing: the same loss and gradient as without it.
  const alone = await sft(m, { sequences: [seqs[0]], masks: [masks[0]] });
  const ga = m.trainable({ grad: true });
  const withIdle = await sft(m, { sequences: [seqs[0], seqs[1]], masks: [masks[0], seqs[1].map(() => 0)] }, { microBatch: 1 });
  const gb = m.trainable({ grad: true });
  t.equal(withIdle.headRows, alone.headRows);
  t.equal(withIdle.headChunks, alone.headChunks, 'a micro-batch with nothing trained runs no chunk of the head');
  t.ok(Math.abs(withIdle.loss - alone.loss) <= 1e-7 * Math.abs(alone.loss), `loss ${withIdle.loss} = ${alone.loss}`);
  t.ok(
    Object.keys(ga).every((k) => ga[k].every((x, i) => Math.abs(x - gb[k][i]) <= 1e-6 * (Math.abs(x) + 1e-6))),
    'same gradient',
  );
});

t.test('SFT on one short conversation drives the loss below 0.05', async (t) => {
  // The fixture's embedding (std 0.02, hidden 64) caps its logits near 1.3, so no LoRA can make it
  // confident; a tiny model with a wider embedding can (see initModel's embedStd).
  const dir = join(t.testdir(), 'tiny512');
  initModel({ preset: 'tiny', out: dir, seed: 1, overrides: { vocab_size: 512 }, embedStd: 0.3 });
  const m = await Model.load(dir);
  t.teardown(() => m.dispose());
  m.attachLora({ r: 8, alpha: 16, dropout: 0, rslora: false, targets: [...ALL] }, 5);
  let loss = Infinity;
  let steps = 0;
  for (; steps < 200 && loss >= 0.05; steps++)
    loss = (await m.trainStep({ sequences: [seq], masks: [mask] }, { loss: 'sft', lr: 1e-2, maxGradNorm: 1 })).loss;
  t.ok(loss < 0.05, `loss ${loss.toFixed(4)} after ${steps} steps`);
  // The trained model now greedily continues the prompt with the trained tokens.
  const g = await m.generate({ prompts: [Int32Array.from(seq.slice(0, 5))], maxNewTokens: seq.length - 5, greedy: true });
  t.same(Array.from(g.tokens[0]), seq.slice(5));
});

t.test('clipped surrogate, clip fraction and KL estimators match values computed by hand', async (t) => {
  const m = await withLora(2, ['q_proj', 'v_proj', 'up_proj']);
  t.teardown(() => m.dispose());
  const ref = await Model.load(base); // the reference policy: base without adapter
  t.teardown(() => ref.dispose());
  const seqs = [seq, seq.slice(2, 12)];
  const masks = [mask, seq.slice(2, 12).map((_, i) => (i >= 4 ? 1 : 0))];
  const lp = await m.sequenceLogprobs(seqs);
  const rl = await ref.sequenceLogprobs(seqs);
  // Old log-probs shifted by known amounts so ratios land on both sides of the clip range.
  const deltas = [0.5, -0.5, 0.05, -0.05, 0.3, -0.3];
  const old = lp.map((row, s) => Array.from(row, (x, i) => x - deltas[(i + s) % deltas.length]));
  const adv = seqs.map((r, s) => r.map((_, i) => ((i + s) % 4) - 1.5)); // with deltas' period 6: every sign combination
  for (const tokenLevel of [true, false])
    for (const est of ['k1', 'k3'] as const) {
      const st = await m.trainStep(
        { sequences: seqs, masks, advantages: adv, oldLogprobs: old },
        { loss: 'pg', clipLow: 0.2, clipHigh: 0.28, klCoef: 0.1, klEstimator: est, tokenLevel, lr: 0, maxGradNorm: 0, update: false },
      );
      // By hand.
      const n = masks.map((mm) => mm.slice(1).reduce((a, b) => a + b, 0));
      const total = n.reduce((a, b) => a + b, 0);
      let pg = 0,
        kl = 0,
        clip = 0;
      seqs.forEach((r, s) => {
        for (let i = 1; i < r.length; i++) {
          if (!masks[s][i]) continue;
          const w = tokenLevel ? 1 / total : 1 / (seqs.length * n[s]);
          const ratio = Math.exp(lp[s][i] - old[s][i]);
          const a = adv[s][i];
          const s1 = ratio * a,
            s2 = Math.min(Math.max(ratio, 0.8), 1.28) * a;
          pg += w * -Math.min(s1, s2);
          clip += w * (s2 < s1 ? 1 : 0);
          const d = rl[s][i] - lp[s][i];
          kl += w * (est === 'k1' ? -d : Math.exp(d) - d - 1);
        }
      });
      const tag = `${tokenLevel ? 'token' : 'sequence'}-level, ${est}`;
      t.ok(Math.abs(st.pgLoss - pg) < 1e-5, `${tag}: surrogate ${st.pgLoss.toFixed(6)} vs ${pg.toFixed(6)}`);
      t.ok(Math.abs(st.kl - kl) < 1e-5, `${tag}: KL ${st.kl.toExponential(4)} vs ${kl.toExponential(4)}`);
      t.ok(Math.abs(st.clipFrac - clip) < 1e-6, `${tag}: clip fraction ${st.clipFrac} vs ${clip}`);
      t.ok(Math.abs(st.loss - (pg + 0.1 * kl)) < 1e-5, `${tag}: total loss`);
      t.ok(clip > 0 && clip < 1, 'some but not all tokens clipped');
    }
});

t.test('a NaN loss skips the update and says so', async (t) => {
  const m = await withLora();
  t.teardown(() => m.dispose());
  const before = m.trainable();
  const lp = (await m.sequenceLogprobs([seq]))[0];
  const adv = seq.map((_, i) => (i === 7 ? NaN : 1));
  const st = await m.trainStep(
    { sequences: [seq], masks: [mask], advantages: [adv], oldLogprobs: [Array.from(lp)] },
    { loss: 'pg', clipLow: 0.2, lr: 1e-2 },
  );
  t.ok(st.skipped);
  t.match(st.skipReason, /not finite.*skipped/);
  const after = m.trainable();
  for (const k of Object.keys(before)) t.same(Array.from(after[k]), Array.from(before[k]), `${k} untouched`);
  t.equal(st.step, 0, 'no optimizer step counted');
});

t.test('optimizer state saved and restored reproduces the next step exactly', async (t) => {
  const dir = t.testdir();
  const batch = { sequences: [seq, seq.slice(0, 10)], masks: [mask, mask.slice(0, 10)] };
  const opts = { loss: 'sft' as const, lr: 5e-3, weightDecay: 0.01, maxGradNorm: 0.5 };
  const a = await withLora(4);
  t.teardown(() => a.dispose());
  await a.trainStep(batch, opts);
  await a.trainStep(batch, opts);
  await a.saveAdapter(join(dir, 'ad'));
  await a.saveOptimizer(join(dir, 'optimizer.safetensors'));
  await a.trainStep(batch, opts);
  const expected = a.trainable();
  const b = await Model.load(base, { adapter: join(dir, 'ad') });
  t.teardown(() => b.dispose());
  await b.loadOptimizer(join(dir, 'optimizer.safetensors'));
  const s = await b.trainStep(batch, opts);
  t.equal(s.step, 3);
  const got = b.trainable();
  for (const k of Object.keys(expected)) t.same(Array.from(got[k]), Array.from(expected[k]), `${k} identical`);
  // Without the optimizer state the step differs (the test can fail).
  const c = await Model.load(base, { adapter: join(dir, 'ad') });
  t.teardown(() => c.dispose());
  await c.trainStep(batch, opts);
  const other = c.trainable();
  t.ok(Object.keys(expected).some((k) => other[k].some((x, i) => x !== expected[k][i])));
});

t.test('PPO value head: trains on returns, saved and loaded with the adapter', async (t) => {
  const m = await withLora();
  t.teardown(() => m.dispose());
  m.attachValueHead(3);
  const lp = (await m.sequenceLogprobs([seq]))[0];
  const returns = seq.map((_, i) => (i >= 5 ? 1 : 0));
  const batch = {
    sequences: [seq],
    masks: [mask],
    advantages: [seq.map(() => 0)],
    oldLogprobs: [Array.from(lp)],
    returns: [returns],
    oldValues: [seq.map(() => 0)],
  };
  const first = await m.trainStep(batch, { loss: 'pg', clipLow: 0.2, vfCoef: 1, valueClip: 100, lr: 1e-2, valueLr: 5e-2 });
  let last = first;
  for (let i = 0; i < 40; i++)
    last = await m.trainStep(batch, { loss: 'pg', clipLow: 0.2, vfCoef: 1, valueClip: 100, lr: 1e-2, valueLr: 5e-2 });
  t.ok(last.valueLoss < first.valueLoss * 0.5, `value loss ${first.valueLoss.toFixed(4)} -> ${last.valueLoss.toFixed(4)}`);
  const dir = join(t.testdir(), 'ppo');
  await m.saveAdapter(dir);
  const m2 = await Model.load(base, { adapter: dir });
  t.teardown(() => m2.dispose());
  const a = m.trainable(),
    b = m2.trainable();
  t.same(Array.from(b['value_head.weight']), Array.from(a['value_head.weight']));
  t.same(Array.from(b['value_head.bias']), Array.from(a['value_head.bias']));
});

t.test('learning-rate schedules', async (t) => {
  t.equal(learningRate({ kind: 'constant', lr: 1e-4 }, 50), 1e-4);
  t.equal(learningRate({ kind: 'constant', lr: 1e-4, warmupSteps: 10 }, 4), 5e-5);
  t.equal(learningRate({ kind: 'linear', lr: 1, warmupSteps: 10, totalSteps: 110 }, 60), 0.5);
  t.equal(learningRate({ kind: 'linear', lr: 1, totalSteps: 100 }, 100), 0);
  t.ok(Math.abs(learningRate({ kind: 'cosine', lr: 1, totalSteps: 100 }, 50) - 0.5) < 1e-12);
  t.equal(learningRate({ kind: 'cosine', lr: 1, totalSteps: 100, minRatio: 0.1 }, 100), 0.1);
  t.throws(() => learningRate({ kind: 'cosine', lr: 1 }, 5), { code: 'CONFIG_INVALID' });
});
