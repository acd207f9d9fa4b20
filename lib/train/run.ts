/**
 * A run folder: the resolved config, metrics.jsonl (one JSON object per step) mirrored as
 * TensorBoard scalars in `tb/events.out.tfevents.*` (lib/train/report/tensorboard.ts), and checkpoints
 * `checkpoints/step-N/` holding the adapter (PEFT), the optimizer state, and `state.json` (step,
 * data position, seeds, metrics so far). A checkpoint is written into a temporary folder and renamed
 * into place, so a process killed mid-save leaves either the previous checkpoints or a complete new
 * one, never a half-written `step-N`.
 */
import { appendFileSync, existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { SlmError } from '../errors.js';
import type { Model } from '../engine/model.js';
import { xorshift32 } from '../util/data.js';
import { EventWriter } from './report/tensorboard.js';
import type { Tracker } from './report/tracking.js';
import { learningRate, type ScheduleSpec } from './schedule.js';
import { sectionDefaults } from '../config/schema.js';

/**
 * The tracked scalars of a metrics row (TensorBoard tags, MLflow metric keys): every finite number
 * but `step`, grouped as TRL names them: an evaluation row's keys (kind: eval, keys eval_*) under
 * `eval/` (eval_accuracy -> eval/accuracy), a training step's under `train/` (loss -> train/loss,
 * reward/f1 -> train/reward/f1). metrics.jsonl keeps the plain keys. Runs written before the
 * grouping have flat tags (loss, eval/accuracy) in their older event files; TensorBoard shows both.
 */
export function tbScalars(row: Record<string, unknown>): Record<string, number> {
  const evalRow = row.kind === 'eval';
  const out: Record<string, number> = {};
  for (const [k, v] of Object.entries(row)) {
    if (k === 'step' || typeof v !== 'number' || !Number.isFinite(v)) continue;
    out[evalRow ? `eval/${k.replace(/^eval_/, '')}` : `train/${k}`] = v;
  }
  return out;
}

export interface TrainState {
  step: number;
  epoch: number;
  /** Index of the next batch within the epoch's order. */
  batchInEpoch: number;
  seed: number;
  [k: string]: unknown;
}

/** The object rows of a JSONL file the run writes (none if it is absent); a line cut by a kill mid-write is left out. */
export function readRows(file: string): Record<string, unknown>[] {
  if (!existsSync(file)) return [];
  return readFileSync(file, 'utf8')
    .split('\n')
    .filter((l) => l.trim())
    .flatMap((l) => {
      try {
        const v = JSON.parse(l);
        return v && typeof v === 'object' ? [v as Record<string, unknown>] : [];
      } catch {
        return [];
      }
    });
}

export class RunFolder {
  readonly dir: string;
  #tb: EventWriter | undefined;
  /** Whether steps go to TensorBoard event files (log.report_to has tensorboard; the default). */
  tensorboardEnabled = true;
  /** The other trackers of log.report_to (MLflow), opened by the session. */
  trackers: Tracker[] = [];
  constructor(dir: string) {
    this.dir = dir;
    mkdirSync(join(dir, 'checkpoints'), { recursive: true });
  }

  writeJson(name: string, value: unknown): void {
    const tmp = join(this.dir, `.${name}.tmp`);
    writeFileSync(tmp, JSON.stringify(value, null, 2) + '\n');
    renameSync(tmp, join(this.dir, name));
  }

  writeText(name: string, text: string): void {
    const tmp = join(this.dir, `.${name}.tmp`);
    writeFileSync(tmp, text);
    renameSync(tmp, join(this.dir, name));
  }

  /**
   * Appends one metrics row (a JSON line) to metrics.jsonl, and its numbers to the TensorBoard events.
   * A step whose loss is NaN or inf is logged, then stops the run (TRAINING_DIVERGED): nothing of it
   * is saved, so the newest checkpoint stays the last good one.
   */
  logMetrics(row: Record<string, unknown>): void {
    const now = Date.now();
    appendFileSync(join(this.dir, 'metrics.jsonl'), JSON.stringify({ time: new Date(now).toISOString(), ...row }) + '\n');
    if (typeof row.step === 'number' && (this.tensorboardEnabled || this.trackers.length)) {
      const scalars = tbScalars(row);
      if (this.tensorboardEnabled) this.tensorboard().scalars(row.step, scalars, now / 1000);
      for (const t of this.trackers) t.log(row.step, scalars, now);
    }
    this.stopIfDiverged(row);
  }

  /** Throws TRAINING_DIVERGED when the metrics row of a step has a loss that is NaN or inf. */
  stopIfDiverged(row: Record<string, unknown>): void {
    if (typeof row.loss === 'number' && !Number.isFinite(row.loss)) throw this.diverged(row.step, `the loss is ${row.loss}`);
  }

  /** The error that stops a run whose training turned non-finite at `step` (`what`: the loss, the adapter). */
  diverged(step: unknown, what: string): SlmError {
    const last = this.latestCheckpoint();
    return new SlmError(
      'TRAINING_DIVERGED',
      `training diverged at step ${step}: ${what}, expected finite values. Training stopped without saving that step; ${last ? `the last good checkpoint is ${last.dir} (step ${last.state.step}): continue from it with --resume after lowering optim.lr` : 'no checkpoint was written before it: start again with a lower optim.lr'}.`,
      { step, checkpoint: last?.dir },
    );
  }

  /** This process's TensorBoard event file (created on first use). */
  tensorboard(): EventWriter {
    return (this.#tb ??= new EventWriter(join(this.dir, 'tb')));
  }

  /** Closes the event file (a later logMetrics opens a new one). */
  close(): void {
    this.#tb?.close();
    this.#tb = undefined;
  }

  /** Sends what the trackers still hold and closes their runs (MLflow: FINISHED, or FAILED after an error). */
  async finishTracking(status: 'FINISHED' | 'FAILED' | 'KILLED'): Promise<void> {
    const ts = this.trackers;
    this.trackers = [];
    for (const t of ts) await t.finish(status);
  }

  readMetrics(): Record<string, unknown>[] {
    return readRows(join(this.dir, 'metrics.jsonl'));
  }

  /** Keeps only metrics rows up to `step` (a resumed run re-logs the steps after its checkpoint). */
  truncateMetrics(step: number): void {
    const rows = this.readMetrics().filter((r) => typeof r.step !== 'number' || (r.step as number) <= step);
    this.writeText('metrics.jsonl', rows.map((r) => JSON.stringify(r)).join('\n') + (rows.length ? '\n' : ''));
  }

  async saveCheckpoint(model: Model, state: TrainState): Promise<string> {
    const bad = model.nonFinite();
    if (bad) throw this.diverged(state.step, `the adapter holds ${bad.count} non-finite values (NaN or inf; first in ${bad.tensors[0]})`);
    const name = `step-${state.step}`;
    const final = join(this.dir, 'checkpoints', name);
    const tmp = join(this.dir, 'checkpoints', `.${name}.partial-${process.pid}`);
    rmSync(tmp, { recursive: true, force: true });
    mkdirSync(tmp, { recursive: true });
    await model.saveAdapter(join(tmp, 'adapter'));
    await model.saveOptimizer(join(tmp, 'optimizer.safetensors'));
    const recorded = this.schedule ? { ...state, schedule: resolvedSchedule(this.schedule) } : state;
    writeFileSync(join(tmp, 'state.json'), JSON.stringify(recorded, null, 2) + '\n'); // written last
    rmSync(final, { recursive: true, force: true });
    renameSync(tmp, final);
    if (this.saveTotalLimit !== null) this.pruneCheckpoints(this.saveTotalLimit, final);
    return final;
  }

  /**
   * train.save_total_limit: removes the complete checkpoints past the newest `limit` (by step). The
   * one just written (`keep`) always stays, so a resume always has the checkpoint it loads; folders
   * that are not complete checkpoints (a damaged step-N) are neither counted nor removed.
   */
  pruneCheckpoints(limit: number, keep?: string): string[] {
    const removed: string[] = [];
    for (const ck of this.checkpoints().slice(Math.max(1, limit))) {
      if (ck.dir === keep) continue;
      rmSync(ck.dir, { recursive: true, force: true });
      removed.push(ck.dir);
    }
    if (removed.length)
      this.log(`checkpoints: removed ${removed.map((d) => d.slice(d.lastIndexOf('step-'))).join(', ')} (train.save_total_limit ${limit})`);
    return removed;
  }

  /** Where resume messages go (the session sets its log). */
  log: (line: string) => void = () => {};

  /** train.save_total_limit: keep the newest N complete checkpoints (null: all). */
  saveTotalLimit: number | null = null;
  /**
   * The stage's learning-rate schedule (its length resolved), recorded in each checkpoint's
   * state.json; `restore` refuses a resume whose schedule differs (RESUME_SCHEDULE_CHANGED) unless
   * `allowScheduleChange`. Undefined: neither recorded nor checked.
   */
  schedule: ScheduleSpec | undefined;
  allowScheduleChange = false;

  /** The complete checkpoints (state.json, adapter and optimizer present), newest first. */
  checkpoints(): Array<{ dir: string; state: TrainState }> {
    const root = join(this.dir, 'checkpoints');
    const steps = readdirSync(root)
      .map((d) => /^step-(\d+)$/.exec(d))
      .filter((m): m is RegExpExecArray => !!m)
      .map((m) => Number(m[1]))
      .sort((a, b) => b - a);
    const out: Array<{ dir: string; state: TrainState }> = [];
    for (const s of steps) {
      const dir = join(root, `step-${s}`);
      try {
        const state = JSON.parse(readFileSync(join(dir, 'state.json'), 'utf8')) as TrainState;
        if (
          state.step === s &&
          existsSync(join(dir, 'adapter', 'adapter_model.safetensors')) &&
          existsSync(join(dir, 'optimizer.safetensors'))
        )
          out.push({ dir, state });
      } catch {
        /* incomplete or damaged: try an older one */
      }
    }
    return out;
  }

  /** The newest complete checkpoint, or undefined. */
  latestCheckpoint(): { dir: string; state: TrainState } | undefined {
    return this.checkpoints()[0];
  }

  async restore(model: Model): Promise<TrainState> {
    const ck = await loadNewestGood(
      model,
      this.checkpoints(),
      this.log,
      `${this.dir} has no complete checkpoint under checkpoints/step-N. Start the run without --resume.`,
    );
    checkSchedule(this, ck);
    this.truncateMetrics(ck.state.step);
    // TensorBoard drops the earlier files' points from this step on (logged past the checkpoint).
    if (this.tensorboardEnabled) this.tensorboard().write({ wallTime: Date.now() / 1000, step: ck.state.step + 1, sessionStart: true });
    return ck.state;
  }
}

/** A schedule with its defaults filled in (warm-up, final ratio), as learningRate reads it. */
function resolvedSchedule(s: ScheduleSpec): Required<ScheduleSpec> {
  const d = sectionDefaults('optim');
  return {
    kind: s.kind,
    lr: s.lr,
    warmupSteps: s.warmupSteps ?? d.warmup_steps,
    totalSteps: s.totalSteps ?? 0,
    minRatio: s.minRatio ?? d.min_lr_ratio,
  };
}

const SCHEDULE_FIELDS: Array<[keyof ScheduleSpec, string]> = [
  ['totalSteps', 'total steps (train.steps, or train.epochs x the batches of an epoch)'],
  ['kind', 'optim.schedule'],
  ['lr', 'optim.lr'],
  ['warmupSteps', 'optim.warmup_steps'],
  ['minRatio', 'optim.min_lr_ratio'],
];

/**
 * A resume on a schedule other than the checkpoint's reshapes the learning rate from the next step
 * on (a linear decay over 20 steps instead of 10 jumps back up): refused with RESUME_SCHEDULE_CHANGED
 * naming what changed, unless run.allowScheduleChange (then logged); a constant schedule's step total
 * is free to change. Checkpoints written before the schedule was recorded are not checked.
 */
function checkSchedule(run: RunFolder, ck: { dir: string; state: TrainState }): void {
  const before = ck.state.schedule as Required<ScheduleSpec> | undefined;
  if (!run.schedule || !before || typeof before !== 'object') return;
  const now = resolvedSchedule(run.schedule);
  // A constant schedule's learning rate does not depend on the step total (nor the final ratio).
  const constant = before.kind === 'constant' && now.kind === 'constant';
  const changed = SCHEDULE_FIELDS.filter(([k]) => before[k] !== now[k] && !(constant && (k === 'totalSteps' || k === 'minRatio'))).map(
    ([k, what]) => `${what}: ${before[k]} -> ${now[k]}`,
  );
  if (!changed.length) return;
  const step = ck.state.step;
  const lr = (spec: ScheduleSpec) => {
    try {
      return String(Number(learningRate(spec, step).toPrecision(3)));
    } catch {
      return 'undefined';
    }
  };
  const effect = `the learning rate of step ${step + 1} would be ${lr(now)} instead of ${lr(before)}`;
  if (run.allowScheduleChange) {
    run.log(
      `resume: the learning-rate schedule changed since ${ck.dir} (${changed.join('; ')}): ${effect}; continuing on the new schedule (--allow-schedule-change)`,
    );
    return;
  }
  throw new SlmError(
    'RESUME_SCHEDULE_CHANGED',
    `--resume: the learning-rate schedule differs from the one ${ck.dir} was trained on (${changed.join('; ')}), so ${effect}. Resume with the settings the run started with, or pass --allow-schedule-change (allowScheduleChange in code) to continue on the new schedule.`,
    { checkpoint: ck.dir, before, now },
  );
}

/**
 * Loads the newest checkpoint of `candidates` (newest first) whose adapter and optimizer load; one
 * that does not (a damaged file: a disk that filled, a copy cut short) is logged and the next older
 * one is tried. Throws CHECKPOINT_INVALID when none loads, naming why each failed.
 */
export async function loadNewestGood(
  model: Model,
  candidates: Array<{ dir: string; state: TrainState }>,
  log: (line: string) => void,
  none: string,
): Promise<{ dir: string; state: TrainState }> {
  if (!candidates.length) throw new SlmError('CHECKPOINT_INVALID', `--resume: ${none}`);
  const failures: string[] = [];
  for (const ck of candidates) {
    try {
      await model.loadAdapter(join(ck.dir, 'adapter'));
      await model.loadOptimizer(join(ck.dir, 'optimizer.safetensors'));
      if (failures.length) log(`resume: continuing from ${ck.dir} (step ${ck.state.step}) instead`);
      return ck;
    } catch (e) {
      const why = e instanceof SlmError ? `${e.code}: ${e.message}` : String(e);
      failures.push(`${ck.dir}: ${why}`);
      log(`resume: checkpoint ${ck.dir} cannot be loaded (${why}); trying an older one`);
    }
  }
  throw new SlmError(
    'CHECKPOINT_INVALID',
    `--resume: no checkpoint could be loaded: ${failures.join('; ')}. Start the run again without --resume (or restore the checkpoint files).`,
  );
}

/** A deterministic permutation of 0..n-1 for (seed, epoch): resumable without saving RNG state. */
export function permutation(n: number, seed: number, epoch: number): number[] {
  const rand = xorshift32(seed * 2654435761 + epoch * 40503 + 1);
  const p = Array.from({ length: n }, (_, i) => i);
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    [p[i], p[j]] = [p[j], p[i]];
  }
  return p;
}
