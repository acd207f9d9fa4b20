// PPO's clipped value loss and the entropy bonus, checked against values computed here by hand from
// the model's own predictions (values(), logits()): the loss the native step reports, and the
// gradient it leaves (the value-head bias; a finite difference of the hand-computed entropy).
import t from 'tap';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Model } from '../lib/engine/model.js';
import { initModel } from '../lib/model/init.js';

const dir = mkdtempSync(join(tmpdir(), 'slm-ppo-terms-'));
t.teardown(() => rmSync(dir, { recursive: true, force: true }));
initModel({ preset: 'tiny', out: dir, seed: 21 });
const lora = { r: 4, alpha: 8, dropout: 0, rslora: false, targets: ['q_proj', 'v_proj', 'o_proj'] };
const ids = [5, 17, 42, 9, 88, 3, 61, 27, 14];
const mask: number[] = ids.map((_, i) => (i >= 2 ? 1 : 0)); // 7 trained tokens
const n = mask.reduce((a, b) => a + b, 0);
const close = (a: number, b: number, rel: number) => Math.abs(a - b) <= rel * Math.max(Math.abs(a), Math.abs(b), 1e-12);

t.test('clipped value loss: 0.5 max((V - R)^2, (clip(V, V_old +- c) - R)^2), token mean, and its gradient', async (t) => {
  const model = await Model.load(dir);
  t.teardown(() => model.dispose());
  model.attachLora(lora as never, 1);
  model.attachValueHead(2);
  const [v] = await model.values([ids]);
  const c = 0.2;
  // Old values: far below (clip active), far above (clip active), near (inside the clip range).
  const offsets = [0, 0, -0.5, 0.6, 0.05, -0.1, -0.4, 0.3, 0.02];
  // Returns on either side so that each branch of the max wins somewhere.
  const rOff = [0, 0, 1.0, 0.2, -0.3, 0.5, -1.0, -0.2, 0.4];
  const oldV = ids.map((_, i) => v[i] + offsets[i]);
  const ret = ids.map((_, i) => v[i] + rOff[i]);
  let loss = 0;
  let grad = 0;
  let clippedWins = 0;
  for (let i = 0; i < ids.length; i++) {
    if (!mask[i]) continue;
    const vc = oldV[i] + Math.min(c, Math.max(-c, v[i] - oldV[i]));
    const a = (v[i] - ret[i]) ** 2;
    const b = (vc - ret[i]) ** 2;
    loss += (0.5 * Math.max(a, b)) / n;
    // d/dV: the unclipped branch gives V - R; the clipped one V - R inside the range, 0 outside it
    if (a >= b) grad += (v[i] - ret[i]) / n;
    else {
      clippedWins++;
      if (Math.abs(v[i] - oldV[i]) < c) grad += (vc - ret[i]) / n;
    }
  }
  t.ok(clippedWins >= 2, `the clipped branch wins on ${clippedWins} tokens`);
  const vf = 0.5;
  const opts = { loss: 'sft' as const, vfCoef: vf, valueClip: c, maxGradNorm: 0, checkpoint: false, update: false };
  const st = await model.trainStepLocal({ sequences: [ids], masks: [mask], returns: [ret], oldValues: [oldV] }, opts);
  t.ok(close(st.valueLoss, loss, 1e-5), `value loss ${st.valueLoss} = hand ${loss}`);
  const gb = model.trainable({ grad: true })['value_head.bias'][0];
  t.ok(close(gb, vf * grad, 1e-4), `value-head bias gradient ${gb} = vf_coef x hand ${vf * grad}`);
  // Without clipping the same batch gives the plain squared error: the clip changed the loss.
  let plain = 0;
  for (let i = 0; i < ids.length; i++) if (mask[i]) plain += (0.5 * (v[i] - ret[i]) ** 2) / n;
  const open = await model.trainStepLocal(
    { sequences: [ids], masks: [mask], returns: [ret], oldValues: [oldV] },
    { ...opts, valueClip: Infinity },
  );
  t.ok(close(open.valueLoss, plain, 1e-5), `valueClip Infinity: ${open.valueLoss} = plain ${plain}`);
  t.ok(loss - plain > 1e-3, `clipping raised the loss (${plain} -> ${loss})`);
});

t.test('entropy bonus: loss = -coef x token-mean entropy, and its gradient matches a finite difference of the entropy', async (t) => {
  const model = await Model.load(dir);
  t.teardown(() => model.dispose());
  model.attachLora(lora as never, 3);
  // lora_B away from 0 so the adapter's parameters have a first-order effect
  for (const [k, w] of Object.entries(model.trainable()))
    if (k.includes('lora_B'))
      model.setTrainable(
        k,
        Float32Array.from(w, (_, i) => 0.05 * Math.sin(i * 0.37 + k.length)),
      );
  const T = 0.8;
  // Token-mean entropy of softmax(logits / T) at the positions that predict the trained tokens.
  const entropy = async (): Promise<number> => {
    const { data, vocab } = await model.logits([ids]);
    let h = 0;
    for (let i = 1; i < ids.length; i++) {
      if (!mask[i]) continue;
      const row = data.subarray((i - 1) * vocab, i * vocab);
      let m = -Infinity;
      for (const x of row) m = Math.max(m, x / T);
      let z = 0;
      for (const x of row) z += Math.exp(x / T - m);
      let e = 0;
      for (const x of row) {
        const lp = x / T - m - Math.log(z);
        e -= Math.exp(lp) * lp;
      }
      h += e / n;
    }
    return h;
  };
  const H = await entropy();
  const [lp] = await model.sequenceLogprobs([ids], T);
  const coef = 0.3;
  const batch = { sequences: [ids], masks: [mask], advantages: [ids.map(() => 0)], oldLogprobs: [Array.from(lp)], temperature: [T] };
  const opts = {
    loss: 'pg' as const,
    clipLow: 0.2,
    entropyCoef: coef,
    klCoef: 0,
    tokenLevel: true,
    maxGradNorm: 0,
    checkpoint: false,
    update: false,
  };
  const st = await model.trainStepLocal(batch, opts);
  t.ok(close(st.entropy, H, 1e-4), `reported entropy ${st.entropy} = hand ${H}`);
  t.ok(close(st.loss, -coef * H, 1e-4), `loss ${st.loss} = -coef x entropy ${-coef * H} (advantages 0: no policy-gradient part)`);
  // The gradient: its directional derivative along itself, |g|^2, against a central difference of
  // -coef x H(theta +- eps g).
  const g = model.trainable({ grad: true });
  const theta = model.trainable();
  let g2 = 0;
  for (const k of Object.keys(g)) for (const x of g[k]) g2 += x * x;
  t.ok(g2 > 0, 'the bonus has a gradient');
  const eps = 1e-2 / Math.sqrt(g2);
  const shift = (s: number) => {
    for (const k of Object.keys(g))
      model.setTrainable(
        k,
        Float32Array.from(theta[k], (x, i) => x + s * eps * g[k][i]),
      );
  };
  shift(1);
  const hPlus = await entropy();
  shift(-1);
  const hMinus = await entropy();
  shift(0);
  const fd = (-coef * (hPlus - hMinus)) / (2 * eps);
  t.ok(close(fd, g2, 0.05), `finite difference ${fd} = |g|^2 ${g2} (within 5 %)`);
  // And without the bonus the same batch has no gradient at all (advantages 0, ratio 1).
  const zero = await model.trainStepLocal(batch, { ...opts, entropyCoef: 0 });
  t.ok(Math.abs(zero.loss) < 1e-7, `entropyCoef 0: loss ${zero.loss}`);
  const g0 = model.trainable({ grad: true });
  t.ok(
    Object.values(g0).every((a) => a.every((x) => Math.abs(x) < 1e-9)),
    'entropyCoef 0: no gradient',
  );
});
