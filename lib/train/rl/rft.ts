/**
 * RFT, rejection-sampling fine-tuning (expert iteration; STaR, Zelikman et al. 2022; RFT, Yuan et al.
 * 2023): the policy is its own teacher, and only its correct episodes teach. Each round:
 *   1. sample: rollout.k episodes per question of the round (every train question, or
 *      rft.questions_per_round of a seeded order) from the adapter as it is now, with the RL stages'
 *      rollouts (lib/train/rl/rl-loop.ts `rolloutRequests`: temperature and top-p drawn per episode,
 *      seeds from the round and the question's index) — timed as time_rollout_s;
 *   2. score every episode with the config's reward — time_reward_s;
 *   3. keep (`rftSelect`): the episodes the reward marks correct (its correctness verdict: em, subem,
 *      the judge, a module's `correct`), or with rft.min_reward those whose reward is >= it; never an
 *      excluded one (reward.on_failure: exclude) or one without a generated token; a question's
 *      identical episodes once (rft.unique); at most rft.max_per_question per question, highest
 *      reward first;
 *   4. fine-tune (`rftExamples`, lib/train/sft/sft.ts `sftStep`): rft.epochs passes of the SFT loss over
 *      the kept episodes in length-sorted batches of train.batch_size, the loss on the model's own
 *      tokens only (the episode's loss mask: never the prompt or the environment's replies), the
 *      learning-rate schedule run over each round's steps;
 *   5. log and checkpoint: one `kind: rft_sample` metrics row per round (episodes sampled and kept,
 *      kept per question, the samples' accuracy and reward), one row per optimizer step as SFT's (with
 *      its round), every sampled episode in trajectories.jsonl with `round` and `kept`, and a
 *      checkpoint at the end of every round: --resume continues after the last complete round.
 * The adapter trained is the one the stage starts from (model.adapter), else a fresh one.
 */
import { appendFileSync } from 'node:fs';
import { join } from 'node:path';
import type { LoraSpec } from '../../engine/adapter.js';
import type { Model } from '../../engine/model.js';
import { int, num, bool } from '../../config/schema-kit.js';
import type { ResolvedConfig } from '../../config/types.js';
import { SlmError } from '../../errors.js';
import { Progress, type ProgressTo } from '../../util/progress.js';
import { rolloutRequests, type StageSchedule } from './rl-loop.js';
import { mean, rolloutMetrics, trajectoryLine } from './rollout-metrics.js';
import { permutation, readRows, type RunFolder, type TrainState } from '../run.js';
import { learningRate, scheduleSpec } from '../schedule.js';
import type { AlgorithmDefinition, ConfigProblem } from './algorithm.js';
import { batchByLength, type SftExample } from '../sft/sft-data.js';
import { sftStep, type SftStepOptions } from '../sft/sft.js';
import type { RewardResult, RlDeps, RolloutRequest, TrainEpisode } from '../types.js';

/** Which sampled episodes a round trains on (rft.min_reward, rft.max_per_question, rft.unique). */
export interface RftKeepOptions {
  /** null: the episodes the reward marks correct; a number: those whose reward is >= it. */
  minReward: number | null;
  /** Kept episodes per question; 0 = no cap. */
  maxPerQuestion: number;
  /** A question's episodes with the same tokens are kept once. */
  unique: boolean;
}

/** Why an episode is or is not trained on. */
export type RftVerdict = 'kept' | 'rejected' | 'excluded' | 'empty' | 'duplicate' | 'capped';

/**
 * The round's selection: per episode (`k` consecutive episodes per question, as the rollouts are
 * requested) whether it is trained on and why. With minReward null a reward must give a correctness
 * verdict: a batch of rewards none of which does stops with CONFIG_INVALID (set rft.min_reward).
 */
export function rftSelect(
  episodes: readonly TrainEpisode[],
  rewards: readonly RewardResult[],
  k: number,
  opts: RftKeepOptions,
): { keep: boolean[]; verdicts: RftVerdict[] } {
  if (episodes.length !== rewards.length)
    throw new SlmError('ARGUMENT_INVALID', `rftSelect: ${episodes.length} episodes but ${rewards.length} rewards.`);
  if (!Number.isInteger(k) || k < 1 || episodes.length % k)
    throw new SlmError(
      'ARGUMENT_INVALID',
      `rftSelect: expected groups of k = ${k} episodes per question, found ${episodes.length} episodes.`,
    );
  if (opts.minReward === null && rewards.length && rewards.every((r) => r.correct === undefined))
    throw new SlmError(
      'CONFIG_INVALID',
      "rft.min_reward is null, which keeps the episodes the reward marks correct, but the reward gives no correctness verdict (none of its parts is em, subem or a judge's, and reward.module returns no `correct`). Add such a part, return {score, correct} from the module, or set rft.min_reward to the reward an episode must reach.",
      { path: 'rft.min_reward' },
    );
  const verdicts: RftVerdict[] = episodes.map((episode, i) => {
    const r = rewards[i];
    if (r.excluded) return 'excluded';
    if (!episode.lossMask.some((x) => x)) return 'empty';
    const pass = opts.minReward === null ? r.correct === true : Number.isFinite(r.total) && r.total >= opts.minReward;
    return pass ? 'kept' : 'rejected';
  });
  for (let g = 0; g < episodes.length; g += k) {
    // A question's passing episodes, the highest reward first (ties: in sampling order).
    const idx = Array.from({ length: k }, (_, j) => g + j)
      .filter((i) => verdicts[i] === 'kept')
      .sort((a, b) => rewards[b].total - rewards[a].total || a - b);
    const seen = new Set<string>();
    let n = 0;
    for (const i of idx) {
      const ids = episodes[i].ids;
      const key = Buffer.from(ids.buffer, ids.byteOffset, ids.byteLength).toString('base64');
      if (opts.unique && seen.has(key)) verdicts[i] = 'duplicate';
      else if (opts.maxPerQuestion > 0 && n >= opts.maxPerQuestion) verdicts[i] = 'capped';
      else {
        seen.add(key);
        n++;
      }
    }
  }
  return { keep: verdicts.map((v) => v === 'kept'), verdicts };
}

/**
 * The fine-tuning data of a round: the kept episodes' tokens, with the loss mask on the model's own
 * tokens (the episode's loss mask: 1 on generated tokens, 0 on the prompt and the environment's
 * replies). `row` is the episode's index in the round.
 */
export function rftExamples(episodes: readonly TrainEpisode[], keep: readonly boolean[]): SftExample[] {
  return episodes.flatMap((e, i) =>
    keep[i] ? [{ ids: Array.from(e.ids), mask: Array.from(e.lossMask, (x) => (x ? 1 : 0)), row: i }] : [],
  );
}

/**
 * The questions (indices into the train questions) of round `round`: all of them in order, or the
 * next `perRound` of a seeded order that continues across rounds as epochs do.
 */
export function roundQuestions(n: number, perRound: number | null, seed: number, round: number): number[] {
  if (perRound === null) return Array.from({ length: n }, (_, i) => i);
  const orders = new Map<number, number[]>();
  return Array.from({ length: perRound }, (_, i) => {
    const at = round * perRound + i;
    const epoch = Math.floor(at / n);
    if (!orders.has(epoch)) orders.set(epoch, permutation(n, seed, epoch));
    return orders.get(epoch)![at % n];
  });
}

export interface RftOptions extends SftStepOptions {
  lora: LoraSpec;
  /** Episodes sampled per question (rollout.k). */
  k: number;
  rounds: number;
  /** Passes of the SFT loss over a round's kept episodes. */
  epochs: number;
  keep: RftKeepOptions;
  /** Questions per round; null = all. */
  questionsPerRound: number | null;
  /** Questions per rollout call (rollout.batch_questions). */
  questionsPerBatch: number;
  /** Sequences per optimizer step (train.batch_size). */
  batchSize: number;
  temperature: number | [number, number];
  topP?: number | [number, number];
  /** The learning rate within a round (its length defaults to the round's steps). */
  schedule: StageSchedule;
  /** Train the adapter already on the model (e.g. the SFT result) instead of a fresh one. */
  keepAdapter?: boolean;
  resume?: boolean;
  /** Stop after this many rounds in this process (tests of resume). */
  stopAfter?: number;
  /** Called after each optimizer step's metrics row. */
  onStep?: (row: Record<string, unknown>) => void | Promise<void>;
  /** One line per round (sampled, kept, accuracy). */
  log?: (line: string) => void;
  progress?: ProgressTo;
}

/** The RFT options of a resolved config (rollout, rft, train and optim sections); the trainer's own come from the caller. */
export function rftOptionsFrom(
  cfg: ResolvedConfig,
): Pick<
  RftOptions,
  'k' | 'rounds' | 'epochs' | 'keep' | 'questionsPerRound' | 'questionsPerBatch' | 'batchSize' | 'temperature' | 'topP' | 'schedule'
> {
  const r = cfg.rft;
  return {
    k: cfg.rollout.k,
    rounds: r.rounds,
    epochs: r.epochs,
    keep: { minReward: r.min_reward, maxPerQuestion: r.max_per_question, unique: r.unique },
    questionsPerRound: r.questions_per_round,
    questionsPerBatch: cfg.rollout.batch_questions,
    batchSize: cfg.train.batch_size,
    temperature: cfg.rollout.temperature,
    topP: cfg.rollout.top_p,
    schedule: scheduleSpec(cfg),
  };
}

/** On resume: the rows of a round that did not complete (logged after its checkpoint) are dropped. */
function dropUnfinished(run: RunFolder, rounds: number): void {
  for (const name of ['metrics.jsonl', 'trajectories.jsonl']) {
    const rows = readRows(join(run.dir, name));
    const keep = rows.filter((r) => typeof r.round !== 'number' || r.round <= rounds);
    if (keep.length !== rows.length) run.writeText(name, keep.map((r) => JSON.stringify(r)).join('\n') + (keep.length ? '\n' : ''));
  }
}

const since = (t: number) => (performance.now() - t) / 1e3;

/** Runs `o.rounds` rounds of sample -> keep -> fine-tune (or `o.stopAfter` of them). */
export async function runRft<Q>(
  model: Model,
  questions: Q[],
  run: RunFolder,
  deps: RlDeps<Q>,
  opts: RftOptions,
): Promise<{ steps: number; rounds: number; meanReward: number[]; lastLoss: number }> {
  if (!Number.isInteger(opts.k) || opts.k < 1)
    throw new SlmError('CONFIG_INVALID', `RFT samples rollout.k episodes per question: expected an integer >= 1, found ${opts.k}.`, {
      path: 'rollout.k',
    });
  if (!questions.length) throw new SlmError('DATA_INVALID', 'RFT has no train questions to sample.');
  let state: TrainState;
  if (opts.resume) {
    state = await run.restore(model);
    state.round = typeof state.round === 'number' ? state.round : 0;
    dropUnfinished(run, state.round as number);
  } else {
    if (!(opts.keepAdapter && model.lora !== undefined)) model.attachLora(opts.lora, opts.seed);
    state = { step: 0, epoch: 0, batchInEpoch: 0, seed: opts.seed, round: 0 };
  }
  const meanReward: number[] = [];
  let lastLoss = NaN;
  let ranHere = 0;
  const bar = new Progress('rft', opts.rounds, 'rounds', opts.progress, state.round as number);
  try {
    for (let round = state.round as number; round < opts.rounds; round++) {
      if (opts.stopAfter !== undefined && ranHere >= opts.stopAfter) break;
      // 1-2. sample and score, rollout.batch_questions questions at a time
      const qi = roundQuestions(questions.length, opts.questionsPerRound, opts.seed, round);
      const requests: RolloutRequest<Q>[] = [];
      const episodes: TrainEpisode[] = [];
      const rewards: RewardResult[] = [];
      let tRollout = 0;
      let tReward = 0;
      for (let b = 0; b < qi.length; b += opts.questionsPerBatch) {
        const reqs = rolloutRequests(
          qi.slice(b, b + opts.questionsPerBatch).map((i) => questions[i]),
          b,
          opts.k,
          round,
          opts,
        );
        const t0 = performance.now();
        const eps = await deps.rollout(reqs, (done, _total) =>
          bar.set({ detail: `round ${round + 1}: rollouts ${episodes.length + done}/${qi.length * opts.k}` }),
        );
        if (eps.length !== reqs.length)
          throw new SlmError('ARGUMENT_INVALID', `rollout returned ${eps.length} episodes for ${reqs.length} requests.`);
        tRollout += since(t0);
        const t1 = performance.now();
        rewards.push(...(await Promise.all(eps.map((e, i) => deps.reward(e, reqs[i].question)))));
        tReward += since(t1);
        requests.push(...reqs);
        episodes.push(...eps);
      }
      // 3. keep
      const sel = rftSelect(episodes, rewards, opts.k, opts.keep);
      const examples = rftExamples(episodes, sel.keep);
      const count = (v: RftVerdict) => sel.verdicts.filter((x) => x === v).length;
      const perQuestion = qi.map((_, q) => sel.keep.slice(q * opts.k, (q + 1) * opts.k).filter(Boolean).length);
      const lines = episodes.map((e, i) =>
        trajectoryLine(state.step + 1, requests[i].question, e, rewards[i], {
          round: round + 1,
          correct: rewards[i].correct,
          kept: sel.keep[i],
          verdict: sel.verdicts[i],
          sequence_tokens: e.ids.length,
          response_tokens: e.lossMask.reduce((a, x) => a + (x ? 1 : 0), 0),
        }),
      );
      appendFileSync(join(run.dir, 'trajectories.jsonl'), lines.join('\n') + '\n');
      const sample: Record<string, unknown> = {
        stage: 'rft',
        kind: 'rft_sample',
        step: state.step,
        round: round + 1,
        questions: qi.length,
        episodes_sampled: episodes.length,
        episodes_kept: examples.length,
        kept_per_question: mean(perQuestion),
        questions_with_kept: mean(perQuestion.map((n) => (n > 0 ? 1 : 0))),
        episodes_rejected: count('rejected'),
        episodes_duplicate: count('duplicate'),
        episodes_capped: count('capped'),
        episodes_excluded: count('excluded'),
        kept_tokens: examples.reduce((a, e) => a + e.mask.reduce((x, m) => x + m, 0), 0),
        ...rolloutMetrics(episodes, rewards),
        time_rollout_s: tRollout,
        time_reward_s: tReward,
      };
      run.logMetrics(sample);
      meanReward.push(mean(rewards.map((r) => r.total)));
      const acc = sample.accuracy as number | undefined;
      opts.log?.(
        `rft round ${round + 1}: sampled ${episodes.length} episodes of ${qi.length} questions${acc !== undefined ? `, accuracy ${(100 * acc).toFixed(1)} %` : ''}, kept ${examples.length} (${(100 * (sample.questions_with_kept as number)).toFixed(1)} % of the questions have one)`,
      );
      // 4. fine-tune on the kept episodes
      if (examples.length) {
        const batches = batchByLength(examples, opts.batchSize);
        const schedule = { ...opts.schedule, totalSteps: opts.schedule.totalSteps ?? batches.length * opts.epochs };
        let i = 0;
        for (let epoch = 0; epoch < opts.epochs; epoch++)
          for (const b of permutation(batches.length, opts.seed + round, epoch)) {
            bar.set({ detail: `round ${round + 1}: train ${i + 1}/${batches.length * opts.epochs} (${examples.length} episodes)` });
            const { loss, row } = await sftStep(
              model,
              batches[b],
              { stage: 'rft', step: state.step, epoch, lr: learningRate(schedule, i++) },
              opts,
            );
            lastLoss = loss;
            state = { ...state, step: state.step + 1 };
            const full = { stage: 'rft', step: state.step, round: round + 1, ...row };
            run.logMetrics(full);
            await opts.onStep?.(full);
          }
      } else opts.log?.(`rft round ${round + 1}: no episode kept; nothing to train on this round`);
      // 5. checkpoint: the round is complete
      state = { ...state, epoch: round + 1, batchInEpoch: 0, round: round + 1 };
      await run.saveCheckpoint(model, state);
      bar.update(round + 1, { reward: meanReward.at(-1), accuracy: acc, detail: `kept ${examples.length}/${episodes.length}` });
      ranHere++;
    }
  } finally {
    bar.stop();
  }
  return { steps: state.step, rounds: state.round as number, meanReward, lastLoss };
}

/** RFT in the registry (lib/train/rl/registry.ts): its own section `rft`; no KL, no group, one process. */
export const rft: AlgorithmDefinition = {
  name: 'rft',
  summary:
    'RFT (rejection-sampling fine-tuning): rounds of sampling from the adapter, keeping the correct episodes and fine-tuning on them with the SFT loss',
  section: {
    rounds: int(
      1,
      { minimum: 1 },
      'rft: rounds of sample (rollout.k episodes per question from the current adapter) -> keep the correct ones -> fine-tune on them',
    ),
    min_reward: num(
      null,
      {},
      "rft: null = keep the episodes the reward marks correct (the correctness verdict of em, subem, the judge or a module's `correct`); a number = keep those whose reward is >= it",
    ),
    epochs: int(1, { minimum: 1 }, "rft: passes of the SFT loss over each round's kept episodes"),
    max_per_question: int(
      0,
      { minimum: 0 },
      'rft: at most this many kept episodes per question and round (the highest rewards first); 0 = no cap',
    ),
    unique: bool(true, "rft: a question's kept episodes with the same tokens count once"),
    questions_per_round: int(
      null,
      { minimum: 1 },
      'rft: train questions sampled per round, the next of a seeded order (as epochs); null = every train question',
    ),
  },
  minGroupSize: 1,
  groupBaseline: false,
  lossNorms: ['token', 'sequence', 'turn'],
  kl: { defaultIn: 'loss' },
  validate(cfg) {
    const p: ConfigProblem[] = [];
    if (cfg.train.steps !== null)
      p.push({
        path: ['train', 'steps'],
        message: `the rft stage runs rft.rounds rounds of rft.epochs passes over each round's kept episodes; leave train.steps out (null), found ${cfg.train.steps}`,
      });
    if (cfg.distributed.nproc > 1 || cfg.distributed.nnodes > 1)
      p.push({
        path: ['distributed', 'nproc'],
        message: 'the rft stage runs in one process; set distributed.nproc and distributed.nnodes to 1',
      });
    if (cfg.rft.min_reward !== null && !Number.isFinite(cfg.rft.min_reward))
      p.push({ path: ['rft', 'min_reward'], message: `expected a finite number or null, found ${String(cfg.rft.min_reward)}` });
    return p;
  },
  oldLogprobs: false,
  train(r) {
    if (r.loop.shard)
      throw new SlmError(
        'CONFIG_INVALID',
        'stage: rft runs in one process; run it without --nproc (distributed.nproc and distributed.nnodes 1).',
        { path: 'distributed.nproc' },
      );
    return runRft(r.model, r.questions, r.run, r.deps, { ...(r.loop as unknown as RftOptions), ...rftOptionsFrom(r.cfg), log: r.log });
  },
};
