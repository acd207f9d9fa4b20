// The training losses of native/core/losses.h (what every train step computes), checked one by one
// against values and gradients computed here by hand in plain JS (float64): loss weights under each
// normalisation, SFT, the clipped policy surrogate on both sides of both clip bounds, the k1/k3 KL
// estimators, the entropy bonus, the clipped value loss. Then the native request's required numbers
// (no native defaults) and the optimizer defaults that remain, asserted equal to the schema's.
import t from 'tap';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { native } from '../lib/engine/runtime.js';
import { Model } from '../lib/engine/model.js';
import { initModel } from '../lib/model/init.js';
import { CONFIG_SCHEMA } from '../lib/config/schema.js';
import { cpuLevels } from './helpers/isa.js';

const L = () => native().losses;
const f32 = (xs: number[]) => Float32Array.from(xs);
const close = (a: number, b: number, tol = 1e-5) => Math.abs(a - b) <= tol * Math.max(1, Math.abs(a), Math.abs(b));
type Checks = { ok(c: boolean, m: string): unknown; equal(a: unknown, b: unknown, m: string): unknown };
const allClose = (t: Checks, got: ArrayLike<number>, want: number[], what: string, tol = 1e-5) => {
  t.equal(got.length, want.length, `${what}: length`);
  want.forEach((w, i) => t.ok(close(got[i], w, tol), `${what}[${i}]: ${got[i]} vs ${w}`));
};

t.test('loss weights: token and sequence normalisation, entry 0 never trained, global-batch counts', async (t) => {
  // Rows of 5, 3 and 4 tokens; mask[0][0] = 1 must be ignored (token 0 is never a target).
  const rows = [
    [1, 1, 1, 0, 1],
    [0, 0, 1],
    [0, 0, 0, 0],
  ];
  const mask = Uint8Array.from(rows.flat());
  const lengths = Int32Array.from(rows.map((r) => r.length));
  const trained = rows.map((r) => r.slice(1).reduce((a, b) => a + b, 0)); // [3, 1, 0]
  const tokens = trained.reduce((a, b) => a + b, 0); // 4
  const sequences = trained.filter((n) => n > 0).length; // 2
  const hand = (w: (i: number) => number) => rows.flatMap((r, i) => r.map((m, t) => (t > 0 && m ? w(i) : 0)));

  const tok = L().weights({ mask, lengths, norm: 'token' });
  allClose(
    t,
    tok,
    hand(() => 1 / tokens),
    'token',
  );
  t.ok(
    close(
      tok.reduce((a, b) => a + b, 0),
      1,
    ),
    'token weights sum to 1',
  );

  const seq = L().weights({ mask, lengths, norm: 'sequence' });
  allClose(
    t,
    seq,
    hand((i) => 1 / (sequences * trained[i])),
    'sequence',
  );
  t.ok(
    close(
      seq.reduce((a, b) => a + b, 0),
      1,
    ),
    'sequence weights sum to 1',
  );
  t.not(seq[1], seq[6], 'a row with fewer trained tokens weighs each of them more (sequence)');

  // Data-parallel: the denominators are the global batch's counts.
  allClose(
    t,
    L().weights({ mask, lengths, norm: 'token', tokens: 10 }),
    hand(() => 1 / 10),
    'token, global 10 tokens',
  );
  allClose(
    t,
    L().weights({ mask, lengths, norm: 'sequence', sequences: 5 }),
    hand((i) => 1 / (5 * trained[i])),
    'sequence, global 5 sequences',
  );
});

t.test('sft: -sum(w lp), gradient -w', async (t) => {
  const lp = [-0.5, -1.2, -2.0, -7];
  const w = [0.25, 0.25, 0.5, 0];
  const r = L().sft({ logprobs: f32(lp), weights: f32(w) });
  t.ok(close(r.loss, -(0.25 * -0.5 + 0.25 * -1.2 + 0.5 * -2.0)), `loss ${r.loss}`);
  allClose(
    t,
    r.grad,
    w.map((x) => -x),
    'grad',
  );
});

t.test('policy: the clipped surrogate on both sides of both bounds, masks, clip fraction and ratio', async (t) => {
  const clipLow = 0.2;
  const clipHigh = 0.28;
  // log-ratio, advantage, weight per token
  const cases: Array<[number, number, number, string]> = [
    [0.1, 1, 0.1, 'A > 0, r inside'],
    [0.5, 1, 0.1, 'A > 0, r above 1 + clipHigh: clipped'],
    [Math.log(1 + clipHigh) - 0.01, 2, 0.1, 'A > 0, r just below 1 + clipHigh'],
    [Math.log(1 + clipHigh) + 0.01, 2, 0.1, 'A > 0, r just above 1 + clipHigh: clipped'],
    [-0.5, 1, 0.1, 'A > 0, r below 1 - clipLow: unclipped (pessimistic min)'],
    [-0.5, -1, 0.1, 'A < 0, r below 1 - clipLow: clipped'],
    [Math.log(1 - clipLow) + 0.01, -1.5, 0.1, 'A < 0, r just above 1 - clipLow'],
    [Math.log(1 - clipLow) - 0.01, -1.5, 0.1, 'A < 0, r just below 1 - clipLow: clipped'],
    [0.5, -1, 0.2, 'A < 0, r above 1 + clipHigh: unclipped (pessimistic min)'],
    [3, 5, 0, 'masked (w = 0): nothing'],
  ];
  const old = cases.map((_, i) => -1 - 0.1 * i);
  const lp = cases.map(([d], i) => old[i] + d);
  const adv = cases.map((c) => c[1]);
  const w = cases.map((c) => c[2]);
  const r = L().policy({ logprobs: f32(lp), oldLogprobs: f32(old), advantages: f32(adv), weights: f32(w), clipLow, clipHigh });
  let loss = 0;
  let clipped = 0;
  let ratio = 0;
  const grad: number[] = [];
  cases.forEach(([d, a, wt]) => {
    const rt = Math.exp(d);
    const unclipped = rt * a;
    const cl = Math.min(Math.max(rt, 1 - clipLow), 1 + clipHigh) * a;
    loss += -Math.min(unclipped, cl) * wt;
    clipped += cl < unclipped ? wt : 0;
    ratio += rt * wt;
    grad.push(cl < unclipped ? 0 : -wt * a * rt); // the clipped branch is constant in lp
  });
  t.ok(close(r.loss, loss), `loss ${r.loss} vs ${loss}`);
  t.ok(close(r.clipped, clipped), `clipped ${r.clipped} vs ${clipped}`);
  t.ok(close(r.ratio, ratio), `ratio ${r.ratio} vs ${ratio}`);
  allClose(t, r.grad, grad, 'grad', 1e-4);
  cases.forEach(([, , , what], i) => {
    if (what.endsWith(': clipped')) t.equal(r.grad[i], 0, `${what}: no gradient`);
  });
  t.ok(close(clipped, 0.4), 'four tokens clipped (hand count)');
});

t.test('kl: k1 = lp - ref, k3 = exp(d) - d - 1 (d = ref - lp), and their gradients', async (t) => {
  const lp = [-1, -2, -0.5];
  const ref = [-1.5, -1, -0.5];
  const w = [0.5, 0.25, 0.25];
  const k1 = L().kl({ logprobs: f32(lp), refLogprobs: f32(ref), weights: f32(w), estimator: 1 });
  t.ok(close(k1.loss, 0.5 * 0.5 + 0.25 * -1 + 0), `k1 ${k1.loss}`);
  allClose(t, k1.grad, w, 'k1 grad');
  const k3 = L().kl({ logprobs: f32(lp), refLogprobs: f32(ref), weights: f32(w), estimator: 3 });
  const d = lp.map((x, i) => ref[i] - x);
  t.ok(
    close(
      k3.loss,
      d.reduce((a, di, i) => a + w[i] * (Math.exp(di) - di - 1), 0),
    ),
    `k3 ${k3.loss}`,
  );
  t.ok(k3.loss > 0, 'k3 is non-negative');
  allClose(
    t,
    k3.grad,
    d.map((di, i) => w[i] * (1 - Math.exp(di))),
    'k3 grad',
  );
  t.throws(() => L().kl({ logprobs: f32(lp), refLogprobs: f32(ref), weights: f32(w), estimator: 2 as never }), {
    code: 'ARGUMENT_INVALID',
  });
});

t.test(
  "k3 in the loss is clamped as verl's kl_penalty('low_var_kl'): d to [-20, 20], the estimate to [-10, 10], no gradient where clamped",
  async (t) => {
    // d = ref - lp: 0.3 inside, 5 (exp(5) - 6 = 142 > 10), -15 (14 + e^-15 > 10), 120 (exp overflows float32 without the clamp of d).
    const d = [0.3, 5, -15, 120];
    const lp = d.map(() => -2);
    const ref = d.map((di) => -2 + di);
    const w = [0.25, 0.25, 0.25, 0.25];
    const k3 = L().kl({ logprobs: f32(lp), refLogprobs: f32(ref), weights: f32(w), estimator: 3 });
    const verl = (x: number) => {
      const c = Math.min(20, Math.max(-20, x));
      return Math.min(10, Math.max(-10, Math.exp(c) - c - 1));
    };
    t.ok(
      close(
        k3.loss,
        d.reduce((a, di, i) => a + w[i] * verl(di), 0),
      ),
      `k3 ${k3.loss}`,
    );
    t.ok(close(k3.loss, 0.25 * (Math.exp(0.3) - 1.3) + 0.75 * 10), 'three tokens at the clamp of 10');
    t.ok(k3.grad.every(Number.isFinite), 'every gradient finite (no inf * 0)');
    allClose(t, k3.grad, [0.25 * (1 - Math.exp(0.3)), 0, 0, 0], 'gradient only on the unclamped token');
  },
);

t.test('entropy: log_softmax(logits / T), the bonus sum(w sum p log p), its gradient', async (t) => {
  const V = 3;
  const logits = [1, 2, 3.5, 0, 0, 0];
  const w = [0.75, 0.25];
  const T = 2;
  const bonusOf = (x: number[]) => {
    let s = 0;
    for (let i = 0; i < 2; i++) {
      const z = x.slice(i * V, (i + 1) * V).map((v) => v / T);
      const m = Math.max(...z);
      const lse = m + Math.log(z.reduce((a, v) => a + Math.exp(v - m), 0));
      s += w[i] * z.reduce((a, v) => a + Math.exp(v - lse) * (v - lse), 0);
    }
    return s;
  };
  const r = L().entropy({ logits: f32(logits), vocab: V, weights: f32(w), temperature: T });
  t.ok(close(r.loss, bonusOf(logits)), `bonus ${r.loss}`);
  t.ok(close(r.entropy, -bonusOf(logits)), 'entropy = minus the bonus');
  t.ok(close(r.logprobs[3], -Math.log(3)), 'uniform row: log(1/3)');
  const h = 1e-4;
  const fd = logits.map((_, k) => {
    const up = logits.slice();
    const dn = logits.slice();
    up[k] += h;
    dn[k] -= h;
    return (bonusOf(up) - bonusOf(dn)) / (2 * h);
  });
  allClose(t, r.grad, fd, 'grad vs central differences', 1e-3);
});

t.test("tokenStats (the train step's fused head): target log-probs, entropies and their gradient, against float64 by hand", async (t) => {
  const V = 37,
    n = 5,
    T = 0.7;
  const logits = Array.from({ length: n * V }, (_, i) => 4 * Math.sin(i * 1.7) + (i % V === 3 ? 9 : 0)); // row peaks at id 3
  logits.fill(-2, 2 * V, 3 * V); // a uniform row
  const targets = [3, 0, 11, 36, 3];
  const gl = [0.5, -1, 0.25, 2, 0],
    ge = [-0.3, 0.7, 1.1, 0, -2];
  // objective(x) = sum gl lp + sum ge H, all in float64
  const stats = (x: number[]) =>
    targets.map((tg, i) => {
      const z = x.slice(i * V, (i + 1) * V).map((v) => v / T);
      const m = Math.max(...z);
      const lse = m + Math.log(z.reduce((a, v) => a + Math.exp(v - m), 0));
      return { lp: z[tg] - lse, h: -z.reduce((a, v) => a + Math.exp(v - lse) * (v - lse), 0) };
    });
  const objective = (x: number[]) => stats(x).reduce((a, s, i) => a + gl[i] * s.lp + ge[i] * s.h, 0);
  const want = stats(logits);
  // The CPU kernel at every level the machine has (AVX-512, AVX2: V = 37 leaves a tail at both), then
  // ATen's operations (level none, and every other device).
  const before = native().version().cpuIsa; // the level in force (SLM_TRAIN_CPU_ISA may cap it), restored after
  t.teardown(() => void native().setCpuIsa(before));
  for (const level of cpuLevels(native(), true)) {
    t.equal(native().setCpuIsa(level), level, `the kernels run at ${level}`);
    const r = L().tokenStats({
      logits: f32(logits),
      vocab: V,
      targets: Int32Array.from(targets),
      temperature: T,
      gradLogprobs: f32(gl),
      gradEntropy: f32(ge),
    });
    const rows = level === 'none' ? 0 : n;
    t.same(r.kernelRows, { stats: rows, grad: rows }, `${level}: ${rows ? 'the kernel ran both ways' : "ATen's operations ran"}`);
    allClose(
      t,
      r.logprobs,
      want.map((s) => s.lp),
      'log-probs',
      2e-6,
    );
    allClose(
      t,
      r.entropy,
      want.map((s) => s.h),
      'entropies',
      2e-6,
    );
    t.ok(close(r.entropy[2], Math.log(V), 2e-6) && close(r.logprobs[2], -Math.log(V), 2e-6), 'the uniform row: H = log V, lp = -log V');
    const h = 1e-4;
    const fd = logits.map((_, k) => {
      const up = logits.slice(),
        dn = logits.slice();
      up[k] += h;
      dn[k] -= h;
      return (objective(up) - objective(dn)) / (2 * h);
    });
    let worst = 0;
    fd.forEach((w, k) => (worst = Math.max(worst, Math.abs(r.grad[k] - w))));
    t.ok(worst < 1e-5, `gradient vs central differences of the float64 objective: worst ${worst.toExponential(2)}`);
    // Log-probs only (an SFT or policy-gradient loss without the entropy bonus): the entropy's part drops out.
    const lpOnly = L().tokenStats({
      logits: f32(logits),
      vocab: V,
      targets: Int32Array.from(targets),
      temperature: T,
      gradLogprobs: f32(gl),
    });
    const fdLp = logits.map((_, k) => {
      const up = logits.slice(),
        dn = logits.slice();
      up[k] += h;
      dn[k] -= h;
      return stats(up).reduce((a, s, i) => a + gl[i] * s.lp, 0) / (2 * h) - stats(dn).reduce((a, s, i) => a + gl[i] * s.lp, 0) / (2 * h);
    });
    worst = 0;
    fdLp.forEach((w, k) => (worst = Math.max(worst, Math.abs(lpOnly.grad[k] - w))));
    t.ok(worst < 1e-5, `log-probs only: worst ${worst.toExponential(2)}`);
    // The same as the unfused entropy entry (log_softmax): its bonus gradient is -d(sum w H)/d logits.
    const w = [0.1, 0.2, 0.3, 0.15, 0.25];
    const unfused = L().entropy({ logits: f32(logits), vocab: V, weights: f32(w), temperature: T });
    const fused = L().tokenStats({
      logits: f32(logits),
      vocab: V,
      targets: Int32Array.from(targets),
      temperature: T,
      gradEntropy: f32(w.map((x) => -x)),
    });
    worst = 0;
    fused.grad.forEach((g, k) => (worst = Math.max(worst, Math.abs(g - unfused.grad[k]))));
    t.ok(worst < 1e-6, `entropy-bonus gradient equals the log_softmax path's: worst ${worst.toExponential(2)}`);
  }
  t.throws(() => L().tokenStats({ logits: f32(logits), vocab: V, targets: Int32Array.from([3, 0, 11, 37, 3]), temperature: T }), {
    code: 'ARGUMENT_INVALID',
    message: /target id 37 is outside the vocabulary/,
  });
  t.throws(() => L().tokenStats({ logits: f32(logits), vocab: V, targets: Int32Array.from([3]), temperature: T }), {
    code: 'ARGUMENT_INVALID',
    message: /one id per position \(5\)/,
  });
});

t.test('value: 0.5 max((v - R)^2, (clipped v - R)^2), gradient only through the branch that wins', async (t) => {
  const c = 0.2;
  // v, old, R, w
  const cases: Array<[number, number, number, number, string]> = [
    [1.0, 0.5, 0.0, 0.25, 'outside the clip range, the unclipped error is larger'],
    [1.0, 0.5, 2.0, 0.25, 'outside the clip range, the clipped error is larger: no gradient'],
    [0.45, 0.5, -1.0, 0.25, 'inside the clip range'],
    [-0.5, 0.5, 1.0, 0.25, 'below the clip range, the unclipped error is larger'],
    [9, 0, 0, 0, 'masked'],
  ];
  const r = L().value({
    values: f32(cases.map((x) => x[0])),
    oldValues: f32(cases.map((x) => x[1])),
    returns: f32(cases.map((x) => x[2])),
    weights: f32(cases.map((x) => x[3])),
    valueClip: c,
  });
  let loss = 0;
  const grad: number[] = [];
  for (const [v, old, R, w] of cases) {
    const vc = old + Math.min(Math.max(v - old, -c), c);
    const a = (v - R) ** 2;
    const b = (vc - R) ** 2;
    loss += w * 0.5 * Math.max(a, b);
    const inside = Math.abs(v - old) < c;
    grad.push(b > a && !inside ? 0 : w * (v - R));
  }
  t.ok(close(r.loss, loss), `loss ${r.loss} vs ${loss}`);
  allClose(t, r.grad, grad, 'grad');
  t.equal(r.grad[1], 0, 'the clipped branch wins: no gradient');
});

t.test('train step requests: no native defaults for clipLow / valueClip / klEstimator; optimizer defaults equal the schema', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'slm-losses-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  initModel({ preset: 'tiny', out: dir, seed: 3 });
  const ids = [5, 17, 42, 9, 88, 3, 61];
  const mask = ids.map((_, i) => (i >= 2 ? 1 : 0));
  const zeros = ids.map(() => 0);
  const load = async () => {
    const m = await Model.load(dir);
    m.attachLora({ r: 2, alpha: 4, dropout: 0, rslora: false, targets: ['q_proj', 'v_proj'] }, 1);
    m.attachValueHead(2);
    for (const [name, v] of Object.entries(m.trainable()))
      if (name.endsWith('lora_B.weight'))
        m.setTrainable(
          name,
          v.map((_, i) => 0.05 * Math.cos(i)),
        );
    return m;
  };
  const m = await load();
  t.teardown(() => m.dispose());
  const pg = { sequences: [ids], masks: [mask], advantages: [ids.map(() => 1)], oldLogprobs: [zeros] };
  await t.rejects(m.trainStep(pg, { loss: 'pg', lr: 0, update: false }), { code: 'ARGUMENT_INVALID', message: /clipLow/ });
  await t.rejects(
    m.trainStep({ ...pg, returns: [zeros], oldValues: [zeros] }, { loss: 'pg', clipLow: 0.2, vfCoef: 0.5, lr: 0, update: false }),
    { code: 'ARGUMENT_INVALID', message: /valueClip/ },
  );
  // The native side rejects a missing estimator (lib/engine/model.ts always sends one).
  const raw = (m as unknown as { handle: { optimizer: { trainStep(r: unknown): Promise<unknown> } } }).handle.optimizer;
  t.throws(
    () =>
      raw.trainStep({
        ids: Int32Array.from(ids),
        lengths: Int32Array.of(ids.length),
        mask: Uint8Array.from(mask),
        advantages: f32(ids.map(() => 1)),
        oldLogprobs: f32(zeros),
        loss: 'pg',
        clipLow: 0.2,
        klCoef: 0.1,
        update: false,
      }),
    { code: 'ARGUMENT_INVALID', message: /klEstimator/ },
  );
  await t.rejects(m.trainStep(pg, { loss: 'pg', clipLow: 0.2, lr: 0, update: false, seed: 'x' as never }), {
    code: 'ARGUMENT_INVALID',
    message: /seed/,
  });
  // The adapter's numbers have no native defaults either (lib/engine/adapter.ts LoraSpec carries them).
  const rawLora = (m as unknown as { handle: { adapters: { attach(r: unknown): void } } }).handle.adapters;
  t.throws(() => rawLora.attach({ r: 2, dropout: 0, targets: ['q_proj'] }), { code: 'ARGUMENT_INVALID', message: /alpha/ });
  t.throws(() => rawLora.attach({ alpha: 4, dropout: 0, targets: ['q_proj'] }), { code: 'ARGUMENT_INVALID', message: /'r'/ });
  const ok = await m.trainStep(pg, { loss: 'pg', clipLow: 0.2, lr: 0, update: false });
  t.ok(Number.isFinite(ok.loss), 'with clipLow the step runs');

  // The optimizer numbers still have native defaults (torch's AdamW); they must be the schema's.
  const optim = (CONFIG_SCHEMA as { properties: { optim: { properties: Record<string, { default: unknown }> } } }).properties.optim
    .properties;
  const [beta1, beta2] = optim.betas.default as number[];
  const schema = {
    lr: optim.lr.default as number,
    beta1,
    beta2,
    eps: optim.eps.default as number,
    weightDecay: optim.weight_decay.default as number,
    maxGradNorm: optim.max_grad_norm.default as number,
  };
  const a = await load();
  const b = await load();
  t.teardown(() => (a.dispose(), b.dispose()));
  const sft = { sequences: [ids], masks: [mask] };
  for (let i = 0; i < 3; i++) {
    await a.trainStep(sft, { loss: 'sft', checkpoint: false, ...schema });
    await b.trainStep(sft, { loss: 'sft', checkpoint: false });
  }
  const ta = a.trainable();
  const tb = b.trainable();
  t.ok(
    Object.keys(ta).some((k) => ta[k].some((x, i) => x !== m.trainable()[k][i])),
    'the steps moved the parameters',
  );
  for (const k of Object.keys(ta)) t.same(Array.from(tb[k]), Array.from(ta[k]), `${k}: omitted optimizer numbers = the schema's defaults`);
});
