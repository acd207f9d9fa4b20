/**
 * Experiment tracking beyond metrics.jsonl (`log.report_to`, as TRL's `report_to`): TensorBoard
 * event files (lib/train/report/tensorboard.ts, written by RunFolder) and MLflow, through the tracking
 * server's REST API (`/api/2.0/mlflow/...`) with Node's fetch — no Python in the product.
 *
 * MLflow: one MLflow run per slm-train run, in the experiment `log.mlflow_experiment`
 * ($MLFLOW_EXPERIMENT_NAME, else Default), created when missing; the resolved config as params
 * (`optim.lr`, `lora.r`, ...), each step's numbers as metrics with the step (`train/loss`,
 * `eval/accuracy`: the same grouped names as the TensorBoard tags), the status FINISHED or FAILED
 * at the end. The MLflow run id is kept in RUN/tracking.json, so `--resume` goes on logging into
 * the same MLflow run. A server that cannot be reached at the start stops the run before training
 * (TRACKING_FAILED); a request that fails later is retried, then said once in the log, and training
 * goes on (metrics.jsonl stays complete).
 *
 * Weights & Biases is not written: its offline run files (`.wandb`) are an internal protobuf record
 * stream that only `wandb sync` uploading to a W&B server checks, and no W&B server runs offline
 * (README "Experiment tracking").
 */
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { ResolvedConfig } from '../../config/types.js';
import { SlmError } from '../../errors.js';

/** A destination of step metrics. */
export interface Tracker {
  readonly name: string;
  /** The grouped scalars of one metrics row (tbScalars) at `step`, logged at `wallMs`. */
  log(step: number, scalars: Record<string, number>, wallMs: number): void;
  /** Sends what is pending and closes the run with this status. */
  finish(status: 'FINISHED' | 'FAILED' | 'KILLED'): Promise<void>;
}

/** The config flattened to `section.key` params (lists as JSON), as MLflow params hold strings. */
export function configParams(cfg: ResolvedConfig): Record<string, string> {
  const out: Record<string, string> = {};
  const walk = (v: unknown, path: string) => {
    if (v && typeof v === 'object' && !Array.isArray(v)) {
      for (const [k, sub] of Object.entries(v)) walk(sub, path ? `${path}.${k}` : k);
      return;
    }
    // MLflow keeps at most 6000 characters of a param value (long prompts are cut).
    out[path] = (typeof v === 'string' ? v : (JSON.stringify(v) ?? 'null')).slice(0, 6000);
  };
  walk(cfg, '');
  return out;
}

interface MlflowOptions {
  /** http(s)://HOST:PORT of the tracking server. */
  uri: string;
  experiment: string | null;
  runName: string;
  params: Record<string, string>;
  tags: Record<string, string>;
  /** An MLflow run to continue (a resumed slm-train run). */
  runId?: string;
  log: (line: string) => void;
  /** Tries per request (network errors, 429, 5xx). Default 3. */
  attempts?: number;
}

/** MLflow's REST API: one run, metrics sent in batches as the steps come, in order. */
export class MlflowTracker implements Tracker {
  readonly name = 'mlflow';
  #chain: Promise<void> = Promise.resolve();
  #lost = 0;
  #said = false;

  private constructor(
    readonly uri: string,
    readonly runId: string,
    readonly experimentId: string,
    private readonly o: MlflowOptions,
  ) {}

  /** The headers MLflow's own client sends for $MLFLOW_TRACKING_TOKEN or USERNAME/PASSWORD. */
  static headers(): Record<string, string> {
    const env = process.env;
    const h: Record<string, string> = { 'content-type': 'application/json' };
    if (env.MLFLOW_TRACKING_TOKEN) h.authorization = `Bearer ${env.MLFLOW_TRACKING_TOKEN}`;
    else if (env.MLFLOW_TRACKING_USERNAME)
      h.authorization = `Basic ${Buffer.from(`${env.MLFLOW_TRACKING_USERNAME}:${env.MLFLOW_TRACKING_PASSWORD ?? ''}`).toString('base64')}`;
    return h;
  }

  /** One REST call; the reply's JSON, or a TRACKING_FAILED error saying what the server answered. */
  static async call(uri: string, method: 'GET' | 'POST', path: string, body: unknown, attempts = 3): Promise<Record<string, unknown>> {
    const url = `${uri}/api/2.0/mlflow/${path}`;
    let last = '';
    for (let i = 1; i <= attempts; i++) {
      let r: Response;
      let text: string;
      try {
        r = await fetch(url, {
          method,
          headers: MlflowTracker.headers(),
          ...(method === 'POST' ? { body: JSON.stringify(body) } : {}),
          signal: AbortSignal.timeout(30_000),
        });
        text = await r.text();
      } catch (e) {
        const c = (e as { cause?: { code?: string } }).cause;
        last = `MLflow at ${uri}: ${method} ${path}: ${c?.code ?? (e as Error).message}`;
        if (i < attempts) await new Promise((res) => setTimeout(res, 500 * 2 ** (i - 1)));
        continue;
      }
      if (r.ok) return text ? (JSON.parse(text) as Record<string, unknown>) : {};
      let detail = text.slice(0, 300);
      let code = '';
      try {
        const j = JSON.parse(text) as { error_code?: string; message?: string };
        if (j.error_code) {
          code = j.error_code;
          detail = `${j.error_code}: ${j.message ?? ''}`;
        }
      } catch {
        /* not JSON */
      }
      const err = new SlmError('TRACKING_FAILED', `MLflow at ${uri}: ${method} ${path} answered ${r.status} (${detail})`, {
        status: r.status,
        error_code: code,
      });
      if (r.status !== 429 && r.status < 500) throw err;
      last = err.message;
      if (i < attempts) await new Promise((r) => setTimeout(r, 500 * 2 ** (i - 1)));
    }
    throw new SlmError(
      'TRACKING_FAILED',
      `${last} (after ${attempts} tries). Check that the MLflow tracking server runs there (log.mlflow_tracking_uri or $MLFLOW_TRACKING_URI), or leave mlflow out of log.report_to.`,
    );
  }

  /** Finds or creates the experiment, creates (or reopens) the run and logs the params. */
  static async open(opts: MlflowOptions): Promise<MlflowTracker> {
    const uri = opts.uri.replace(/\/+$/, '');
    if (!/^https?:\/\/[^/]/.test(uri))
      throw new SlmError(
        'CONFIG_INVALID',
        `log.report_to has mlflow, but the tracking URI ${JSON.stringify(opts.uri)} is not an http(s) address of an MLflow tracking server (a file store or databricks URI needs MLflow's Python client). Set log.mlflow_tracking_uri or $MLFLOW_TRACKING_URI to http://HOST:PORT.`,
        { path: 'log.mlflow_tracking_uri' },
      );
    const call = (m: 'GET' | 'POST', p: string, b?: unknown) => MlflowTracker.call(uri, m, p, b, opts.attempts);
    if (opts.runId) {
      const run = (await call('GET', `runs/get?run_id=${encodeURIComponent(opts.runId)}`)) as {
        run?: { info?: { experiment_id?: string } };
      };
      await call('POST', 'runs/update', { run_id: opts.runId, status: 'RUNNING' });
      return new MlflowTracker(uri, opts.runId, String(run.run?.info?.experiment_id ?? ''), opts);
    }
    let experimentId = '0';
    if (opts.experiment) {
      try {
        const e = (await call('GET', `experiments/get-by-name?experiment_name=${encodeURIComponent(opts.experiment)}`)) as {
          experiment: { experiment_id: string };
        };
        experimentId = e.experiment.experiment_id;
      } catch (e) {
        if (!(e instanceof SlmError) || (e.details as { error_code?: string } | undefined)?.error_code !== 'RESOURCE_DOES_NOT_EXIST')
          throw e;
        experimentId = String(
          ((await call('POST', 'experiments/create', { name: opts.experiment })) as { experiment_id: string }).experiment_id,
        );
      }
    }
    const tags = Object.entries({ 'mlflow.runName': opts.runName, 'mlflow.source.name': 'slm-train', ...opts.tags }).map(
      ([key, value]) => ({ key, value }),
    );
    const created = (await call('POST', 'runs/create', {
      experiment_id: experimentId,
      run_name: opts.runName,
      start_time: Date.now(),
      tags,
    })) as { run: { info: { run_id: string } } };
    const t = new MlflowTracker(uri, created.run.info.run_id, experimentId, opts);
    const params = Object.entries(opts.params).map(([key, value]) => ({ key, value }));
    for (let i = 0; i < params.length; i += 100)
      await call('POST', 'runs/log-batch', { run_id: t.runId, params: params.slice(i, i + 100) });
    return t;
  }

  log(step: number, scalars: Record<string, number>, wallMs: number): void {
    const metrics = Object.entries(scalars).map(([key, value]) => ({ key, value, timestamp: Math.round(wallMs), step }));
    if (!metrics.length) return;
    this.#chain = this.#chain.then(async () => {
      try {
        for (let i = 0; i < metrics.length; i += 1000)
          await MlflowTracker.call(
            this.uri,
            'POST',
            'runs/log-batch',
            { run_id: this.runId, metrics: metrics.slice(i, i + 1000) },
            this.o.attempts,
          );
      } catch (e) {
        this.#lost += metrics.length;
        if (!this.#said)
          this.o.log(`mlflow: metrics of step ${step} not sent (${(e as Error).message}); training goes on, metrics.jsonl has every step`);
        this.#said = true;
      }
    });
  }

  /** Resolves once every metric logged so far was sent (or given up on). */
  flush(): Promise<void> {
    return this.#chain;
  }

  async finish(status: 'FINISHED' | 'FAILED' | 'KILLED'): Promise<void> {
    await this.#chain;
    try {
      await MlflowTracker.call(this.uri, 'POST', 'runs/update', { run_id: this.runId, status, end_time: Date.now() }, this.o.attempts);
    } catch (e) {
      this.o.log(`mlflow: could not mark run ${this.runId} ${status} (${(e as Error).message})`);
    }
    if (this.#lost)
      this.o.log(`mlflow: ${this.#lost} metric values were not sent to ${this.uri} (run ${this.runId}); metrics.jsonl has them`);
  }
}

/** RUN/tracking.json: which MLflow run a run folder logs to (read again on --resume). */
interface TrackingState {
  mlflow?: { tracking_uri: string; experiment_id: string; run_id: string };
}

/**
 * The trackers of `cfg.log.report_to` other than TensorBoard (RunFolder writes that itself), opened
 * for the run folder `dir`: MLflow's run created (or, on resume, reopened) before training starts.
 */
export async function openTrackers(
  cfg: ResolvedConfig,
  dir: string,
  opts: { resume?: boolean; log: (line: string) => void; runName: string },
): Promise<Tracker[]> {
  const out: Tracker[] = [];
  if (!cfg.log.report_to.includes('mlflow')) return out;
  const uri = cfg.log.mlflow_tracking_uri ?? process.env.MLFLOW_TRACKING_URI;
  if (!uri)
    throw new SlmError(
      'CONFIG_INVALID',
      'log.report_to has mlflow, but no tracking server is named: set log.mlflow_tracking_uri (or $MLFLOW_TRACKING_URI) to http://HOST:PORT of an MLflow tracking server (`mlflow server --host 127.0.0.1 --port 5000`).',
      { path: 'log.mlflow_tracking_uri' },
    );
  const file = join(dir, 'tracking.json');
  let state: TrackingState = {};
  try {
    if (existsSync(file)) state = JSON.parse(readFileSync(file, 'utf8')) as TrackingState;
  } catch {
    state = {};
  }
  const prior = opts.resume && state.mlflow && state.mlflow.tracking_uri === uri.replace(/\/+$/, '') ? state.mlflow.run_id : undefined;
  const t = await MlflowTracker.open({
    uri,
    experiment: cfg.log.mlflow_experiment ?? process.env.MLFLOW_EXPERIMENT_NAME ?? null,
    runName: opts.runName,
    params: configParams(cfg),
    tags: { 'slm-train.stage': cfg.stage, 'slm-train.run_dir': dir },
    runId: prior,
    log: opts.log,
  });
  opts.log(
    `mlflow: ${prior ? 'continuing' : 'logging to'} run ${t.runId} at ${t.uri}${t.experimentId ? ` (experiment ${t.experimentId})` : ''}`,
  );
  writeFileSync(
    file,
    JSON.stringify({ ...state, mlflow: { tracking_uri: t.uri, experiment_id: t.experimentId, run_id: t.runId } }, null, 2) + '\n',
  );
  out.push(t);
  return out;
}
