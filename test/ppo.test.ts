// PPO end to end at tiny scale on a toy two-turn task: the model writes 3 tokens, the "environment"
// appends 3 tokens (loss mask 0, like a tool output or retrieved passages), the model writes 3 more.
// Reward = the share of generated tokens that are "good" (ids 0-7: 1/8 of the vocabulary at random).
// Checked: the mean reward rises; a resumed run ends exactly where the uninterrupted one does (adapter,
// value head, metrics); environment tokens carry nothing into the update; the values, returns and
// advantages a step trains on are the hand-computed ones.
import t from 'tap';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { valuesFromTrainingPath } from './helpers/values-reference.js';
import { Model, type TrainBatch, type TrainOptions } from '../lib/engine/model.js';
import type { LoraSpec } from '../lib/engine/adapter.js';
import { initModel } from '../lib/model/init.js';
import { RunFolder } from '../lib/train/run.js';
import { CONFIG_SCHEMA } from '../lib/config/schema.js';
import type { TrainEpisode } from '../lib/train/types.js';
import { questions, reward, twoTurn } from './helpers/ppo-toy.js';
import { ppoDefinition, runPpo, type PpoOptions } from '../lib/train/rl/ppo.js';
import { ppoPrepare, ppoUpdate, type PpoBatch, type PpoStepInfo, type PpoUpdateOptions } from '../lib/train/rl/ppo-batch.js';

type Props = Record<string, { default?: unknown; properties?: Props }>;
// The algorithm section's keys every algorithm shares, and PPO's own (its definition adds them to the schema).
const SCHEMA_ALGORITHM = { ...(CONFIG_SCHEMA.properties as Props).algorithm.properties!, ...(ppoDefinition.algorithmKeys as Props) };
const SCHEMA_OPTIM = (CONFIG_SCHEMA.properties as Props).optim.properties!;

const LORA: LoraSpec = {
  r: 8,
  alpha: 16,
  dropout: 0,
  rslora: false,
  targets: ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'],
};
const opts: PpoOptions = {
  lora: LORA,
  n: 2,
  questionsPerStep: 4,
  steps: 40,
  temperature: [0.9, 1.1],
  ppoEpochs: 2,
  miniBatch: 4,
  schedule: { kind: 'constant', lr: 2e-2 },
  criticLr: 5e-2,
  klCoef: 0.001,
  seed: 3,
  checkpointEvery: 4,
  gradientCheckpointing: false,
};

let root: string;
t.before(() => {
  root = t.testdir();
  initModel({ preset: 'tiny', out: join(root, 'model'), seed: 4, overrides: { vocab_size: 64 }, embedStd: 0.08 });
});

const avg = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
const noTimes = (rows: Record<string, unknown>[]) =>
  rows.map((r) => Object.fromEntries(Object.entries(r).filter(([k]) => k !== 'time' && !k.startsWith('time_'))));

t.test('PPO raises the mean reward of a toy task; resume is exact (adapter, value head, metrics)', async (t) => {
  const m = await Model.load(join(root, 'model'));
  t.teardown(() => m.dispose());
  const run = new RunFolder(join(root, 'run'));
  const t0 = performance.now();
  const r = await runPpo(m, questions, run, { rollout: twoTurn(m), reward }, opts);
  const seconds = (performance.now() - t0) / 1e3;
  // Chance is 1/8. One seed alone is a draw: seed 3 reached 0.26 after 30 steps in a CI run of an
  // earlier tree, 0.50 after 40 on an AVX-512 Zen 4 and 0.23 with the kernels capped to AVX2 (whose
  // arithmetic differs in the last bits: 2026-11-29), where seeds 1, 2, 4 and 5 reached 0.71-0.90.
  // So three seeds, and the claim on them together: the mean of their last 5 steps above a quarter
  // and 0.15 above their first 5, and at least two of them rising by 0.15 on their own.
  const curves = [{ seed: opts.seed, rewards: r.meanReward, seconds }];
  for (const seed of [1, 2]) {
    const ms = await Model.load(join(root, 'model'));
    t.teardown(() => ms.dispose());
    const s0 = performance.now();
    const rs = await runPpo(
      ms,
      questions,
      new RunFolder(join(root, `run-seed${seed}`)),
      { rollout: twoTurn(ms), reward },
      { ...opts, seed },
    );
    curves.push({ seed, rewards: rs.meanReward, seconds: (performance.now() - s0) / 1e3 });
  }
  const ends = curves.map((c) => ({ seed: c.seed, first: avg(c.rewards.slice(0, 5)), last: avg(c.rewards.slice(-5)), seconds: c.seconds }));
  const first = avg(ends.map((e) => e.first)),
    last = avg(ends.map((e) => e.last));
  t.ok(
    last > first + 0.15 && last > 2 / 8 && ends.filter((e) => e.last > e.first + 0.15).length >= 2,
    `mean reward over seeds ${ends.map((e) => e.seed).join(', ')}: ${first.toFixed(3)} (first 5 steps) -> ${last.toFixed(3)} (last 5; chance 0.125); ${ends
      .map((e) => `seed ${e.seed} ${e.first.toFixed(3)} -> ${e.last.toFixed(3)} in ${e.seconds.toFixed(1)} s`)
      .join(', ')}`,
  );
  const rows = run.readMetrics();
  t.equal(rows.length, opts.steps);
  for (const k of [
    'reward_mean',
    'reward/good',
    'kl',
    'pg_loss',
    'vf_loss',
    'values_mean',
    'returns_mean',
    'explained_var',
    'pg_clipfrac',
    'ratio_mean',
    'grad_norm',
    'entropy',
    'mask_coverage',
    'lr',
    'critic_lr',
    'time_rollout_s',
    'time_prepare_s',
    'time_train_s',
  ])
    t.type(rows[5][k], 'number', `metrics has ${k}`);
  t.equal(rows[5].critic_lr, 5e-2);
  t.equal(rows[5].optimizer_steps, 4, '2 epochs x 2 mini-batches of 4 episodes');
  t.ok((rows[5].mask_coverage as number) < 6 / 15 + 1e-9, 'environment and prompt tokens are not counted as trained');
  const traj = readFileSync(join(root, 'run', 'trajectories.jsonl'), 'utf8')
    .trim()
    .split('\n');
  t.equal(traj.length, opts.steps * 8, 'every episode saved');
  t.type(JSON.parse(traj[0]).value, 'number', 'trajectories record the critic value');
  for (const f of ['adapter/adapter_model.safetensors', 'adapter/value_head.safetensors', 'optimizer.safetensors'])
    t.ok(existsSync(join(root, 'run', 'checkpoints', `step-${opts.steps}`, f)), `checkpoint holds ${f}`);

  // Interrupted after 6 steps (checkpoint at 4), resumed in a fresh process-like model: the same
  // adapter, value head and metrics as the uninterrupted run.
  const m2 = await Model.load(join(root, 'model'));
  t.teardown(() => m2.dispose());
  const run2 = new RunFolder(join(root, 'run2'));
  await runPpo(m2, questions, run2, { rollout: twoTurn(m2), reward }, { ...opts, stopAfter: 6 });
  t.equal(run2.readMetrics().length, 6);
  const m3 = await Model.load(join(root, 'model'));
  t.teardown(() => m3.dispose());
  await runPpo(m3, questions, run2, { rollout: twoTurn(m3), reward }, { ...opts, resume: true });
  const a = m.trainable();
  const b = m3.trainable();
  t.ok('value_head.weight' in a && 'value_head.bias' in a, 'the value head is trainable');
  t.same(Object.keys(b).sort(), Object.keys(a).sort());
  for (const k of Object.keys(a)) t.same(Array.from(b[k]), Array.from(a[k]), `${k} identical after resume`);
  t.same(noTimes(run2.readMetrics()), noTimes(rows), 'metrics identical after resume');
});

/** A fresh adapter (non-zero B, so every LoRA tensor gets a gradient) and value head: the same state every call. */
function freshState(m: Model): void {
  m.attachLora(LORA, 11);
  m.attachValueHead(12);
  for (const [k, w] of Object.entries(m.trainable()))
    if (k.includes('lora_B'))
      m.setTrainable(
        k,
        w.map((_, i) => 0.02 * Math.sin(i + k.length)),
      );
}

const UPDATE: PpoUpdateOptions = {
  epochs: 2,
  miniBatch: 2,
  seed: 5,
  lr: 1e-2,
  valueLr: 3e-2,
  clipLow: 0.2,
  clipHigh: 0.2,
  klCoef: 0,
  klEstimator: 'k1',
  entropyCoef: 0,
  vfCoef: 0.5,
  valueClip: 0.5,
  tokenLevel: true,
  weightDecay: 0,
  maxGradNorm: 1,
  checkpoint: false,
};

t.test('environment tokens (loss mask 0) carry nothing into the update', async (t) => {
  const m = await Model.load(join(root, 'model'));
  t.teardown(() => m.dispose());
  freshState(m);
  const reqs = questions.slice(0, 4).map((question, i) => ({ question, temperature: 1, seed: 40 + i }));
  const eps = await twoTurn(m)(reqs);
  const scores = (await Promise.all(eps.map((e) => reward(e)))).map((r, i) => r.total + 0.1 * i);
  const prep = await ppoPrepare(m, eps, scores, {
    gamma: 0.95,
    lam: 0.9,
    whiten: true,
    klCoef: 0.05,
    klIn: 'reward',
    klEstimator: 'k1',
    recomputeOldLogprobs: false,
    checkpoint: false,
  });
  t.same(prep.kept, [0, 1, 2, 3]);
  const b = prep.batch;
  let masked = 0;
  let trainedNonZero = 0;
  b.masks.forEach((mask, i) => {
    // The environment block sits between the two turns.
    t.same(Array.from(mask.slice(9, 12)), [0, 0, 0], `episode ${i}: environment tokens masked`);
    mask.forEach((x, k) => {
      if (x) {
        if (b.advantages[i][k] !== 0 && b.returns[i][k] !== 0 && b.oldValues[i][k] !== 0) trainedNonZero++;
        return;
      }
      masked++;
      for (const [name, arr] of [
        ['advantages', b.advantages],
        ['returns', b.returns],
        ['oldValues', b.oldValues],
        ['oldLogprobs', b.oldLogprobs],
        ['rewards', prep.adv.rewards],
      ] as const)
        if (arr[i][k] !== 0) t.fail(`${name}[${i}][${k}] = ${arr[i][k]} on a masked token`);
    });
  });
  t.ok(masked >= 4 * 9 && trainedNonZero === 4 * 6, `${masked} masked tokens hold 0; all ${trainedNonZero} trained tokens carry values`);
  // Recomputed old log-probs agree with the sampling ones; a KL in the loss leaves the token rewards
  // without the penalty (score on the last trained token only).
  const again = await ppoPrepare(m, eps, scores, {
    gamma: 0.95,
    lam: 0.9,
    whiten: true,
    klCoef: 0.05,
    klIn: 'loss',
    klEstimator: 'k1',
    recomputeOldLogprobs: true,
    checkpoint: false,
  });
  t.equal(again.refLogprobs, undefined, 'no reference pass when the KL is in the loss');
  let lpErr = 0;
  again.batch.oldLogprobs.forEach((lp, i) =>
    lp.forEach((v, k) => (lpErr = Math.max(lpErr, Math.abs(v - (b.masks[i][k] ? eps[i].logprobs[k] : 0))))),
  );
  t.ok(lpErr < 1e-4, `recomputed old log-probs match the sampling log-probs (max error ${lpErr.toExponential(2)})`);
  t.same(
    again.adv.rewards.map((r) => Array.from(r)),
    b.masks.map((mask, i) => Array.from(mask, (_, k) => (k === mask.length - 1 ? Math.fround(scores[i]) : 0))),
    'token rewards: the score on the last trained token, nothing else',
  );

  // The same update with garbage on every masked position: identical weights. A change on one
  // trained token: different weights (so the comparison can fail). The garbage stays finite and
  // moderate: the native loss weighs masked tokens by 0 rather than dropping them, so values that
  // overflow there (exp(logp - old) > float max, a squared value error of inf) would turn the loss
  // into NaN and skip the step; the trainer always sends 0 on masked tokens.
  const garbage = (xs: Float32Array[], lo: number, hi: number) =>
    xs.map((x, i) => x.map((v, k) => (b.masks[i][k] ? v : lo + ((hi - lo) * (1 + Math.sin(7 * k + i))) / 2)));
  const corrupted: PpoBatch = {
    ...b,
    advantages: garbage(b.advantages, -5, 5),
    returns: garbage(b.returns, -5, 5),
    oldValues: garbage(b.oldValues, -5, 5),
    oldLogprobs: garbage(b.oldLogprobs, -8, 0),
  };
  const nudged: PpoBatch = { ...b, advantages: b.advantages.map((x, i) => (i === 2 ? x.map((v, k) => (k === 14 ? v + 1 : v)) : x)) };
  t.equal(b.masks[2][14], 1);
  const after = async (batch: PpoBatch) => {
    freshState(m);
    const stats = await ppoUpdate(m, batch, UPDATE);
    t.equal(stats.length, 4, '2 epochs x 2 mini-batches');
    t.notOk(stats.some((s) => s.skipped));
    return m.trainable();
  };
  const ref = await after(b);
  const bad = await after(corrupted);
  const near = await after(nudged);
  const names = Object.keys(ref);
  t.ok(names.includes('value_head.weight') && names.some((k) => k.includes('lora_A')));
  const same = (x: Record<string, Float32Array>) => names.every((k) => x[k].every((v, i) => v === ref[k][i]));
  t.ok(same(bad), 'garbage advantages / returns / old values / old log-probs on masked tokens change nothing');
  t.notOk(same(near), 'a changed advantage on one trained token changes the update');
  freshState(m);
  const start = m.trainable();
  for (const k of names) t.notSame(Array.from(ref[k]), Array.from(start[k]), `${k} trained`);
});

t.test('a step trains on the hand-computed values, returns and advantages', async (t) => {
  const m = await Model.load(join(root, 'model'));
  const base = await Model.load(join(root, 'model'));
  t.teardown(() => (m.dispose(), base.dispose()));
  const gamma = 0.9;
  const lam = 0.8;
  const kl = 0.05;
  const infos: Array<PpoStepInfo & { values: number[][] }> = [];
  const calls: Array<{ batch: TrainBatch; opts: TrainOptions }> = [];
  const trainStep = m.trainStep.bind(m);
  m.trainStep = (batch, o) => {
    if (o.update !== false) calls.push({ batch, opts: o });
    return trainStep(batch, o);
  };
  let initial: Record<string, Float32Array> = {};
  const run = new RunFolder(join(root, 'run-check'));
  // Start from an adapter that is not the base (B != 0), so the policy and the reference differ.
  freshState(m);
  await runPpo(
    m,
    questions,
    run,
    { rollout: twoTurn(m), reward },
    {
      ...opts,
      keepAdapter: true,
      // The base model as the KL reference (not the default: the starting adapter), checked below.
      klReference: 'base',
      steps: 2,
      gamma,
      lam,
      klCoef: kl,
      criticWarmup: 1,
      checkpointEvery: 0,
      onBatch: async (info) => {
        if (info.step === 1) initial = m.trainable();
        // The recorded values are the value head's under the current weights, token by token: the native
        // value loss against random targets R (old values = the recorded ones, no clipping) is
        // mean over trained tokens of 0.5 (V - R)^2.
        const b = info.batch;
        const R = b.masks.map((mask, i) => Array.from(mask, (x, k) => (x ? Math.cos(3 * k + i) : 0)));
        const st = await trainStep(
          { sequences: b.sequences, masks: b.masks, returns: R, oldValues: b.oldValues },
          { loss: 'sft', vfCoef: 1, valueClip: Infinity, update: false, maxGradNorm: 0, checkpoint: false },
        );
        let s = 0;
        let n = 0;
        b.masks.forEach((mask, i) => mask.forEach((x, k) => x && (n++, (s += 0.5 * (b.oldValues[i][k] - R[i][k]) ** 2))));
        t.ok(
          Math.abs(st.valueLoss - s / n) < 1e-5 * Math.max(1, s / n),
          `step ${info.step}: value loss ${st.valueLoss} = ${s / n} from the recorded values`,
        );
        if (info.step === 2) {
          // Critic warm-up (step 1): the value head moved, the adapter did not.
          const now = m.trainable();
          for (const k of Object.keys(now)) {
            const moved = now[k].some((v, i) => v !== initial[k][i]);
            if (k.startsWith('value_head.')) t.ok(moved, `${k} trained during the critic warm-up`);
            else if (moved) t.fail(`${k} moved during the critic warm-up`);
          }
        }
        infos.push({ ...info, values: b.oldValues.map((v) => Array.from(v)) });
      },
    },
  );
  t.equal(infos.length, 2);
  t.equal(calls.length, 2 * 4, '4 optimizer steps per PPO step');
  for (const [si, info] of infos.entries()) {
    const b = info.batch;
    // Reference log-probs: the base model (no adapter) at each episode's temperature.
    for (let i = 0; i < b.sequences.length; i++) {
      const [lp] = await base.sequenceLogprobs([b.sequences[i]], b.temperature[i]);
      const ref = info.refLogprobs![i];
      if (!b.masks[i].every((x, k) => !x || Math.abs(ref[k] - lp[k]) < 1e-5))
        t.fail(`step ${info.step} episode ${i}: reference log-probs differ from the base model's`);
    }
    // By hand: token rewards, GAE over trained tokens only, whitening over the batch.
    const rawAdv: number[][] = [];
    const rets: number[][] = [];
    b.sequences.forEach((_, i) => {
      const mask = b.masks[i];
      const T = mask.length;
      const idx = Array.from({ length: T }, (_, k) => k).filter((k) => mask[k]);
      const rew = new Array(T).fill(0);
      for (const k of idx) rew[k] = -kl * (b.oldLogprobs[i][k] - info.refLogprobs![i][k]);
      rew[idx[idx.length - 1]] += info.scores[info.kept[i]];
      const A = new Array(T).fill(0);
      const G = new Array(T).fill(0);
      let nextV = 0;
      let nextA = 0;
      for (let j = idx.length - 1; j >= 0; j--) {
        const k = idx[j];
        const v = info.values[i][k];
        A[k] = rew[k] + gamma * nextV - v + gamma * lam * nextA;
        G[k] = A[k] + v;
        nextV = v;
        nextA = A[k];
      }
      rawAdv.push(A);
      rets.push(G);
    });
    const all = rawAdv.flatMap((A, i) => A.filter((_, k) => b.masks[i][k]));
    const mu = avg(all);
    const sd = Math.sqrt(all.reduce((a, x) => a + (x - mu) ** 2, 0) / (all.length - 1) + 1e-8);
    let worst = 0;
    b.sequences.forEach((_, i) =>
      b.masks[i].forEach((x, k) => {
        const wantA = x ? (rawAdv[i][k] - mu) / sd : 0;
        const wantR = x ? rets[i][k] : 0;
        worst = Math.max(worst, Math.abs(b.advantages[i][k] - wantA), Math.abs(b.returns[i][k] - wantR));
        if (x && b.oldLogprobs[i][k] !== info.episodes[info.kept[i]].logprobs[k])
          t.fail(`step ${info.step}: old log-prob [${i}][${k}] is not the sampling log-prob`);
      }),
    );
    t.ok(worst < 1e-4, `step ${info.step}: advantages and returns match the hand computation (max error ${worst.toExponential(2)})`);
    // What the native step received: the same rows, 2 epochs x 2 mini-batches covering every episode twice.
    const mine = calls.slice(si * 4, si * 4 + 4);
    const seen = new Array(b.sequences.length).fill(0);
    for (const c of mine) {
      t.equal(c.opts.loss, 'pg');
      // Left out of the options: the config schema's defaults (the one place they live).
      t.equal(c.opts.vfCoef, SCHEMA_ALGORITHM.vf_coef.default);
      t.equal(c.opts.valueClip, SCHEMA_ALGORITHM.value_clip.default);
      t.equal(c.opts.maxGradNorm, SCHEMA_OPTIM.max_grad_norm.default);
      t.equal(c.opts.valueLr, 5e-2, 'the critic learning rate');
      t.equal(c.opts.lr, si === 0 ? 0 : 2e-2, 'actor lr 0 during the critic warm-up');
      c.batch.sequences.forEach((s, j) => {
        const i = b.sequences.indexOf(s as Int32Array);
        seen[i]++;
        const warm = si === 0;
        const wantAdv = Array.from(b.masks[i], (x, k) => (x && !warm ? (rawAdv[i][k] - mu) / sd : 0));
        const close = (got: ArrayLike<number>, want: ArrayLike<number>) => Array.from(got).every((v, k) => Math.abs(v - want[k]) < 1e-4);
        if (!close(c.batch.advantages![j], wantAdv)) t.fail(`step ${info.step}: advantages sent for episode ${i}`);
        if (!close(c.batch.returns![j], rets[i])) t.fail(`step ${info.step}: returns sent for episode ${i}`);
        if (!close(c.batch.oldValues![j], info.values[i])) t.fail(`step ${info.step}: old values sent for episode ${i}`);
      });
    }
    t.same(
      seen,
      b.sequences.map(() => 2),
      `step ${info.step}: every episode in one mini-batch per epoch`,
    );
  }
});

t.test('Model.values (one native forward) equals the values the training loss sees, in a batch of unequal rows', async (t) => {
  const m = await Model.load(join(root, 'model'));
  t.teardown(() => m.dispose());
  m.attachLora(LORA, 5);
  // Non-zero lora_B so that the adapter changes the hidden states the head reads.
  for (const [k, w] of Object.entries(m.trainable()))
    if (k.includes('.lora_B.'))
      m.setTrainable(
        k,
        w.map((_, i) => Math.sin(i + k.length) * 0.05),
      );
  m.attachValueHead(9);
  const rows = [
    [10, 11, 12, 13, 14, 15, 16],
    [20, 21, 22, 23],
    [30, 31, 32, 33, 34, 35, 36, 37, 38, 39],
  ];
  const masks = rows.map((r, i) => r.map((_, k) => (k >= 2 && (k + i) % 3 !== 0 ? 1 : 0)));
  const fast = await m.values(rows, masks);
  const ref = await valuesFromTrainingPath(m, rows, masks);
  rows.forEach((r, i) => {
    t.equal(fast[i].length, r.length);
    for (let k = 0; k < r.length; k++) {
      if (!masks[i][k]) t.equal(fast[i][k], 0, `row ${i} token ${k}: masked -> 0`);
      else t.ok(Math.abs(fast[i][k] - ref[i][k]) < 1e-5 && ref[i][k] !== 0, `row ${i} token ${k}: ${fast[i][k]} vs ${ref[i][k]}`);
    }
  });
  const all = await m.values(rows);
  t.equal(all[0][0], 0, 't = 0 has no state before it');
  t.ok(Math.abs(all[1][3] - fast[1][3]) < 1e-6 || masks[1][3] === 0, 'without masks every position is computed');
  m.detachLora();
  const bare = await Model.load(join(root, 'model'));
  t.teardown(() => bare.dispose());
  await t.rejects(bare.values(rows), { code: 'NOT_SUPPORTED' }, 'no value head: a clear error');
});

t.test('reward.on_failure exclude: PPO trains nothing of an excluded episode and counts it', async (t) => {
  const m = await Model.load(join(root, 'model'));
  t.teardown(() => m.dispose());
  const firstToken = (ep: TrainEpisode) => Array.from(ep.ids).find((_, k) => ep.lossMask[k])!;
  const excluding = async (ep: TrainEpisode) => {
    const r = await reward(ep);
    return firstToken(ep) % 2 === 0 ? { ...r, failed: true, excluded: true } : r;
  };
  const infos: PpoStepInfo[] = [];
  const run = new RunFolder(join(t.testdir(), 'run'));
  await runPpo(
    m,
    questions,
    run,
    { rollout: twoTurn(m), reward: excluding },
    { ...opts, steps: 2, checkpointEvery: 0, onBatch: (i) => void infos.push(i) },
  );
  let excluded = 0;
  for (const info of infos) {
    const ex = info.episodes.map((e, i) => (firstToken(e) % 2 === 0 ? i : -1)).filter((i) => i >= 0);
    excluded += ex.length;
    t.same(
      info.kept.filter((i) => ex.includes(i)),
      [],
      `step ${info.step}: no excluded episode is trained on`,
    );
    t.equal(info.kept.length, info.episodes.length - ex.length, `step ${info.step}: every other episode is`);
  }
  t.ok(excluded > 0, `${excluded} episodes excluded`);
  t.equal(
    run.readMetrics().reduce((a, r) => a + ((r.episodes_excluded as number) ?? 0), 0),
    excluded,
    'episodes_excluded counts them',
  );
});

t.test('the KL reference of a stage that starts from an adapter is that adapter, frozen', async (t) => {
  const m = await Model.load(join(root, 'model'));
  const start = await Model.load(join(root, 'model'));
  t.teardown(() => (m.dispose(), start.dispose()));
  freshState(m);
  const dir = join(t.testdir(), 'start-adapter');
  await m.saveAdapter(dir);
  await start.loadAdapter(dir);
  const run = new RunFolder(join(t.testdir(), 'run'));
  let checked = 0;
  await runPpo(
    m,
    questions,
    run,
    { rollout: twoTurn(m), reward },
    {
      ...opts,
      keepAdapter: true,
      steps: 2,
      klCoef: 0.05,
      checkpointEvery: 0,
      onBatch: async (info) => {
        const b = info.batch;
        for (let i = 0; i < b.sequences.length; i++) {
          const [lp] = await start.sequenceLogprobs([b.sequences[i]], b.temperature[i]);
          const ref = info.refLogprobs![i];
          if (!b.masks[i].every((x, k) => !x || Math.abs(ref[k] - lp[k]) < 1e-5))
            t.fail(`step ${info.step} episode ${i}: the reference is not the starting adapter`);
          else checked++;
        }
        if (info.step === 2) {
          // The policy has moved by now: its log-probs differ from the reference's.
          const [now] = await m.sequenceLogprobs([b.sequences[0]], b.temperature[0]);
          t.ok(
            b.masks[0].some((x, k) => x && Math.abs(now[k] - info.refLogprobs![0][k]) > 1e-6),
            'the policy moved away from the reference',
          );
        }
      },
    },
  );
  t.equal(checked, 16, 'every episode of both steps');
});
