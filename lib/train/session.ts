/**
 * From a resolved config to a running stage: the run folder, the policy, the stage (lib/train/
 * stages.ts: SFT, GRPO, RLOO, PPO or RFT) with its data (data.ts) and environment (environment.ts), evaluation
 * during training (evaluation.ts), the adapter and the report. The CLI's `train` command is a thin
 * wrapper over `trainFromConfig` (and `eval` over evaluation.ts `evalFromConfig`).
 */
import { existsSync, readdirSync } from 'node:fs';
import { basename, join } from 'node:path';
import type { ResolvedConfig } from '../config/types.js';
import { runDir, writeResolvedConfig } from '../config/load.js';
import { RankRunFolder, joinFromConfig, makeDataParallel, type Distributed } from '../distributed/run.js';
import { SlmError } from '../errors.js';
import type { CustomRewardFn, CustomTools } from '../extensions.js';
import type { RewardDeps } from '../rewards/combine.js';
import type { ProgressTo } from '../util/progress.js';
import { evalView, questionSplits, type Question } from './data.js';
import { loadAgent, openEnvironment, required, rewardDeps, type Environment, type Log } from './environment.js';
import { evalQuestions, evaluate } from './evaluation.js';
import { writeReport } from './report/report.js';
import { RunFolder } from './run.js';
import { openTrackers } from './report/tracking.js';
import { rlStage, sftStage, trainerOptions, type StageRun, type TrainResult } from './stages.js';

export interface StageOptions {
  resume?: boolean;
  log?: Log;
  /** Overrides as given on the command line (recorded in the resolved config). */
  overrides?: readonly string[];
  configFile?: string;
  /** Stop after this many optimizer steps in this process (tests of resume). */
  stopAfter?: number;
  /** --resume onto a learning-rate schedule other than the checkpoint's (else RESUME_SCHEDULE_CHANGED). */
  allowScheduleChange?: boolean;
  /**
   * Stops training at the end of the step during which it is aborted (before that step's checkpoint):
   * the call rejects with the signal's reason (an AbortError unless given one). The newest checkpoint
   * stays, so `resume: true` continues from it.
   */
  signal?: AbortSignal;
  /** Each training step's metrics row (the row metrics.jsonl gets, without its time), as it is logged; awaited. */
  onStep?: (row: StepMetrics) => void | Promise<void>;
  /** Progress bars of indexing, training steps and evaluations (the CLI: stderr); default none. */
  progress?: ProgressTo;
  /** A reward function (the part `module`) in place of reward.module's. */
  reward?: CustomRewardFn;
  /** Extra functions programs can call, in place of sandbox.tools_module's. */
  tools?: CustomTools;
}

/** A training step's metrics row: `step`, `stage` and the stage's own metrics (loss, lr, reward_mean, ...). */
export type StepMetrics = { step: number; stage?: string } & Record<string, unknown>;

/**
 * Runs the stage of the config; as one rank of a data-parallel job when WORLD_SIZE > 1 (set by
 * `slm-train train --nproc N` or torchrun; lib/distributed): rank 0 writes the run folder.
 */
export async function trainFromConfig(cfg: ResolvedConfig, opts: StageOptions = {}): Promise<TrainResult> {
  opts.signal?.throwIfAborted();
  const dist = await joinFromConfig(cfg, opts.log ?? (() => {}));
  if (!dist) return trainStage(cfg, opts, null);
  try {
    return await trainStage(dist.cfg, opts, dist);
  } finally {
    await dist.group.close();
  }
}

async function trainStage(cfg: ResolvedConfig, opts: StageOptions, dist: Distributed | null): Promise<TrainResult> {
  const log = opts.log ?? (() => {});
  const lead = !dist || dist.shard.rank === 0;
  const stage = cfg.stage;
  if (stage === 'eval')
    throw new SlmError('CONFIG_INVALID', 'stage: eval has nothing to train; run `slm-train eval --config FILE` instead.', {
      path: 'stage',
    });
  const dir = runDir(cfg);
  if (
    !opts.resume &&
    lead &&
    existsSync(join(dir, 'checkpoints')) &&
    readdirSync(join(dir, 'checkpoints')).some((d) => /^step-\d+$/.test(d))
  )
    throw new SlmError(
      'RUN_EXISTS',
      `${dir} already holds checkpoints of a run. Continue it with --resume, or choose another run.name (or delete the folder).`,
    );
  const run = lead ? new RunFolder(dir) : new RankRunFolder(dir, dist!.shard.rank);
  run.log = log;
  if (lead) writeResolvedConfig(cfg, dir, { file: opts.configFile, overrides: opts.overrides });
  // log.report_to: TensorBoard event files (RunFolder), MLflow's run opened before anything loads.
  run.tensorboardEnabled = cfg.log.report_to.includes('tensorboard');
  if (lead) run.trackers = await openTrackers(cfg, dir, { resume: opts.resume, log, runName: basename(dir) });
  let finished = false;
  const agent = await loadAgent(cfg, cfg.model.adapter, log).catch(async (e) => {
    await run.finishTracking('FAILED');
    throw e;
  });
  if (dist) makeDataParallel(agent.model, dist);
  let env: Environment | undefined;
  let judge: { deps: RewardDeps; close(): void } | undefined;
  // train.eval_every: evaluate the model as it trains (adapter in place) on the eval split.
  let evalEnv: Environment | undefined;
  let evalQs: Question[] | undefined;
  const onStep = async (row: Record<string, unknown>) => {
    if (!lead) return opts.signal?.throwIfAborted();
    log(stepLine(row));
    await opts.onStep?.(row as StepMetrics);
    opts.signal?.throwIfAborted();
    const every = cfg.train.eval_every;
    if (!every || typeof row.step !== 'number' || row.step % every !== 0 || row.kind === 'eval') return;
    if (!cfg.data.questions) return log('train.eval_every: data.questions is not set; no evaluation during training');
    evalQs ??= await evalQuestions(evalView(cfg));
    const e = env ?? (evalEnv ??= await openEnvironment(cfg, log, opts.progress, opts));
    judge ??= await rewardDeps(cfg, log, opts);
    const label = `${cfg.run.name ?? stage}@step-${row.step}`;
    const s = await evaluate(cfg, agent, e, judge.deps, evalQs, {
      label,
      adapter: null,
      dir: join(dir, 'evals', `step-${row.step}`),
      log,
      progress: opts.progress,
    });
    run.logMetrics({
      step: row.step,
      kind: 'eval',
      eval_accuracy: s.accuracy,
      eval_em: s.em,
      eval_f1: s.f1,
      eval_answered: s.answered,
      eval_avg_turns: s.avg_turns,
      eval_time_s: s.time_s,
    });
    log(
      `eval at step ${row.step}: accuracy ${(100 * s.accuracy).toFixed(1)} %, F1 ${(100 * s.f1).toFixed(1)} %, answered ${(100 * s.answered).toFixed(1)} %`,
    );
  };
  try {
    log(`run: ${dir} (stage ${stage}, model ${cfg.model.path}${cfg.model.adapter ? `, adapter ${cfg.model.adapter}` : ''})`);
    run.saveTotalLimit = cfg.train.save_total_limit;
    run.allowScheduleChange = opts.allowScheduleChange === true;
    const stageRun: StageRun = { cfg, agent, run, dir, log, common: trainerOptions(cfg, opts, dist), onStep };
    let result: TrainResult;
    if (stage === 'sft') result = await sftStage(stageRun);
    else {
      required(cfg.data.questions, 'data.questions');
      const { train, eval: held } = await questionSplits(cfg.data);
      if (!train.length)
        throw new SlmError(
          'DATA_INVALID',
          `the train split of ${cfg.data.questions} is empty${cfg.data.eval_questions ? '' : ` (train_fraction ${cfg.data.split.train_fraction} of ${train.length + held.length} rows)`}.`,
        );
      log(
        `questions: ${train.length} to train on (${cfg.data.eval_questions ? `every row of ${cfg.data.questions}` : `data.split of ${cfg.data.questions}`}${cfg.data.train_questions !== null ? `, data.train_questions drawn` : ''}), ${held.length} to evaluate on (${cfg.data.eval_questions ?? 'the rest'})`,
      );
      env = await openEnvironment(cfg, log, opts.progress, opts);
      log(`environment: ${env.describe}`);
      judge ??= await rewardDeps(cfg, log, opts);
      const stageOpts = { keepAdapter: cfg.model.adapter !== null, dist };
      result = await rlStage(stageRun, train, env, judge.deps, stageOpts);
    }
    if (lead && (opts.stopAfter === undefined || result.steps >= (run.latestCheckpoint()?.state.step ?? 0))) {
      await agent.model.saveAdapter(result.adapter);
      log(`adapter: ${result.adapter}`);
    }
    if (lead)
      try {
        log(`report: ${await writeReport(dir)}`);
      } catch (e) {
        log(`report: not written (${(e as Error).message}); run \`slm-train report ${dir}\` to try again`);
      }
    finished = true;
    return result;
  } finally {
    run.close();
    await run.finishTracking(finished ? 'FINISHED' : 'FAILED');
    await env?.close();
    await evalEnv?.close();
    judge?.close();
    agent.model.dispose();
  }
}

function fmt(v: unknown): string {
  return typeof v === 'number' ? (Number.isInteger(v) ? String(v) : v.toPrecision(4)) : String(v);
}

/** One progress line per step: the step and its headline metrics. */
function stepLine(row: Record<string, unknown>): string {
  const keys = [
    'loss',
    'reward_mean',
    'reward',
    'accuracy',
    'kl',
    'clip_frac',
    'grad_norm',
    'lr',
    'mask_coverage',
    'time_rollout_s',
    'time_train_s',
  ];
  return (
    `step ${row.step}: ` +
    keys
      .filter((k) => row[k] !== undefined && row[k] !== null)
      .map((k) => `${k} ${fmt(row[k])}`)
      .join(', ') +
    nothingTrained(row)
  );
}

/** What the skip reasons of a group (lib/train/rl/advantages.ts) mean. */
const SKIP_REASONS: Record<string, string> = {
  zero_variance: 'its rollouts all got the same reward, so no advantage (algorithm.fallbacks.zero_variance: skip)',
  all_failed: 'every rollout failed (rewards all alike below algorithm.fallbacks.flat_skip_below, or none succeeded with all_failed: skip)',
  non_finite_reward: 'a reward was NaN or inf',
  all_excluded: 'every rollout was excluded',
  single_rollout: 'fewer than two rollouts remained',
};

/** Why a training step changed nothing (every group skipped, or the update skipped), for its console line; '' otherwise. */
export function nothingTrained(row: Record<string, unknown>): string {
  if (row.kind === 'eval') return '';
  const reasons = Array.isArray(row.skip_reasons) ? (row.skip_reasons as unknown[]).map(String) : [];
  const why = reasons.map((r) => `${r}: ${SKIP_REASONS[r] ?? 'skipped'}`).join('; ');
  if (row.episodes_trained === 0) {
    const groups =
      typeof row.groups_skipped === 'number' && row.groups_skipped > 0
        ? `all ${row.groups_skipped} group(s) skipped`
        : 'no episode had a non-zero advantage and a trained token';
    return ` -- trained nothing: ${groups}${why ? ` (${why})` : ''}`;
  }
  const skipped =
    row.update_skipped === true || row.skipped === true || (typeof row.updates_skipped === 'number' && row.updates_skipped > 0);
  if (skipped)
    return ` -- update skipped${typeof row.skip_reason === 'string' ? `: ${row.skip_reason}` : ''} (the adapter is unchanged by this step)`;
  return '';
}
