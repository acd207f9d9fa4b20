// PPO's separate critic (algorithm.critic: separate; Search-R1's critic is a model apart): a second
// LoRA adapter + value head on the same frozen base weights, its own AdamW, rate and clip. Checked
// against test/reference/ppo_critic.py (transformers + PEFT + torch.optim.AdamW, verl's dp_actor /
// dp_critic losses), which computes the update independently:
//   (a) the actor's adapter after one update is the policy-loss-only update: no value-loss gradient
//       reaches it (and a shared critic's would: the check can fail);
//   (b) the critic's adapter and value head get the value loss's gradient alone, clipped to their own
//       norm, stepped at their own rate; the values GAE reads come from the critic's forward;
//   (c) one set of base weights: attaching the critic adds its adapter's bytes only, the base is
//       untouched, and the process does not grow by a model's size;
//   (d) checkpoints hold the critic (adapter and optimizer state) and a resumed run ends byte for byte
//       where the uninterrupted one does;
// and the config option's way from configs/search-r1-ppo.yaml to the trainer.
import t from 'tap';
import { spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { peftPython } from '../bench/train.js';
import { configFromObject, loadConfig } from '../lib/config/index.js';
import { Model, type TrainBatch, type TrainOptions } from '../lib/engine/model.js';
import type { LoraSpec } from '../lib/engine/adapter.js';
import { initModel } from '../lib/model/init.js';
import { readSafetensorsHeader } from '../lib/model/safetensors.js';
import { RunFolder } from '../lib/train/run.js';
import { ppoOptionsFrom, runPpo, type PpoOptions } from '../lib/train/rl/ppo.js';
import { questions, reward, twoTurn } from './helpers/ppo-toy.js';
import { repoRoot } from './helpers/shared.js';

const py = peftPython();
const NO_PEFT = 'no python with torch, transformers and peft for the reference: run bash scripts/setup-venv.sh';
if (!py && process.env.CI) t.fail(NO_PEFT);

const LORA: LoraSpec = {
  r: 4,
  alpha: 8,
  dropout: 0,
  rslora: false,
  targets: ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'],
};
let root: string;
t.before(() => {
  root = t.testdir();
  initModel({ preset: 'tiny', out: join(root, 'model'), seed: 4, overrides: { vocab_size: 64 }, embedStd: 0.08 });
});

const wave = (n: number, a: number, b: number, scale: number) => Float32Array.from({ length: n }, (_, i) => scale * Math.sin(a * i + b));
const decode = (b64: string) => new Float32Array(new Uint8Array(Buffer.from(b64, 'base64')).buffer);
const maxAbs = (x: ArrayLike<number>) => Array.from(x).reduce((m, v) => Math.max(m, Math.abs(v)), 0);
const maxDiff = (x: ArrayLike<number>, y: ArrayLike<number>) => Array.from(x).reduce((m, v, i) => Math.max(m, Math.abs(v - y[i])), 0);

/** Actor adapter (B non-zero), value head, and a critic adapter that differs from the actor's; fresh optimizers. */
function freshState(m: Model, critic = true): void {
  m.attachLora(LORA, 11);
  m.attachValueHead(12);
  for (const [k, w] of Object.entries(m.trainable())) if (k.includes('lora_B')) m.setTrainable(k, wave(w.length, 1, k.length, 0.05));
  if (!critic) {
    m.detachCritic();
    return;
  }
  m.attachCritic();
  for (const [k, w] of Object.entries(m.trainable()))
    if (k.startsWith('critic.'))
      m.setTrainable(
        k,
        w.map((v, i) => v + 0.04 * Math.cos(0.7 * i + k.length)),
      );
}

// Three episodes: a prompt (mask 0), trained tokens, an environment block (mask 0), trained tokens.
const SEQS = [14, 12, 16].map((n, s) => Array.from({ length: n }, (_, i) => (i * 17 + s * 29 + 5) % 64));
const MASKS = SEQS.map((q, s) => q.map((_, i) => (i >= 3 + s && !(i >= 8 && i < 10) ? 1 : 0)));
const OPT = { beta1: 0.9, beta2: 0.999, eps: 1e-3, weightDecay: 0.01 };
const ACTOR = { lr: 2e-3, maxGradNorm: 0.05 };
const CRITIC = { lr: 7e-3, maxGradNorm: 0.3 };
const CLIP = { clipLow: 0.2, clipHigh: 0.25, valueClip: 0.5 };

async function batchFor(m: Model): Promise<TrainBatch> {
  const lp = await m.sequenceLogprobs(SEQS);
  const v = await m.values(SEQS);
  const on = (s: number, f: (i: number) => number) => Float32Array.from(SEQS[s], (_, i) => (MASKS[s][i] ? f(i) : 0));
  return {
    sequences: SEQS,
    masks: MASKS,
    // Old log-probs and values off by up to 0.35 and 0.9: some ratios and values fall outside their clip range.
    oldLogprobs: SEQS.map((_, s) => on(s, (i) => lp[s][i] + 0.35 * Math.sin(3 * i + s))),
    advantages: SEQS.map((_, s) => on(s, (i) => Math.cos(1.3 * i + 2 * s))),
    returns: SEQS.map((_, s) => on(s, (i) => 0.8 * Math.sin(0.9 * i - s))),
    oldValues: SEQS.map((_, s) => on(s, (i) => v[s][i] + 0.9 * Math.cos(2.1 * i + s))),
  };
}

const stepOptions = (vfCoef: number): TrainOptions => ({
  loss: 'pg',
  ...CLIP,
  vfCoef,
  tokenLevel: true,
  ...OPT,
  lr: ACTOR.lr,
  maxGradNorm: ACTOR.maxGradNorm,
  valueLr: CRITIC.lr,
  criticMaxGradNorm: CRITIC.maxGradNorm,
  checkpoint: true,
  seed: 1,
});
const group = (m: Model, which: 'actor' | 'critic') =>
  Object.fromEntries(
    Object.entries(m.trainable()).filter(([k]) => (which === 'critic') === (k.startsWith('critic.') || k.startsWith('value_head.'))),
  );

t.test(
  'one update with a separate critic matches transformers + PEFT: the actor sees the policy loss only, the critic the value loss with its own clip and rate',
  { skip: py ? false : NO_PEFT, timeout: 300_000 },
  async (t) => {
    const m = await Model.load(join(root, 'model'));
    t.teardown(() => m.dispose());
    freshState(m);
    const batch = await batchFor(m);
    const start = join(root, 'start');
    await m.saveAdapter(start);
    t.ok(existsSync(join(start, 'critic_adapter.safetensors')), 'saveAdapter writes the critic adapter');
    const criticDir = join(root, 'critic-peft');
    mkdirSync(criticDir, { recursive: true });
    copyFileSync(join(start, 'adapter_config.json'), join(criticDir, 'adapter_config.json'));
    copyFileSync(join(start, 'critic_adapter.safetensors'), join(criticDir, 'adapter_model.safetensors'));
    const head = m.trainable();
    const rows = (xs: ArrayLike<number>[] | undefined) => xs!.map((x) => Array.from(x));
    const req = {
      model_dir: join(root, 'model'),
      actor_dir: start,
      critic_dir: criticDir,
      value_head: { weight: Array.from(head['value_head.weight']), bias: Array.from(head['value_head.bias']) },
      sequences: SEQS,
      masks: MASKS,
      advantages: rows(batch.advantages),
      old_logprobs: rows(batch.oldLogprobs),
      returns: rows(batch.returns),
      old_values: rows(batch.oldValues),
      clip_low: CLIP.clipLow,
      clip_high: CLIP.clipHigh,
      value_clip: CLIP.valueClip,
      betas: [OPT.beta1, OPT.beta2],
      eps: OPT.eps,
      weight_decay: OPT.weightDecay,
      actor: { lr: ACTOR.lr, max_grad_norm: ACTOR.maxGradNorm },
      critic: { lr: CRITIC.lr, max_grad_norm: CRITIC.maxGradNorm },
    };
    const r = spawnSync(py!, [join(repoRoot, 'test', 'reference', 'ppo_critic.py')], {
      input: JSON.stringify(req),
      encoding: 'utf8',
      maxBuffer: 1 << 28,
      timeout: 240_000,
    });
    t.equal(r.status, 0, r.status === 0 ? 'the reference ran' : r.stderr.slice(-2000));
    type Side = { loss: number; grad_norm: number; grads: Record<string, string>; after: Record<string, string> };
    const ref = JSON.parse(r.stdout) as { values: number[][]; actor_trunk_values: number[][]; actor: Side; critic: Side };

    // The values GAE reads (Model.values) are the critic's forward, not the value head on the actor's trunk.
    const values = await m.values(SEQS);
    const vErr = Math.max(...values.map((v, s) => maxDiff(v, ref.values[s])));
    const vGap = Math.max(...values.map((v, s) => maxDiff(v, ref.actor_trunk_values[s])));
    t.ok(vErr < 1e-4, `Model.values = the critic's forward (max |diff| ${vErr.toExponential(2)})`);
    t.ok(vGap > 100 * Math.max(vErr, 1e-6), `and not the actor trunk's (they differ by up to ${vGap.toExponential(2)})`);

    // Gradients: one native step without the update, against the reference's.
    const st = await m.trainStep(batch, { ...stepOptions(0.5), update: false });
    t.ok(
      Math.abs(st.pgLoss - ref.actor.loss) < 1e-5 && Math.abs(st.valueLoss - ref.critic.loss) < 1e-5,
      `losses: policy ${st.pgLoss.toFixed(6)} (reference ${ref.actor.loss.toFixed(6)}), value ${st.valueLoss.toFixed(6)} (${ref.critic.loss.toFixed(6)})`,
    );
    t.ok(Math.abs(st.loss - st.pgLoss) < 1e-9, "the actor's loss has no value term");
    const grads = m.trainable({ grad: true });
    for (const side of ['actor', 'critic'] as const) {
      const want = ref[side];
      const names = Object.keys(group(m, side)).sort();
      t.same(Object.keys(want.grads).sort(), names, `${side}: a gradient for every tensor of its own (${names.length})`);
      const scale = Math.max(...names.map((k) => maxAbs(decode(want.grads[k]))));
      const err = Math.max(...names.map((k) => maxDiff(grads[k], decode(want.grads[k]))));
      t.ok(
        scale > 1e-4 && err < 2e-4 * scale,
        `${side}: max |grad - reference| ${err.toExponential(2)} (max |g| ${scale.toExponential(2)})`,
      );
    }
    const norms = { actor: st.gradNorm, critic: st.criticGradNorm ?? NaN };
    t.ok(
      Math.abs(norms.actor - ref.actor.grad_norm) < 1e-4 * ref.actor.grad_norm &&
        Math.abs(norms.critic - ref.critic.grad_norm) < 1e-4 * ref.critic.grad_norm,
      `gradient norms: actor ${norms.actor.toFixed(5)} (reference ${ref.actor.grad_norm.toFixed(5)}), critic ${norms.critic.toFixed(5)} (${ref.critic.grad_norm.toFixed(5)})`,
    );
    t.ok(
      ref.actor.grad_norm > ACTOR.maxGradNorm && ref.critic.grad_norm > CRITIC.maxGradNorm,
      'both clips act (each side is scaled by its own norm)',
    );

    // The update: applyGradients on those gradients, and a whole trainStep from the same state.
    const applied = await m.applyGradients({
      ...OPT,
      lr: ACTOR.lr,
      maxGradNorm: ACTOR.maxGradNorm,
      valueLr: CRITIC.lr,
      criticMaxGradNorm: CRITIC.maxGradNorm,
      loss: st.loss,
      valueLoss: st.valueLoss,
    });
    t.notOk(applied.skipped);
    const after = m.trainable();
    for (const [side, lr] of [
      ['actor', ACTOR.lr],
      ['critic', CRITIC.lr],
    ] as const) {
      const names = Object.keys(ref[side].after);
      const err = Math.max(...names.map((k) => maxDiff(after[k], decode(ref[side].after[k]))));
      const moved = Math.max(...names.map((k) => maxDiff(after[k], head[k])));
      t.ok(
        moved > 0.5 * lr && err < 2e-3 * lr,
        `${side}: weights after the step within ${err.toExponential(2)} of the reference (moved up to ${moved.toExponential(2)}, lr ${lr})`,
      );
    }
    freshState(m);
    const whole = await m.trainStep(batch, stepOptions(0.5));
    t.notOk(whole.skipped);
    const again = m.trainable();
    t.ok(
      Object.keys(after).every((k) => maxDiff(again[k], after[k]) === 0),
      'trainStep with the update = trainStep without it + applyGradients',
    );

    // (a) The actor's adapter equals a policy-loss-only step's (vfCoef 0, no critic); a shared critic's
    // value loss (vfCoef 0.5 on the actor's adapter) gives another.
    const actorAfter = group(m, 'actor');
    freshState(m, false);
    await m.trainStep(batch, stepOptions(0));
    const policyOnly = group(m, 'actor');
    t.ok(
      Object.keys(actorAfter).every((k) => maxDiff(actorAfter[k], policyOnly[k]) === 0),
      "the actor's adapter after the step is the policy-loss-only step's, bit for bit",
    );
    freshState(m, false);
    await m.trainStep(batch, stepOptions(0.5));
    const shared = group(m, 'actor');
    t.ok(
      Object.keys(actorAfter).some((k) => maxDiff(actorAfter[k], shared[k]) > 1e-6),
      "with a shared critic the value loss moves the actor's adapter (the comparison can fail)",
    );
  },
);

t.test('one set of base weights: the critic adds its adapter only', async (t) => {
  const m = await Model.load(join(root, 'model'));
  t.teardown(() => m.dispose());
  freshState(m, false);
  const before = m.info();
  const digest = m.baseDigest();
  const lora = Object.entries(m.trainable())
    .filter(([k]) => k.includes('lora_'))
    .reduce((a, [, v]) => a + 4 * v.length, 0);
  m.attachCritic();
  const info = m.info();
  t.equal(info.parameterBytes, before.parameterBytes, 'the base weights are counted once');
  t.equal(info.nativeBytes - before.nativeBytes, lora, `the critic adds its adapter's ${lora} bytes, nothing else`);
  await m.trainStep(await batchFor(m), stepOptions(0.5));
  t.equal(m.baseDigest(), digest, 'a step leaves the shared base untouched');
  t.throws(
    () => {
      m.detachLora();
      m.attachCritic();
    },
    { code: 'NOT_SUPPORTED' },
    'no critic without an actor adapter to copy',
  );

  // A model of 200 MiB: attaching the critic, and training with it, grow the process by far less than
  // the weights (a second copy would add at least parameterBytes). Steps before the measure let the
  // allocator's per-thread arenas settle (measured 2026-11-26 on the 2-core EPYC: the RSS of
  // shared-critic steps rose by ~70 MiB a step over the first four, then stayed; the critic's attach
  // added 0, its five steps 32 MiB).
  initModel({ preset: 'small', out: join(root, 'small'), seed: 1, overrides: { vocab_size: 4096, num_hidden_layers: 16 } });
  const big = await Model.load(join(root, 'small'));
  t.teardown(() => big.dispose());
  const seqs = [Array.from({ length: 48 }, (_, i) => (i * 37) % 4096)];
  const masks = [seqs[0].map((_, i) => (i > 8 ? 1 : 0))];
  const zeros = () => [new Float32Array(48)];
  const step = async () =>
    big.trainStep(
      {
        sequences: seqs,
        masks,
        advantages: zeros(),
        oldLogprobs: await big.sequenceLogprobs(seqs),
        returns: zeros(),
        oldValues: await big.values(seqs),
      },
      { ...stepOptions(0.5), checkpoint: false },
    );
  big.attachLora(LORA, 1);
  big.attachValueHead(2);
  for (let i = 0; i < 6; i++) await step();
  const rss0 = process.memoryUsage().rss;
  big.attachCritic();
  const attached = process.memoryUsage().rss - rss0;
  for (let i = 0; i < 5; i++) await step();
  const grown = process.memoryUsage().rss - rss0;
  const weights = big.info().parameterBytes;
  const mib = (x: number) => `${x >= 0 ? '+' : ''}${(x / 2 ** 20).toFixed(1)} MiB`;
  t.ok(
    weights > 200e6 && attached < weights / 20 && grown < weights / 2,
    `RSS ${mib(attached)} on attaching the critic, ${mib(grown)} after 5 steps with it; the base weights are ${mib(weights).slice(1)}`,
  );
});

const RUN: PpoOptions = {
  lora: LORA,
  n: 2,
  questionsPerStep: 4,
  steps: 6,
  temperature: [0.9, 1.1],
  ppoEpochs: 2,
  miniBatch: 4,
  schedule: { kind: 'constant', lr: 2e-2 },
  criticLr: 5e-2,
  klCoef: 0.001,
  seed: 3,
  checkpointEvery: 2,
  gradientCheckpointing: false,
  critic: 'separate',
  criticMaxGradNorm: 0.7,
};
const noTimes = (rows: Record<string, unknown>[]) =>
  rows.map((r) => Object.fromEntries(Object.entries(r).filter(([k]) => k !== 'time' && !k.startsWith('time_'))));

t.test('a separate critic is checkpointed (adapter and optimizer) and a resumed run is byte-identical', async (t) => {
  const m = await Model.load(join(root, 'model'));
  t.teardown(() => m.dispose());
  const seen: TrainOptions[] = [];
  const trainStep = m.trainStep.bind(m);
  m.trainStep = (b, o) => (seen.push(o), trainStep(b, o));
  const run = new RunFolder(join(root, 'run'));
  await runPpo(m, questions, run, { rollout: twoTurn(m), reward }, RUN);
  t.ok(m.hasCritic(), 'the run trains a separate critic');
  t.ok(
    seen.length > 0 && seen.every((o) => o.criticMaxGradNorm === 0.7 && o.valueLr === 5e-2),
    "the critic's clip and rate reach every trainStep",
  );
  const rows = run.readMetrics();
  t.ok(
    rows.every((r) => typeof r.critic_grad_norm === 'number' && (r.critic_grad_norm as number) > 0),
    'metrics report the critic gradient norm',
  );
  const ck = join(root, 'run', 'checkpoints', 'step-4');
  const critic = Object.keys(readSafetensorsHeader(join(ck, 'adapter', 'critic_adapter.safetensors'))).filter((k) => k !== '__metadata__');
  t.equal(critic.length, 2 * 2 * LORA.targets.length, "the checkpoint holds the critic's A and B for 7 projections in 2 layers");
  const optim = Object.keys(readSafetensorsHeader(join(ck, 'optimizer.safetensors')));
  t.ok(
    optim.includes('critic/step') &&
      optim.includes('critic/value_head.weight.exp_avg') &&
      optim.some((k) => k.startsWith('critic/critic.base_model.')),
    "the optimizer file holds the critic's own AdamW state",
  );
  t.notOk(
    optim.some((k) => k.startsWith('value_head.')),
    "the actor's optimizer has no value-head state",
  );

  const m2 = await Model.load(join(root, 'model'));
  t.teardown(() => m2.dispose());
  const run2 = new RunFolder(join(root, 'run2'));
  await runPpo(m2, questions, run2, { rollout: twoTurn(m2), reward }, { ...RUN, stopAfter: 3 });
  const m3 = await Model.load(join(root, 'model'));
  t.teardown(() => m3.dispose());
  await t.rejects(
    runPpo(m3, questions, run2, { rollout: twoTurn(m3), reward }, { ...RUN, critic: 'shared', resume: true }),
    { code: 'CONFIG_INVALID' },
    'resuming a separate-critic run with a shared critic is refused',
  );
  await runPpo(m3, questions, run2, { rollout: twoTurn(m3), reward }, { ...RUN, resume: true });
  const a = m.trainable();
  const b = m3.trainable();
  t.same(Object.keys(b).sort(), Object.keys(a).sort());
  t.ok(
    Object.keys(a).some((k) => k.startsWith('critic.')),
    'the critic is among the trained tensors',
  );
  const differ = Object.keys(a).filter((k) => maxDiff(a[k], b[k]) !== 0);
  t.same(differ, [], 'every tensor (actor, critic, value head) identical after resume');
  t.same(noTimes(run2.readMetrics()), noTimes(rows), 'metrics identical after resume');
});

t.test('algorithm.critic and optim.critic_max_grad_norm reach the PPO trainer; the Search-R1 recipes use a separate critic', async (t) => {
  for (const f of ['search-r1-ppo.yaml', 'search-r1-sft-ppo.yaml']) {
    const cfg = loadConfig(join(repoRoot, 'configs', f));
    t.same(
      [cfg.algorithm.critic, cfg.optim.critic_max_grad_norm, cfg.optim.max_grad_norm],
      ['separate', 1, 1],
      `${f}: separate critic, its own clip 1.0 (ppo_trainer.yaml critic.grad_clip)`,
    );
    const o = ppoOptionsFrom(cfg);
    t.same([o.critic, o.criticMaxGradNorm], ['separate', 1]);
  }
  const base = { stage: 'ppo', model: { path: '/m' }, data: { questions: '/q.jsonl', corpus: '/c.jsonl' } };
  const dflt = ppoOptionsFrom(configFromObject(base));
  t.same([dflt.critic, dflt.criticMaxGradNorm], ['shared', undefined], 'default: shared, the critic clip follows max_grad_norm');
  const set = ppoOptionsFrom(configFromObject({ ...base, algorithm: { critic: 'separate' }, optim: { critic_max_grad_norm: 0.3 } }));
  t.same([set.critic, set.criticMaxGradNorm], ['separate', 0.3]);
  t.throws(
    () => configFromObject({ ...base, optim: { critic_grad_clip: 0.3 } }),
    { message: /did you mean optim\.critic_max_grad_norm/ },
    "verl's name points to the key",
  );
  t.throws(
    () => configFromObject({ ...base, algorithm: { critic: 'separate', vf_coef: 0 } }),
    { code: 'CONFIG_INVALID' },
    'a separate critic with the value loss off is refused',
  );
  t.throws(() => configFromObject({ ...base, algorithm: { critic: 'apart' } }), { code: 'CONFIG_INVALID' });
});
