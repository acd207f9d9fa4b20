// GRPO end to end at tiny scale on a toy task: a 64-token vocabulary and reward = the share of
// generated tokens that are the "given word" (token 7; 1/64 of them at random). The mean reward must rise within a bounded number of
// steps; a resumed run must reach exactly the uninterrupted run's adapter.
import t from 'tap';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Model } from '../lib/engine/model.js';
import { initModel } from '../lib/model/init.js';
import { RunFolder } from '../lib/train/run.js';
import { runGrpo, type GrpoOptions } from '../lib/train/rl/grpo.js';
import type { RolloutRequest, TrainEpisode } from '../lib/train/types.js';

type Q = { id: number; prompt: number[] };
const questions: Q[] = Array.from({ length: 4 }, (_, i) => ({
  id: i,
  prompt: Array.from({ length: 6 }, (_, k) => ((i * 13 + k * 7) % 50) + 10),
}));

function direct(model: Model, maxNewTokens: number) {
  return async (reqs: RolloutRequest<Q>[]): Promise<TrainEpisode[]> => {
    const g = await model.generate({
      prompts: reqs.map((r) => Int32Array.from(r.question.prompt)),
      maxNewTokens,
      temperature: reqs.map((r) => r.temperature),
      seed: reqs[0].seed,
    });
    return reqs.map((r, i) => {
      const P = r.question.prompt.length;
      const n = g.tokens[i].length;
      const ids = Int32Array.from([...r.question.prompt, ...g.tokens[i]]);
      const lossMask = Uint8Array.from({ length: P + n }, (_, k) => (k >= P ? 1 : 0));
      const logprobs = new Float32Array(P + n);
      logprobs.set(g.logprobs[i], P);
      return {
        ids,
        lossMask,
        logprobs,
        temperature: r.temperature,
        answer: null,
        turns: 1,
        record: { completion: Array.from(g.tokens[i]) },
      };
    });
  };
}
const reward = async (ep: TrainEpisode) => {
  const gen = Array.from(ep.ids).filter((_, k) => ep.lossMask[k]);
  const share = gen.filter((x) => x === 7).length / Math.max(1, gen.length);
  return { total: share, parts: { given_word: share } };
};
// Reference GRPO advantages for the toy run: (r - mean) / std, groups without variance skipped.
const advantages = (r: number[]) => {
  const m = r.reduce((a, b) => a + b, 0) / r.length;
  const sd = Math.sqrt(r.reduce((a, b) => a + (b - m) ** 2, 0) / r.length);
  return sd < 1e-8 ? { advantages: null, reason: 'no variance' } : { advantages: r.map((x) => (x - m) / (sd + 1e-6)) };
};

const opts: GrpoOptions = {
  lora: {
    r: 8,
    alpha: 16,
    dropout: 0,
    rslora: false,
    targets: ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'],
  },
  k: 16,
  questionsPerStep: 2,
  steps: 24,
  temperature: [0.9, 1.1],
  schedule: { kind: 'constant', lr: 2e-2 },
  seed: 3,
  checkpointEvery: 4,
};

t.test('GRPO raises the mean reward of a toy task; resume is exact', async (t) => {
  const root = t.testdir();
  initModel({ preset: 'tiny', out: join(root, 'model'), seed: 4, overrides: { vocab_size: 64 }, embedStd: 0.08 });
  const m = await Model.load(join(root, 'model'));
  t.teardown(() => m.dispose());
  const run = new RunFolder(join(root, 'run'));
  const r = await runGrpo(m, questions, run, { rollout: direct(m, 4), reward, advantages }, opts);
  const first = r.meanReward.slice(0, 4).reduce((a, b) => a + b, 0) / 4;
  const last = r.meanReward.slice(-4).reduce((a, b) => a + b, 0) / 4;
  t.ok(last > first + 0.2, `mean reward ${first.toFixed(3)} (first 4 steps) -> ${last.toFixed(3)} (last 4)`);
  const rows = run.readMetrics();
  t.equal(rows.length, 24);
  for (const k of [
    'reward_mean',
    'reward/given_word',
    'loss',
    'grad_norm',
    'clip_frac',
    'entropy',
    'mask_coverage',
    'time_rollout_s',
    'time_train_s',
  ])
    t.type(rows[5][k], 'number', `metrics has ${k}`);
  const traj = readFileSync(join(root, 'run', 'trajectories.jsonl'), 'utf8')
    .trim()
    .split('\n');
  t.equal(traj.length, 24 * 2 * 16, 'every episode saved');
  t.ok(existsSync(join(root, 'run', 'checkpoints', 'step-24', 'adapter', 'adapter_model.safetensors')));

  // Interrupted after 6 steps (checkpoint at 4), resumed: the same adapter as the uninterrupted run.
  const m2 = await Model.load(join(root, 'model'));
  t.teardown(() => m2.dispose());
  const run2 = new RunFolder(join(root, 'run2'));
  await runGrpo(m2, questions, run2, { rollout: direct(m2, 4), reward, advantages }, { ...opts, stopAfter: 6 });
  const m3 = await Model.load(join(root, 'model'));
  t.teardown(() => m3.dispose());
  await runGrpo(m3, questions, run2, { rollout: direct(m3, 4), reward, advantages }, { ...opts, resume: true });
  const a = m.trainable();
  const b = m3.trainable();
  for (const k of Object.keys(a)) t.same(Array.from(b[k]), Array.from(a[k]), `${k} identical after resume`);
});

t.test('reward.on_failure exclude: excluded episodes leave their group and the loss, and are counted', async (t) => {
  const root = t.testdir();
  initModel({ preset: 'tiny', out: join(root, 'model'), seed: 4, overrides: { vocab_size: 64 }, embedStd: 0.08 });
  const m = await Model.load(join(root, 'model'));
  t.teardown(() => m.dispose());
  // A failed judge call stands in: episodes whose first generated token is even are "excluded".
  const first = (ep: TrainEpisode) => Array.from(ep.ids).find((_, k) => ep.lossMask[k])!;
  const excluding = async (ep: TrainEpisode) => {
    const r = await reward(ep);
    return first(ep) % 2 === 0 ? { ...r, total: -1, failed: true, excluded: true } : r;
  };
  const seen: number[][] = [];
  const adv = (r: number[]) => {
    seen.push(r);
    return advantages(r);
  };
  const run = new RunFolder(join(root, 'run'));
  await runGrpo(
    m,
    questions,
    run,
    { rollout: direct(m, 4), reward: excluding, advantages: adv },
    { ...opts, steps: 2, checkpointEvery: 0 },
  );
  const lines = readFileSync(join(root, 'run', 'trajectories.jsonl'), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l));
  const ex = lines.filter((l) => (l.completion[0] as number) % 2 === 0);
  t.ok(ex.length > 0 && ex.length < lines.length, `${ex.length} of ${lines.length} episodes excluded`);
  t.ok(
    ex.every((l) => l.advantage === null),
    'excluded episodes get no advantage',
  );
  t.ok(
    seen.every((g) => !g.includes(-1)),
    'the group statistics never saw an excluded reward',
  );
  t.equal(
    seen.reduce((a, g) => a + g.length, 0),
    lines.length - ex.length,
    'the groups hold exactly the other episodes',
  );
  const rows = run.readMetrics();
  t.equal(
    rows.reduce((a, r) => a + ((r.episodes_excluded as number) ?? 0), 0),
    ex.length,
    'episodes_excluded counts them',
  );
});
