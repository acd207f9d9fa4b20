// RFT, rejection-sampling fine-tuning (lib/train/rl/rft.ts): the filter keeps exactly the episodes the
// reward marks correct (or that reach rft.min_reward), once per distinct episode and at most
// rft.max_per_question per question, and the fine-tuning data holds exactly their tokens with the
// loss on the model's own tokens; the trainer hands the optimizer exactly those episodes, round
// after round (a stand-in model records what it is trained on); the config refuses bad rft values
// with coded errors and fills the defaults; `slm-train train` with `stage: rft` runs a round end to
// end on the tiny model, training on the kept episodes and no other; and --resume continues it.
import t from 'tap';
import { appendFileSync, existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { initModel } from '../lib/model/init.js';
import { loadConfig, validateConfig } from '../lib/config/load.js';
import { trainFromConfig } from '../lib/train/session.js';
import { rftExamples, rftOptionsFrom, rftSelect, roundQuestions, runRft, type RftKeepOptions } from '../lib/train/rl/rft.js';
import { RunFolder } from '../lib/train/run.js';
import type { RewardResult, TrainEpisode } from '../lib/train/types.js';
import { runCliAsync } from './helpers/cli.js';

/** An episode: a prompt of `prompt` tokens (mask 0), then `gen` generated tokens (mask 1), then `obs` environment tokens (mask 0) and 2 more generated. */
function episode(seed: number, prompt = 4, gen = 3, obs = 0): TrainEpisode {
  const n = prompt + gen + (obs ? obs + 2 : 0);
  const ids = Int32Array.from({ length: n }, (_, i) => 10 + ((seed * 31 + i * 7) % 90));
  const lossMask = Uint8Array.from({ length: n }, (_, i) =>
    (i >= prompt && i < prompt + gen) || (obs > 0 && i >= prompt + gen + obs) ? 1 : 0,
  );
  return { ids, lossMask, logprobs: new Float32Array(n), temperature: 1, answer: `a${seed}`, turns: 1 };
}
const reward = (total: number, correct?: boolean, excluded?: boolean): RewardResult => ({
  total,
  parts: { em: total },
  ...(correct !== undefined ? { correct } : {}),
  ...(excluded ? { excluded } : {}),
});
const ALL: RftKeepOptions = { minReward: null, maxPerQuestion: 0, unique: true };

t.test('the filter keeps exactly the episodes the reward marks correct; the data holds exactly their tokens', async (t) => {
  // Two questions, k = 4. Question 0: correct, wrong, correct (an exact copy of episode 0), correct
  // with an environment reply inside. Question 1: wrong with a high reward, correct but excluded by
  // its reward, correct with no generated token, correct.
  const eps = [episode(1), episode(2), episode(1), episode(3, 5, 2, 3), episode(4), episode(5), episode(6, 6, 0), episode(7, 2, 6)];
  const rws = [
    reward(1, true),
    reward(0, false),
    reward(1, true),
    reward(1, true),
    reward(5, false),
    reward(1, true, true),
    reward(1, true),
    reward(1, true),
  ];
  const sel = rftSelect(eps, rws, 4, ALL);
  t.same(sel.verdicts, ['kept', 'rejected', 'duplicate', 'kept', 'rejected', 'excluded', 'empty', 'kept']);
  t.same(sel.keep, [true, false, false, true, false, false, false, true]);
  const data = rftExamples(eps, sel.keep);
  t.same(
    data.map((d) => d.row),
    [0, 3, 7],
    'the kept episodes, in order',
  );
  for (const d of data) {
    const e = eps[d.row];
    t.same(d.ids, Array.from(e.ids), `episode ${d.row}: exactly its tokens`);
    t.same(d.mask, Array.from(e.lossMask), `episode ${d.row}: the loss on the model's own tokens`);
  }
  // Episode 3: the prompt and the environment's reply are not trained on, both generated pieces are.
  t.same(data[1].mask, [0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1]);
  t.ok(
    data.every((d) => rws[d.row].correct === true && !rws[d.row].excluded),
    'every training example is an episode the reward marks correct',
  );

  t.same(
    rftSelect(eps, rws, 4, { ...ALL, unique: false }).verdicts.slice(0, 4),
    ['kept', 'rejected', 'kept', 'kept'],
    'unique: false keeps the copy',
  );
  // Cap 1 per question: the highest reward first, ties in sampling order.
  const capped = rftSelect(
    [episode(1), episode(2), episode(3), episode(4)],
    [reward(0.5, true), reward(0.9, true), reward(0.9, true), reward(1, false)],
    4,
    { ...ALL, maxPerQuestion: 1 },
  );
  t.same(capped.verdicts, ['capped', 'kept', 'capped', 'rejected']);
  // A reward threshold in place of the verdict: reward >= 0.5, whatever `correct` says.
  const byReward = rftSelect(eps, rws, 4, { ...ALL, minReward: 0.5 });
  t.same(byReward.verdicts, ['kept', 'rejected', 'duplicate', 'kept', 'kept', 'excluded', 'empty', 'kept']);
  t.same(
    rftSelect([episode(1), episode(2)], [reward(NaN), reward(0.5)], 2, { ...ALL, minReward: 0 }).keep,
    [false, true],
    'a non-finite reward is never kept',
  );
  // A reward without a verdict cannot say what is correct.
  t.throws(() => rftSelect([episode(1), episode(2)], [reward(1), reward(0)], 2, ALL), {
    code: 'CONFIG_INVALID',
    message: /rft\.min_reward is null.*no correctness verdict/,
  });
  t.throws(() => rftSelect([episode(1), episode(2), episode(3)], [reward(1, true), reward(0, false), reward(1, true)], 2, ALL), {
    code: 'ARGUMENT_INVALID',
  });
});

t.test('round questions: all of them, or the next N of a seeded order across rounds', async (t) => {
  t.same(roundQuestions(3, null, 0, 5), [0, 1, 2]);
  const r0 = roundQuestions(5, 2, 7, 0);
  const r1 = roundQuestions(5, 2, 7, 1);
  const r2 = roundQuestions(5, 2, 7, 2);
  t.equal(new Set([...r0, ...r1, r2[0]]).size, 5, 'the first five positions are one pass over the questions');
  t.same(roundQuestions(5, 2, 7, 1), r1, 'deterministic');
});

t.test('runRft hands the optimizer exactly the kept episodes of each round, with their loss masks', async (t) => {
  // A stand-in model that records what it is trained on, and rollouts and a reward that are known:
  // question q's sample j is correct when (q + j + round) is even; in round 1 sample 0 of question 0
  // (correct) is excluded by its reward.
  const trained: Array<{ ids: number[]; mask: number[]; lr: number }> = [];
  const model = {
    lora: undefined as unknown,
    attachLora(spec: unknown) {
      this.lora = spec;
    },
    async trainStep(batch: { sequences: number[][]; masks: number[][] }, o: { loss: string; lr: number }) {
      t.equal(o.loss, 'sft', 'the SFT loss');
      batch.sequences.forEach((ids, i) => trained.push({ ids, mask: batch.masks[i], lr: o.lr }));
      return { loss: 0.5, gradNorm: 1, tokens: batch.masks.flat().reduce((a, b) => a + b, 0), skipped: false, skipReason: '' };
    },
    nonFinite: () => null,
    async saveAdapter(dir: string) {
      mkdirSync(dir, { recursive: true });
      writeFileSync(join(dir, 'adapter_model.safetensors'), '');
    },
    async saveOptimizer(file: string) {
      writeFileSync(file, '');
    },
  };
  const qs = ['q0', 'q1', 'q2'];
  let round = 0;
  const sampled: Array<{ q: string; seed: number; ep: TrainEpisode; r: RewardResult }> = [];
  const deps = {
    rollout: async (reqs: Array<{ question: string; seed: number; temperature: number }>) => {
      const out = reqs.map((rq, i) => {
        const j = i % 2;
        const q = qs.indexOf(rq.question);
        const ep = episode(100 * round + 10 * q + j, 3, 2 + j + q);
        const r = reward(1, (q + j + round) % 2 === 0, round === 0 && q === 0 && j === 0);
        sampled.push({ q: rq.question, seed: rq.seed, ep, r });
        return ep;
      });
      return out;
    },
    reward: async (ep: TrainEpisode) => sampled.find((x) => x.ep === ep)!.r,
  };
  const run = new RunFolder(join(t.testdir(), 'run'));
  const r = await runRft(
    model as never,
    qs,
    run,
    { rollout: deps.rollout as never, reward: deps.reward },
    {
      lora: { r: 2, alpha: 4, dropout: 0, rslora: false, targets: ['q_proj'] },
      k: 2,
      rounds: 2,
      epochs: 2,
      keep: ALL,
      questionsPerRound: null,
      questionsPerBatch: 2,
      batchSize: 2,
      temperature: 1,
      seed: 5,
      schedule: { kind: 'constant', lr: 0.01 },
      log: (line) => {
        if (/^rft round \d+: sampled/.test(line)) round++;
      },
    },
  );
  t.ok(model.lora, 'a fresh adapter was attached');
  t.equal(sampled.length, 2 * 3 * 2, '2 rounds x 3 questions x 2 samples');
  const kept = sampled.filter((x) => x.r.correct && !x.r.excluded);
  t.equal(kept.length, 5, 'round 1: q1 j1, q2 j0 (q0 j0 excluded); round 2: q0 j1, q1 j0, q2 j1');
  const key = (ids: ArrayLike<number>, mask: ArrayLike<number>) => `${Array.from(ids).join(',')}|${Array.from(mask).join('')}`;
  const want = kept.flatMap((x) => [key(x.ep.ids, x.ep.lossMask), key(x.ep.ids, x.ep.lossMask)]).sort();
  t.same(trained.map((x) => key(x.ids, x.mask)).sort(), want, 'every kept episode twice (2 epochs), with its loss mask, and nothing else');
  t.equal(r.steps, 1 * 2 + 2 * 2, 'ceil(2 / 2) x 2 epochs + ceil(3 / 2) x 2 epochs');
  t.same(r.rounds, 2);
  t.equal(new Set(sampled.map((x) => x.seed)).size, sampled.length, 'every sample its own seed');
  const rows = run.readMetrics();
  t.same(
    rows.filter((m) => m.kind === 'rft_sample').map((m) => [m.round, m.step, m.episodes_sampled, m.episodes_kept, m.episodes_excluded]),
    [
      [1, 0, 6, 2, 1],
      [2, 2, 6, 3, 0],
    ],
  );
});

const base = { stage: 'rft', model: { path: '/m' }, data: { questions: '/q.jsonl', corpus: '/c.jsonl' } };
const errorOf = (f: () => unknown) => {
  try {
    f();
  } catch (e) {
    return e as { code: string; message: string };
  }
  throw new Error('expected an error');
};

t.test('config: rft defaults, and bad rft values refused with coded errors', async (t) => {
  const c = validateConfig(base, 'test');
  t.equal(c.stage, 'rft');
  t.equal(c.algorithm.kind, 'rft', 'algorithm.kind follows the stage');
  t.same(c.rft, { rounds: 1, min_reward: null, epochs: 1, max_per_question: 0, unique: true, questions_per_round: null });
  t.match(rftOptionsFrom(c), {
    k: 8,
    rounds: 1,
    epochs: 1,
    keep: { minReward: null, maxPerQuestion: 0, unique: true },
    questionsPerRound: null,
    questionsPerBatch: 4,
    batchSize: 8,
    temperature: 1,
    topP: 1,
    schedule: { kind: 'constant', lr: 1e-4 },
  });
  const set = validateConfig(
    {
      ...base,
      rollout: { k: 4 },
      rft: { rounds: 3, min_reward: 0.5, epochs: 2, max_per_question: 2, unique: false, questions_per_round: 16 },
    },
    'test',
  );
  t.match(rftOptionsFrom(set), {
    k: 4,
    rounds: 3,
    epochs: 2,
    keep: { minReward: 0.5, maxPerQuestion: 2, unique: false },
    questionsPerRound: 16,
  });
  t.equal(validateConfig({ ...base, rollout: { k: 1 } }, 'test').rollout.k, 1, 'one sample per question is allowed');

  for (const [bad, key] of [
    [{ rft: { rounds: 0 } }, 'rft.rounds'],
    [{ rft: { rounds: 1.5 } }, 'rft.rounds'],
    [{ rft: { epochs: 0 } }, 'rft.epochs'],
    [{ rft: { max_per_question: -1 } }, 'rft.max_per_question'],
    [{ rft: { questions_per_round: 0 } }, 'rft.questions_per_round'],
    [{ rft: { min_reward: 'high' } }, 'rft.min_reward'],
    [{ rft: { unique: 'yes' } }, 'rft.unique'],
    [{ rollout: { k: 0 } }, 'rollout.k'],
    [{ train: { steps: 10 } }, 'train.steps'],
    [{ distributed: { nproc: 2 } }, 'distributed.nproc'],
    [{ algorithm: { kind: 'grpo' } }, 'algorithm.kind'],
  ] as const) {
    const e = errorOf(() => validateConfig({ ...base, ...bad }, 'c.yaml'));
    t.equal(e.code, 'CONFIG_INVALID', `${JSON.stringify(bad)}: CONFIG_INVALID`);
    t.match(e.message, key, `${JSON.stringify(bad)}: names ${key}`);
  }
  t.equal(errorOf(() => validateConfig({ ...base, rft: { round: 2 } }, 'c.yaml')).code, 'CONFIG_UNKNOWN_KEY');
  t.match(
    errorOf(() => validateConfig({ ...base, data: {} }, 'c.yaml')).message,
    'data.questions: missing; the rft stage needs question rows',
  );
});

t.test('stage: rft end to end through `slm-train train`: one round, trained on the kept episodes only', async (t) => {
  const root = t.testdir();
  const model = initModel({ preset: 'tiny', out: join(root, 'model'), seed: 3 }).dir;
  // Correct when the reply has an even length; the score disagrees with it (length mod 3, halved), so
  // keeping by the reward's total instead of its verdict would keep other episodes.
  writeFileSync(
    join(root, 'parity.mjs'),
    `export const reward = (ctx) => { const n = (ctx.episode?.messages?.at(-1)?.content ?? '').length; return { score: (n % 3) / 2, correct: n % 2 === 0 }; };\n`,
  );
  writeFileSync(
    join(root, 'questions.jsonl'),
    ['a', 'b', 'c', 'd'].map((id, i) => JSON.stringify({ id, question: `Question number ${i}?`, answer: 'x' })).join('\n') + '\n',
  );
  const file = join(root, 'rft.yaml');
  writeFileSync(
    file,
    `stage: rft\nmodel: { path: ${model} }\ndata: { questions: questions.jsonl, split: { train_fraction: 1 } }\nprotocol: { kind: direct, max_turns: 1, max_new_tokens: 8 }\nrollout: { k: 4, batch_questions: 2 }\nreward: { module: parity.mjs, parts: [{ kind: module }] }\nrft: { rounds: 1, epochs: 2 }\nlora: { r: 4, alpha: 8 }\noptim: { lr: 0.01 }\ntrain: { batch_size: 3 }\nrun: { dir: ${join(root, 'runs')} }\n`,
  );
  const r = await runCliAsync(['train', '--config', file, '--json'], { cwd: root });
  t.equal(r.code, 0, `slm-train train exits 0${r.code ? `\n${r.stderr.slice(-3000)}` : ''}`);
  const out = JSON.parse(r.stdout);
  const dir = join(root, 'runs', 'rft');
  t.match(out, { stage: 'rft', dir, adapter: join(dir, 'adapter') });
  t.ok(existsSync(join(dir, 'adapter', 'adapter_model.safetensors')), 'the adapter is written');
  t.match(r.stderr, /rft round 1: sampled 16 episodes of 4 questions, accuracy [\d.]+ %, kept \d+/);
  const jsonl = (f: string) =>
    readFileSync(f, 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));

  const traj = jsonl(join(dir, 'trajectories.jsonl'));
  t.equal(traj.length, 16, '4 questions x 4 samples, every one saved');
  const correct = (x: { messages: Array<{ content: string }> }) => x.messages.at(-1)!.content.length % 2 === 0;
  for (const [i, x] of traj.entries())
    t.equal(x.kept, correct(x) && x.response_tokens > 0, `episode ${i}: kept exactly when the reward marks it correct (${x.verdict})`);
  const kept = traj.filter((x) => x.kept);
  t.ok(kept.length > 0 && kept.length < traj.length, `a mix of kept and rejected episodes (${kept.length} of ${traj.length})`);

  const metrics = jsonl(join(dir, 'metrics.jsonl'));
  const sample = metrics.filter((m) => m.kind === 'rft_sample');
  t.equal(sample.length, 1, 'one sampling row for the round');
  t.match(sample[0], {
    stage: 'rft',
    round: 1,
    step: 0,
    questions: 4,
    episodes_sampled: 16,
    episodes_kept: kept.length,
    kept_per_question: kept.length / 4,
  });
  t.equal(sample[0].accuracy, traj.filter(correct).length / 16, 'accuracy of the samples');
  const steps = metrics.filter((m) => m.kind === undefined);
  t.equal(steps.length, 2 * Math.ceil(kept.length / 3), 'rft.epochs passes over batches of train.batch_size');
  t.same(
    steps.map((m) => m.step),
    steps.map((_, i) => i + 1),
  );
  t.ok(steps.every((m) => m.stage === 'rft' && m.round === 1 && Number.isFinite(m.loss) && m.loss > 0));
  t.equal(out.steps, steps.length);
  // The trained sequences are the kept episodes: their count, their lengths and their generated tokens.
  const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);
  t.equal(sum(steps.map((m) => m.sequences)), 2 * kept.length, 'every kept episode, once per epoch');
  t.equal(sum(steps.map((m) => m.sequence_tokens_mean * m.sequences)), 2 * sum(kept.map((x) => x.sequence_tokens)), 'their tokens');
  t.equal(sum(steps.map((m) => m.tokens_trained)), 2 * sum(kept.map((x) => x.response_tokens)), 'the loss on their generated tokens only');
  const state = JSON.parse(readFileSync(join(dir, 'checkpoints', `step-${steps.length}`, 'state.json'), 'utf8'));
  t.match(state, { step: steps.length, round: 1 }, 'a checkpoint at the end of the round');
  t.ok(existsSync(join(dir, 'report.html')), 'the run report is written');
});

t.test('stage: rft resumes after its last complete round exactly as an uninterrupted run', async (t) => {
  const root = t.testdir();
  const model = initModel({ preset: 'tiny', out: join(root, 'model'), seed: 3 }).dir;
  writeFileSync(
    join(root, 'parity.mjs'),
    `export const reward = (ctx) => { const n = (ctx.episode?.messages?.at(-1)?.content ?? '').length; return { score: n % 2 ? 0 : 1, correct: n % 2 === 0 }; };\n`,
  );
  writeFileSync(
    join(root, 'questions.jsonl'),
    ['a', 'b', 'c'].map((id, i) => JSON.stringify({ id, question: `Question ${i}?`, answer: 'x' })).join('\n') + '\n',
  );
  writeFileSync(
    join(root, 'rft.yaml'),
    `stage: rft\nmodel: { path: ${model} }\ndata: { questions: questions.jsonl, split: { train_fraction: 1 } }\nprotocol: { kind: direct, max_turns: 1, max_new_tokens: 6 }\nrollout: { k: 3, batch_questions: 3 }\nreward: { module: parity.mjs, parts: [{ kind: module }] }\nrft: { rounds: 2, questions_per_round: 2 }\nlora: { r: 4, alpha: 8, dropout: 0 }\noptim: { lr: 0.01 }\ntrain: { batch_size: 2 }\nrun: { dir: ${join(root, 'runs')} }\n`,
  );
  const cfg = (name: string) => loadConfig(join(root, 'rft.yaml'), [`run.name=${name}`]);
  const jsonl = (f: string) =>
    readFileSync(f, 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
  const a = await trainFromConfig(cfg('a'));
  const b1 = await trainFromConfig(cfg('b'), { stopAfter: 1 });
  t.equal(jsonl(join(b1.dir, 'metrics.jsonl')).filter((m) => m.kind === 'rft_sample').length, 1, 'stopped after round 1');
  // A kill in the middle of round 2: its sampling row and episodes were written, its checkpoint not.
  appendFileSync(join(b1.dir, 'metrics.jsonl'), JSON.stringify({ stage: 'rft', kind: 'rft_sample', step: b1.steps, round: 2 }) + '\n');
  appendFileSync(join(b1.dir, 'trajectories.jsonl'), JSON.stringify({ step: b1.steps + 1, round: 2, kept: true }) + '\n');
  const b = await trainFromConfig(cfg('b'), { resume: true });
  t.equal(b.steps, a.steps);
  const strip = (rows: Record<string, unknown>[]) =>
    rows.map(({ time, tokens_per_s, time_train_s, time_rollout_s, time_reward_s, ...r }) => r);
  const ma = strip(jsonl(join(a.dir, 'metrics.jsonl')));
  t.same(
    ma.filter((m) => m.kind === 'rft_sample').map((m) => m.round),
    [1, 2],
  );
  t.same(strip(jsonl(join(b.dir, 'metrics.jsonl'))), ma, 'the same rows, none left over from the interrupted round');
  const ta = jsonl(join(a.dir, 'trajectories.jsonl'));
  t.equal(ta.length, 2 * 2 * 3, '2 rounds x 2 questions x 3 samples');
  t.same(jsonl(join(b.dir, 'trajectories.jsonl')), ta, 'the same episodes sampled');
  t.same(
    readFileSync(join(b.dir, 'adapter', 'adapter_model.safetensors')),
    readFileSync(join(a.dir, 'adapter', 'adapter_model.safetensors')),
    'the same adapter',
  );
});
