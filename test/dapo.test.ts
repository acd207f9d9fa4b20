// DAPO's over-long rules and dynamic sampling (issue 34): the penalty against the DAPO paper's
// formula computed here independently, the filter and the spread test on hand-made steps, and the RL
// loop's draws (which questions, how many, the data position after them, the bound) with a fake
// model, rollout and reward.
import t, { type Test } from 'tap';
import { join } from 'node:path';
import { existsSync, readFileSync } from 'node:fs';
import { configFromObject } from '../lib/config/index.js';
import type { Model } from '../lib/engine/model.js';
import { dapoOptionsFrom, episodeLength, groupsWithSpread, overlongPenalty, shapeOverlong } from '../lib/train/rl/dapo.js';
import type { Shard } from '../lib/distributed/run.js';
import { runRl, type RlAlgorithm } from '../lib/train/rl/rl-loop.js';
import { permutation, RunFolder } from '../lib/train/run.js';
import type { RewardResult, TrainEpisode } from '../lib/train/types.js';

/**
 * The DAPO paper's soft over-long punishment (eq. 13), written from the paper, factor 1:
 * 0 for |y| <= Lmax - Lcache; ((Lmax - Lcache) - |y|) / Lcache for Lmax - Lcache < |y| <= Lmax; -1 beyond.
 */
function dapoPaper(len: number, lMax: number, lCache: number): number {
  if (len <= lMax - lCache) return 0;
  if (len <= lMax) return (lMax - lCache - len) / lCache;
  return -1;
}

t.test("the soft over-length penalty is the DAPO paper's, scaled by the factor", async (t) => {
  for (const len of [0, 100, 399, 400, 401, 425, 450, 499, 500]) {
    t.ok(
      Math.abs(overlongPenalty(len, 500, 100, 1) - dapoPaper(len, 500, 100)) < 1e-12,
      `length ${len}: ${overlongPenalty(len, 500, 100, 1)} = ${dapoPaper(len, 500, 100)}`,
    );
    t.ok(Math.abs(overlongPenalty(len, 500, 100, 0.5) - 0.5 * dapoPaper(len, 500, 100)) < 1e-12, `factor 0.5, length ${len}`);
  }
  t.equal(overlongPenalty(450, 500, 100, 1), -0.5, '50 tokens into a 100-token buffer: -0.5');
  t.equal(overlongPenalty(500, 500, 0, 1), 0, 'buffer 0: off');
  t.throws(() => overlongPenalty(10, 5, 8, 1), { code: 'ARGUMENT_INVALID' });
});

/** An episode whose turns sampled `turns` tokens each, ended as `finish`, the last turn stopping as `last`. */
function ep(turns: number[], finish = 'answer', last = 'stop_token'): TrainEpisode {
  const steps = turns.map((n, i) => ({
    turn: i + 1,
    generatedTokens: n - 1,
    droppedTokens: 1,
    finishReason: i === turns.length - 1 ? last : 'stop_string',
  }));
  return {
    ids: new Int32Array(4),
    lossMask: new Uint8Array(4),
    logprobs: new Float32Array(4),
    temperature: 1,
    answer: 'a',
    turns: turns.length,
    record: { finish, steps },
  };
}
const rw = (total: number, extra: Partial<RewardResult> = {}): RewardResult => ({ total, parts: { em: total }, ...extra });

t.test('episodeLength: the longest turn (kept + dropped tokens) and truncation from the turn records', async (t) => {
  t.same(episodeLength(ep([30, 120, 50])), { truncated: false, longestTurn: 120 });
  t.same(episodeLength(ep([30, 500], 'max_turns', 'length')), { truncated: true, longestTurn: 500 }, 'a turn stopped at the token limit');
  t.same(episodeLength(ep([30], 'context')), { truncated: true, longestTurn: 30 }, 'the conversation reached the context limit');
  t.same(episodeLength({ record: undefined }), { truncated: false, longestTurn: 0 }, 'no records: nothing known');
});

t.test('shapeOverlong: penalty added and recorded, truncated episodes excluded with the filter, inputs untouched', async (t) => {
  const eps = [ep([100]), ep([450]), ep([500], 'max_turns', 'length'), ep([20], 'context')];
  const rewards = [rw(1), rw(1), rw(0), rw(0, { excluded: true })];
  const copy = structuredClone(rewards);
  const o = { filter: true, buffer: 100, penaltyFactor: 1, maxNewTokens: 500 };
  const s = shapeOverlong(eps, rewards, o);
  t.same(
    s.rewards.map((r) => [r.total, r.parts.overlong_penalty, r.excluded === true]),
    [
      [1, undefined, false],
      [0.5, -0.5, false],
      [-1, -1, true],
      [0, undefined, true],
    ],
  );
  t.same([s.truncated, s.filtered, s.penalized], [2, 1, 2], 'two truncated, one newly excluded (the other was already), two penalised');
  t.same(rewards, copy, 'the scored rewards are not changed in place');
  const noFilter = shapeOverlong(eps, rewards, { ...o, filter: false, buffer: 0 });
  t.same(noFilter.rewards, rewards, 'filter off and buffer 0: the rewards as scored');
  t.throws(() => shapeOverlong(eps, rewards.slice(1), o), { code: 'ARGUMENT_INVALID' });
});

t.test('groupsWithSpread: max > min among the members left in', async (t) => {
  t.same(groupsWithSpread([rw(1), rw(1), rw(0), rw(1), rw(0), rw(0), rw(1), rw(0, { excluded: true })], 2), [false, true, false, false]);
  t.throws(() => groupsWithSpread([rw(1)], 2), { code: 'ARGUMENT_INVALID' });
});

t.test('dapoOptionsFrom: the config keys reach the loop options (off by default)', async (t) => {
  const base = { stage: 'grpo', model: { path: '/m' }, data: { questions: '/q', corpus: '/c' } };
  t.same(dapoOptionsFrom(configFromObject(base)), {}, 'nothing by default');
  const c = configFromObject({
    ...base,
    protocol: { max_new_tokens: 300 },
    algorithm: { overlong: { filter: true, buffer: 60, penalty_factor: 0.7 } },
    rollout: { dynamic_sampling: { enabled: true, max_draws: 5 } },
  });
  t.same(dapoOptionsFrom(c), {
    overlong: { filter: true, buffer: 60, penaltyFactor: 0.7, maxNewTokens: 300 },
    dynamicSampling: { maxDraws: 5 },
  });
  t.throws(() => configFromObject({ ...base, protocol: { max_new_tokens: 50 }, algorithm: { overlong: { buffer: 50 } } }), {
    code: 'CONFIG_INVALID',
    message: /algorithm\.overlong\.buffer: .*expected fewer, found 50/,
  });
  t.throws(() => configFromObject({ ...base, stage: 'ppo', rollout: { dynamic_sampling: { enabled: true } } }), {
    code: 'CONFIG_INVALID',
    message: /GRPO and RLOO only, found stage ppo/,
  });
  t.throws(() => configFromObject({ ...base, rollout: { dynamic_sampling: { enabled: true, max_draws: 0 } } }), {
    code: 'CONFIG_INVALID',
    message: /max_draws/,
  });
  t.same(
    dapoOptionsFrom(configFromObject({ ...base, distributed: { nproc: 2 }, rollout: { dynamic_sampling: { enabled: true } } })),
    { dynamicSampling: { maxDraws: 4 } },
    'data-parallel ranks take it too',
  );
});

/**
 * runRl with a fake model and algorithm: questions are numbers; a question's group has a spread of
 * rewards when `spread(q)`; every step's groups (questions, in order) and metrics row are recorded.
 */
async function fakeRun(
  t: Test,
  o: {
    questions: number;
    perStep: number;
    steps: number;
    maxDraws?: number;
    spread: (q: number) => boolean;
    overlong?: boolean;
    shard?: Shard;
    dir?: string;
  },
) {
  const dir = o.dir ?? t.testdir();
  const run = new RunFolder(join(dir, `run${o.shard ? `-${o.shard.rank}` : ''}`));
  const k = 2;
  const model = { lora: undefined, clearReferenceAdapter() {}, attachLora() {} } as unknown as Model;
  const seen: number[][] = [];
  const rows: Record<string, unknown>[] = [];
  const algo: RlAlgorithm<number, null, null> = {
    name: 'fake',
    groupSize: k,
    advantages: async (s) => (seen.push(s.requests.filter((_, i) => i % k === 0).map((r) => r.question)), null),
    trained: () => 0,
    update: async () => null,
    trajectory: () => ({}),
    share: () => null,
    row: () => ({ head: {}, body: {} }),
  };
  const questions = Array.from({ length: o.questions }, (_, i) => i);
  const rollout = async (reqs: Array<{ question: number }>) =>
    reqs.map((r) => ep([r.question % 3 === 0 ? 500 : 10], 'max_turns', r.question % 3 === 0 ? 'length' : 'stop_token'));
  let calls = 0;
  const reward = async (_e: TrainEpisode, q: number) => rw(o.spread(q) ? calls++ % 2 : 1);
  await runRl(model, questions, run, { rollout, reward }, algo, {
    lora: { r: 2, alpha: 4, dropout: 0, rslora: false, targets: ['q_proj'] },
    questionsPerStep: o.perStep,
    steps: o.steps + 1,
    stopAfter: o.steps,
    temperature: 1,
    seed: 3,
    onStep: (row) => void rows.push(row),
    ...(o.maxDraws ? { dynamicSampling: { maxDraws: o.maxDraws } } : {}),
    ...(o.overlong ? { overlong: { filter: true, buffer: 100, penaltyFactor: 1, maxNewTokens: 500 } } : {}),
    ...(o.shard ? { shard: o.shard } : {}),
  });
  const file = join(run.dir, 'trajectories.jsonl');
  const traj = existsSync(file)
    ? readFileSync(file, 'utf8')
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l))
    : [];
  return { seen, rows, traj };
}

t.test(
  'dynamic sampling: flat groups dropped, more questions drawn until the step is full, the data position moved past every draw',
  async (t) => {
    // 12 questions, 2 per step (6 batches per epoch), odd questions have a spread.
    const spread = (q: number) => q % 2 === 1;
    const r = await fakeRun(t, { questions: 12, perStep: 2, steps: 2, maxDraws: 6, spread });
    const order = permutation(12, 3, 0);
    // Expected independently: walk the epoch's order two questions at a time, keeping the odd ones.
    const expected: number[][] = [];
    let pos = 0;
    const draws: number[] = [];
    for (let step = 0; step < 2; step++) {
      const kept: number[] = [];
      let n = 0;
      while (kept.length < 2 && n < 6) {
        for (const q of order.slice(pos, pos + 2)) if (spread(q) && kept.length < 2) kept.push(q);
        pos += 2;
        n++;
      }
      expected.push(kept);
      draws.push(n);
    }
    t.same(r.seen, expected, `steps train on ${JSON.stringify(expected)}`);
    t.same(
      r.rows.map((x) => x.dynamic_draws),
      draws,
      'draws per step',
    );
    t.same(
      r.rows.map((x) => x.groups_trained_on),
      [2, 2],
    );
    t.ok(r.rows.every((x) => (x.groups_with_spread as number) >= 2 && (x.groups_drawn as number) === 2 * (x.dynamic_draws as number)));
    t.equal(r.traj.length, 2 * 2 * 2, 'the trajectories hold the episodes trained on');
  },
);

/** `world` ranks in one process: allGather resolves when every rank has given its value for that call. */
function memoryShards(world: number): Shard[] {
  const rounds = new Map<number, { values: unknown[]; given: number; done: Array<(v: unknown[]) => void> }>();
  const calls = Array.from({ length: world }, () => 0);
  return Array.from({ length: world }, (_, rank) => ({
    rank,
    world,
    allGather<T>(value: T): Promise<T[]> {
      const i = calls[rank]++;
      const r = rounds.get(i) ?? { values: [], given: 0, done: [] };
      rounds.set(i, r);
      r.values[rank] = structuredClone(value);
      r.given++;
      return new Promise<T[]>((res) => {
        r.done.push(res as (v: unknown[]) => void);
        if (r.given === world) r.done.forEach((f) => f(r.values.slice()));
      });
    },
  }));
}

t.test('dynamic sampling over two data-parallel ranks keeps the groups one process keeps, with the same metrics', async (t) => {
  // 16 questions, 4 per step: each draw gives each rank 2 questions; a question has a spread when q % 3 === 1.
  const spread = (q: number) => q % 3 === 1;
  const o = { questions: 16, perStep: 4, steps: 3, maxDraws: 4, spread };
  const dir = t.testdir();
  const one = await fakeRun(t, { ...o, dir: join(dir, 'one') });
  const [a, b] = memoryShards(2);
  const [r0, r1] = await Promise.all([fakeRun(t, { ...o, shard: a, dir }), fakeRun(t, { ...o, shard: b, dir })]);
  // The same groups (the batch is in rank order, one process's in draw order: the update sums over groups).
  const sorted = (xs: number[]) => xs.slice().sort((x, y) => x - y);
  const both = r0.seen.map((s, i) => sorted([...s, ...r1.seen[i]]));
  t.same(both, one.seen.map(sorted), `rank 0's groups and rank 1's = one process's: ${JSON.stringify(one.seen)}`);
  t.ok(
    one.seen.some((s) => s.length > 0) && r0.seen.some((s, i) => s.length !== r1.seen[i].length),
    'the ranks keep unequal shares in some step (the case a per-rank rule gets wrong)',
  );
  const keys = ['dynamic_draws', 'groups_drawn', 'groups_with_spread', 'groups_trained_on', 'reward_mean_drawn'] as const;
  const pick = (rows: Record<string, unknown>[]) => rows.map((r) => keys.map((k) => r[k]));
  t.same(pick(r0.rows), pick(one.rows), 'rank 0 reports the global metrics');
  t.same(pick(r1.rows), pick(one.rows), 'and so does rank 1');
  t.equal(r0.traj.length, one.traj.length, "rank 0's trajectories hold every rank's kept episodes");
});

t.test('dynamic sampling stops after max_draws and trains on the groups it has', async (t) => {
  const r = await fakeRun(t, { questions: 12, perStep: 2, steps: 1, maxDraws: 3, spread: () => false });
  t.same(r.seen, [[]], 'no group with a spread: nothing to train on');
  t.same(r.traj, [], 'and no trajectory line (not an empty one)');
  t.match(r.rows[0], { dynamic_draws: 3, groups_drawn: 6, groups_with_spread: 0, groups_trained_on: 0 });
});

t.test('without dynamic sampling a step is one batch, as before', async (t) => {
  const r = await fakeRun(t, { questions: 12, perStep: 2, steps: 2, spread: (q) => q % 2 === 1 });
  const order = permutation(12, 3, 0);
  t.same(r.seen, [order.slice(0, 2), order.slice(2, 4)]);
  t.notOk('dynamic_draws' in r.rows[0]);
});

t.test('the loop applies the over-long rules before the algorithm sees the rewards', async (t) => {
  const r = await fakeRun(t, { questions: 6, perStep: 3, steps: 1, spread: () => false, overlong: true });
  // Questions divisible by 3 ran 500 tokens into a 100-token buffer, stopped by the limit.
  for (const x of r.traj) {
    const long = x.question % 3 === 0;
    t.equal(x.reward, long ? 0 : 1, `question ${x.question}: reward ${x.reward}`);
    t.equal(x.parts.overlong_penalty, long ? -1 : undefined);
  }
  const n = r.traj.filter((x) => x.question % 3 === 0).length;
  t.match(r.rows[0], { episodes_truncated: n, episodes_overlong_filtered: n, episodes_overlong_penalized: n });
});
