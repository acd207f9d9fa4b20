/**
 * The run report's data: what `report.html` shows of a run folder, read and sampled here
 * (metrics.jsonl rows, the evaluations under evals/, a sample of the training and evaluation
 * trajectories, config.yaml). The page itself is rendered by report.ts.
 */
import { createReadStream, existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { basename, join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { SlmError } from '../../errors.js';
import { readRows } from '../run.js';

/** A trajectory as the report shows it. */
export interface ReportTrajectory {
  source: string;
  step?: number;
  question: string;
  golds: string[];
  answer: string | null;
  reward: number | null;
  correct?: boolean;
  parts?: Record<string, unknown>;
  turns?: number;
  finish?: string;
  temperature?: number;
  advantage?: number | null;
  messages: Array<{ role: string; content: string }>;
}

export interface ReportData {
  title: string;
  dir: string;
  generated: string;
  metrics: Record<string, unknown>[];
  evals: Record<string, unknown>[];
  trajectories: ReportTrajectory[];
  config: string | null;
}

export interface ReportOptions {
  /** Output file (default: RUN_DIR/report.html). */
  out?: string;
  /** Training steps sampled for trajectories (evenly spaced, first and last included; default 12). */
  steps?: number;
  /** Trajectories per sampled step (best, worst, then others; default 3) and per evaluation (default 12). */
  perStep?: number;
  perEval?: number;
  /** Characters kept per message (default 6000). */
  maxChars?: number;
}

const clip = (s: unknown, n: number): string => {
  const t = typeof s === 'string' ? s : s === undefined || s === null ? '' : JSON.stringify(s);
  return t.length > n ? `${t.slice(0, n)}\n… [${t.length - n} more characters cut]` : t;
};

const num = (x: unknown): number | null => (typeof x === 'number' && Number.isFinite(x) ? x : null);

/** A trajectories.jsonl row (training or evaluation) in the report's shape. */
function toReportTrajectory(row: Record<string, unknown>, source: string, maxChars: number): ReportTrajectory {
  const q = row.question as unknown;
  const qObj = q && typeof q === 'object' ? (q as Record<string, unknown>) : undefined;
  const golds = (row.golds ?? qObj?.golds ?? []) as unknown;
  const messages = Array.isArray(row.messages) ? (row.messages as Array<Record<string, unknown>>) : [];
  return {
    source,
    step: typeof row.step === 'number' ? row.step : undefined,
    question: clip(qObj ? qObj.question : q, maxChars),
    golds: Array.isArray(golds) ? golds.map((g) => clip(g, 500)) : [clip(golds, 500)],
    answer: row.answer === null || row.answer === undefined ? null : clip(row.answer, maxChars),
    reward: num(row.reward),
    correct: typeof row.correct === 'boolean' ? row.correct : undefined,
    parts: row.parts && typeof row.parts === 'object' ? (row.parts as Record<string, unknown>) : undefined,
    turns: num(row.turns) ?? undefined,
    finish: typeof row.finish === 'string' ? row.finish : undefined,
    temperature: num(row.temperature) ?? undefined,
    advantage: row.advantage === undefined ? undefined : num(row.advantage),
    messages: messages.map((m) => ({ role: clip(m.role, 40), content: clip(m.content, maxChars) })),
  };
}

/**
 * A sample of the training trajectories, read as a stream (the file can be large): per step the
 * best and the worst reward and the first others, then `steps` steps evenly spaced.
 */
async function sampleTraining(
  file: string,
  opts: Required<Pick<ReportOptions, 'steps' | 'perStep' | 'maxChars'>>,
): Promise<ReportTrajectory[]> {
  if (!existsSync(file)) return [];
  const bySteps = new Map<number, Array<{ r: number; line: string }>>();
  const rl = createInterface({ input: createReadStream(file, 'utf8'), crlfDelay: Infinity });
  for await (const line of rl) {
    if (!line.trim()) continue;
    let row: { step?: unknown; reward?: unknown };
    try {
      row = JSON.parse(line);
    } catch {
      continue;
    }
    const step = typeof row.step === 'number' ? row.step : 0;
    const r = typeof row.reward === 'number' ? row.reward : -Infinity;
    const kept = bySteps.get(step) ?? [];
    kept.push({ r, line });
    if (kept.length > opts.perStep) {
      // keep the best, the worst and the earliest others
      const best = kept.reduce((a, b) => (b.r > a.r ? b : a));
      const worst = kept.reduce((a, b) => (b.r < a.r ? b : a));
      const others = kept.filter((x) => x !== best && x !== worst).slice(0, Math.max(0, opts.perStep - 2));
      kept.splice(0, kept.length, ...new Set([best, worst, ...others].slice(0, opts.perStep)));
    }
    bySteps.set(step, kept);
  }
  const steps = [...bySteps.keys()].sort((a, b) => a - b);
  const pick =
    steps.length <= opts.steps
      ? steps
      : [...new Set(Array.from({ length: opts.steps }, (_, i) => steps[Math.round((i * (steps.length - 1)) / (opts.steps - 1))]))];
  return pick.flatMap((s) =>
    bySteps
      .get(s)!
      .sort((a, b) => b.r - a.r)
      .map((x) => toReportTrajectory(JSON.parse(x.line), `train step ${s}`, opts.maxChars)),
  );
}

/** Evaluations under RUN/evals/: their summaries and a sample of their trajectories (correct and wrong). */
function readEvals(dir: string, perEval: number, maxChars: number): { evals: Record<string, unknown>[]; trajectories: ReportTrajectory[] } {
  const root = join(dir, 'evals');
  const evals: Record<string, unknown>[] = [];
  const trajectories: ReportTrajectory[] = [];
  for (const d of existsSync(root) ? readdirSync(root).sort() : []) {
    const f = join(root, d, 'summary.json');
    if (!existsSync(f)) continue;
    try {
      evals.push(JSON.parse(readFileSync(f, 'utf8')));
    } catch {
      continue;
    }
    const rows = readRows(join(root, d, 'trajectories.jsonl'));
    const good = rows.filter((r) => r.correct === true);
    const bad = rows.filter((r) => r.correct !== true);
    const half = Math.ceil(perEval / 2);
    const sample = [
      ...good.slice(0, Math.max(half, perEval - bad.length)),
      ...bad.slice(0, Math.max(perEval - half, perEval - good.length)),
    ].slice(0, perEval);
    trajectories.push(...sample.map((r) => toReportTrajectory(r, `eval ${d}`, maxChars)));
  }
  evals.sort((a, b) => String(a.date ?? '').localeCompare(String(b.date ?? '')));
  return { evals, trajectories };
}

export async function collectReport(dir: string, opts: ReportOptions = {}): Promise<ReportData> {
  const abs = resolve(dir);
  if (!existsSync(abs) || !statSync(abs).isDirectory())
    throw new SlmError(
      'FILE_NOT_FOUND',
      `report: ${dir} is not a folder; give a run folder (run.dir/run.name) written by \`slm-train train\`.`,
    );
  const has = ['metrics.jsonl', 'trajectories.jsonl', 'evals'].filter((f) => existsSync(join(abs, f)));
  if (!has.length)
    throw new SlmError(
      'FILE_NOT_FOUND',
      `report: ${dir} holds no metrics.jsonl, trajectories.jsonl or evals/; expected a run folder written by \`slm-train train\`.`,
    );
  const maxChars = opts.maxChars ?? 6000;
  const ev = readEvals(abs, opts.perEval ?? 12, maxChars);
  const cfgFile = join(abs, 'config.yaml');
  return {
    title: basename(abs),
    dir: abs,
    generated: new Date().toISOString(),
    metrics: readRows(join(abs, 'metrics.jsonl')),
    evals: ev.evals,
    trajectories: [
      ...(await sampleTraining(join(abs, 'trajectories.jsonl'), { steps: opts.steps ?? 12, perStep: opts.perStep ?? 3, maxChars })),
      ...ev.trajectories,
    ],
    config: existsSync(cfgFile) ? readFileSync(cfgFile, 'utf8') : null,
  };
}
