/**
 * Evaluation: the questions of the configured split, episodes at eval settings, answer metrics and
 * the reward per question (trajectories.jsonl, summary.json), and the comparison table of every
 * evaluation of a run folder.
 */
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { basename, dirname, join, resolve } from 'node:path';
import type { ResolvedConfig } from '../config/types.js';
import { SlmError } from '../errors.js';
import type { CustomRewardFn, CustomTools } from '../extensions.js';
import { answerMetrics } from '../rewards/metrics.js';
import { rewardFromConfig, type ComposedRewardFn, type RewardDeps } from '../rewards/combine.js';
import { Progress, type ProgressTo } from '../util/progress.js';
import { loadQuestions, questionSplits, type Question } from './data.js';
import { rolloutRequests } from './rl/rl-loop.js';
import { episodeRunner, loadAgent, midpoint, openEnvironment, rewardDeps, type Agent, type Environment, type Log } from './environment.js';

export interface EvalSummary {
  label: string;
  model: string;
  adapter: string | null;
  split: string;
  questions: number;
  /** Judge correctness when a judge part is configured, else exact match. */
  accuracy: number;
  accuracy_by: 'judge' | 'em';
  em: number;
  subem: number;
  f1: number;
  rouge_l: number;
  reward: number;
  avg_turns: number;
  answered: number;
  /** Per Search-R1 `data_source` (when the questions name one): questions, EM, F1, ROUGE-L. */
  by_source?: Record<string, { questions: number; em: number; f1: number; rouge_l: number }>;
  max_turns: number;
  temperature: number;
  top_p: number;
  /** Passages per search (tags protocol) and the new-token limit per turn. */
  top_k: number;
  max_new_tokens: number;
  /**
   * With eval.pass_k = k >= 1: k episodes per question at the rollout settings (pass_k.jsonl). pass@k
   * is the share of questions with at least one correct episode, sample_accuracy the share of correct
   * episodes (the policy's accuracy as it samples in training).
   */
  pass_k?: {
    k: number;
    pass_at_k: number;
    sample_accuracy: number;
    temperature: number | [number, number];
    top_p: number | [number, number];
  };
  time_s: number;
  date: string;
}

export interface EvalOptions {
  adapter?: string | null;
  /** Name of this evaluation in the comparison table (default: base, or the adapter's run). */
  label?: string;
  log?: Log;
  /** Evaluation batch size in episodes (default: rollout.batch_questions x rollout.k, at least 8). */
  batch?: number;
  /** Progress bars of indexing and evaluation (the CLI: stderr); default none. */
  progress?: ProgressTo;
  /** A reward function (the part `module`) in place of reward.module's. */
  reward?: CustomRewardFn;
  /** Extra functions programs can call, in place of sandbox.tools_module's. */
  tools?: CustomTools;
  /** Stops the evaluation at the end of the current turn (of the batch of episodes running): the call rejects with the signal's reason; nothing is written for the unfinished batch. */
  signal?: AbortSignal;
}

export function evalLabel(adapter: string | null): string {
  if (!adapter) return 'base';
  const a = resolve(adapter);
  // runs/NAME/adapter or runs/NAME/checkpoints/step-N/adapter -> NAME or NAME@step-N
  if (basename(a) === 'adapter') {
    const parent = dirname(a);
    if (/^step-\d+$/.test(basename(parent)) && basename(dirname(parent)) === 'checkpoints')
      return `${basename(dirname(dirname(parent)))}@${basename(parent)}`;
    return basename(parent);
  }
  return basename(a);
}

const mean = (xs: number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : 0);

/** The questions of the configured eval split (eval.split, eval.max_questions). */
export async function evalQuestions(cfg: ResolvedConfig): Promise<Question[]> {
  if (!cfg.data.questions)
    throw new SlmError(
      'CONFIG_INVALID',
      `data.questions is not set: evaluation needs question rows {question, answer}${cfg.stage === 'sft' ? `; this config is for stage sft (it trains on the conversations of data.sft)` : ''}. Set data.questions (and data.corpus or data.index for a searching protocol), e.g. data.questions=path/to/questions.jsonl.`,
      { path: 'data.questions' },
    );
  // With data.eval_questions the eval split is that file and the train split all of data.questions.
  let qs = cfg.eval.split === 'all' ? await loadQuestions(cfg.data.questions) : (await questionSplits(cfg.data))[cfg.eval.split];
  if (cfg.eval.max_questions !== null) qs = qs.slice(0, cfg.eval.max_questions);
  if (!qs.length) throw new SlmError('DATA_INVALID', `the ${cfg.eval.split} split of ${cfg.data.questions} is empty; nothing to evaluate.`);
  return qs;
}

/** EM / F1 / ROUGE-L per data_source (Search-R1's datasets), when the questions name one. */
function bySource(rows: ReadonlyArray<Record<string, unknown>>): Pick<EvalSummary, 'by_source'> {
  const groups = new Map<string, Array<Record<string, unknown>>>();
  for (const r of rows) {
    if (typeof r.data_source !== 'string') continue;
    const g = groups.get(r.data_source);
    if (g) g.push(r);
    else groups.set(r.data_source, [r]);
  }
  if (!groups.size) return {};
  const avg = (g: Array<Record<string, unknown>>, k: string) => mean(g.map((x) => x[k] as number));
  return {
    by_source: Object.fromEntries(
      [...groups].map(([k, g]) => [k, { questions: g.length, em: avg(g, 'em'), f1: avg(g, 'f1'), rouge_l: avg(g, 'rouge_l') }]),
    ),
  };
}

/**
 * Evaluates the agent as it is (its adapter included) on `qs`: greedy or at eval.temperature, with
 * max_turns_eval; writes trajectories.jsonl and summary.json into `dir`.
 */
export async function evaluate(
  cfg: ResolvedConfig,
  agent: Agent,
  env: Environment,
  deps: RewardDeps,
  qs: readonly Question[],
  opts: { label: string; adapter: string | null; dir: string; log: Log; batch?: number; progress?: ProgressTo; signal?: AbortSignal },
): Promise<EvalSummary> {
  const t0 = performance.now();
  mkdirSync(opts.dir, { recursive: true });
  opts.log(`eval ${opts.label}: ${qs.length} questions (${cfg.eval.split} split), ${env.describe}`);
  const rewardFn: ComposedRewardFn = rewardFromConfig(cfg.reward, deps);
  const byJudge = (cfg.reward.parts as Array<{ kind?: string }>).some((p) => p.kind === 'judge' || p.kind === 'judge_correctness');
  const batch = opts.batch ?? Math.max(8, cfg.rollout.batch_questions * cfg.rollout.k);
  const rows: Array<Record<string, unknown>> = [];
  const lines: string[] = [];
  const bar = new Progress(`eval ${opts.label}`, qs.length, 'questions', opts.progress);
  try {
    for (let s = 0; s < qs.length; s += batch) {
      const chunk = qs.slice(s, s + batch);
      opts.signal?.throwIfAborted();
      const runner = episodeRunner(cfg, agent, env, {
        eval: true,
        seed: cfg.train.seed * 7919 + s,
        temperature: cfg.eval.temperature,
        onTurn: (t) => {
          bar.update(s + t.finished);
          opts.signal?.throwIfAborted();
        },
      });
      const r = await runner.run(chunk.map((q) => ({ question: q.question, prompt: q.prompt, temperature: cfg.eval.temperature })));
      // Every episode of the chunk scored at once (a judge endpoint limits its own concurrency).
      const rewards = await Promise.all(
        r.episodes.map((e, i) =>
          rewardFn({
            answer: e.answer,
            golds: chunk[i].golds,
            question: chunk[i].question,
            id: chunk[i].id,
            episode: { turns: e.turns, messages: e.messages, calls: e.calls, finish: e.finish },
          }),
        ),
      );
      for (let i = 0; i < chunk.length; i++) {
        const e = r.episodes[i];
        const q = chunk[i];
        const m = answerMetrics(e.answer, q.golds);
        const rw = rewards[i];
        const correct = byJudge ? (rw.correct ?? false) : m.em === 1;
        const row = {
          id: q.id,
          ...(q.data_source ? { data_source: q.data_source } : {}),
          question: q.question,
          golds: q.golds,
          answer: e.answer,
          correct,
          ...m,
          reward: rw.total,
          parts: rw.parts,
          ...(Object.keys(rw.errors).length ? { reward_errors: rw.errors } : {}),
          turns: e.turns,
          finish: e.finish,
          calls: e.calls,
          messages: e.messages,
        };
        rows.push(row);
        lines.push(JSON.stringify(row));
      }
      const accuracy = mean(rows.map((x) => (x.correct ? 1 : 0)));
      bar.update(s + chunk.length, { accuracy, reward: mean(rows.map((x) => x.reward as number)) });
      if (!opts.progress)
        opts.log(`eval ${opts.label}: ${Math.min(s + batch, qs.length)}/${qs.length}, accuracy so far ${accuracy.toFixed(3)}`);
    }
  } finally {
    bar.stop();
  }
  writeFileSync(join(opts.dir, 'trajectories.jsonl'), lines.join('\n') + '\n');
  const passK =
    cfg.eval.pass_k > 0
      ? await passAtK(cfg, agent, env, qs, {
          ...opts,
          batch,
          correct: (e, q, rw) => (byJudge ? (rw.correct ?? false) : answerMetrics(e.answer, q.golds).em === 1),
          rewardFn,
        })
      : undefined;
  const num = (k: string) => mean(rows.map((x) => x[k] as number));
  const summary: EvalSummary = {
    label: opts.label,
    model: cfg.model.path,
    adapter: opts.adapter,
    split: cfg.eval.split,
    questions: rows.length,
    accuracy: mean(rows.map((x) => (x.correct ? 1 : 0))),
    accuracy_by: byJudge ? 'judge' : 'em',
    em: num('em'),
    subem: num('subem'),
    f1: num('f1'),
    rouge_l: num('rouge_l'),
    reward: num('reward'),
    avg_turns: num('turns'),
    answered: mean(rows.map((x) => (x.answer !== null ? 1 : 0))),
    ...bySource(rows),
    max_turns: cfg.protocol.max_turns_eval,
    temperature: cfg.eval.temperature,
    top_p: cfg.eval.top_p ?? midpoint(cfg.rollout.top_p),
    top_k: cfg.protocol.top_k,
    max_new_tokens: cfg.protocol.max_new_tokens,
    ...(passK ? { pass_k: passK } : {}),
    time_s: (performance.now() - t0) / 1e3,
    date: new Date().toISOString(),
  };
  writeFileSync(join(opts.dir, 'summary.json'), JSON.stringify(summary, null, 2) + '\n');
  return summary;
}

/**
 * pass@k (eval.pass_k = k): k episodes per question, drawn as an RL stage's rollouts draw them
 * (lib/train/rl/rl-loop.ts rolloutRequests: temperature and top-p per episode from rollout.temperature
 * and rollout.top_p, a seed per episode); per question the number correct goes to pass_k.jsonl.
 */
async function passAtK(
  cfg: ResolvedConfig,
  agent: Agent,
  env: Environment,
  qs: readonly Question[],
  opts: {
    label: string;
    dir: string;
    log: Log;
    batch: number;
    progress?: ProgressTo;
    rewardFn: ComposedRewardFn;
    correct: (e: { answer: string | null }, q: Question, rw: { correct?: boolean }) => boolean;
  },
): Promise<NonNullable<EvalSummary['pass_k']>> {
  const k = cfg.eval.pass_k;
  const perChunk = Math.max(1, Math.floor(opts.batch / k));
  const seed = cfg.train.seed * 7919 + 104729;
  const counts: number[] = [];
  const bar = new Progress(`pass@${k} ${opts.label}`, qs.length, 'questions', opts.progress);
  try {
    for (let s = 0; s < qs.length; s += perChunk) {
      const chunk = qs.slice(s, s + perChunk);
      const reqs = rolloutRequests(chunk, s, k, 0, { temperature: cfg.rollout.temperature, topP: cfg.rollout.top_p, seed });
      const runner = episodeRunner(cfg, agent, env, { eval: true, seed, onTurn: (t) => bar.update(s + Math.floor(t.finished / k)) });
      const r = await runner.run(
        reqs.map((q) => ({
          question: q.question.question,
          prompt: q.question.prompt,
          temperature: q.temperature,
          topP: q.topP,
          seed: q.seed,
        })),
      );
      const rewards = await Promise.all(
        r.episodes.map((e, i) =>
          opts.rewardFn({
            answer: e.answer,
            golds: reqs[i].question.golds,
            question: reqs[i].question.question,
            id: reqs[i].question.id,
            episode: { turns: e.turns, messages: e.messages, calls: e.calls, finish: e.finish },
          }),
        ),
      );
      for (let qi = 0; qi < chunk.length; qi++) {
        let c = 0;
        for (let j = qi * k; j < (qi + 1) * k; j++) if (opts.correct(r.episodes[j], chunk[qi], rewards[j])) c++;
        counts.push(c);
      }
      bar.update(s + chunk.length, { detail: `pass@${k} ${mean(counts.map((c) => (c > 0 ? 1 : 0))).toFixed(3)}` });
    }
  } finally {
    bar.stop();
  }
  writeFileSync(
    join(opts.dir, 'pass_k.jsonl'),
    qs.map((q, i) => JSON.stringify({ id: q.id, question: q.question, k, correct: counts[i] })).join('\n') + '\n',
  );
  const out = {
    k,
    pass_at_k: mean(counts.map((c) => (c > 0 ? 1 : 0))),
    sample_accuracy: mean(counts) / k,
    temperature: cfg.rollout.temperature,
    top_p: cfg.rollout.top_p,
  };
  opts.log(`eval ${opts.label}: pass@${k} ${out.pass_at_k.toFixed(3)}, sampled accuracy ${out.sample_accuracy.toFixed(3)}`);
  return out;
}

export async function evalFromConfig(
  cfg: ResolvedConfig,
  opts: EvalOptions = {},
): Promise<{ summary: EvalSummary; dir: string; table: string }> {
  opts.signal?.throwIfAborted();
  const log = opts.log ?? (() => {});
  const adapter = opts.adapter === undefined ? cfg.model.adapter : opts.adapter;
  const label = opts.label ?? evalLabel(adapter);
  if (!/^[\w.@+-]+$/.test(label))
    throw new SlmError(
      'ARGUMENT_INVALID',
      `evaluation label ${JSON.stringify(label)}: expected letters, digits, ".", "_", "-", "+" or "@" (it names a folder).`,
    );
  const qs = await evalQuestions(cfg);
  const dir = join(cfg.run.dir, 'evals', label);
  const agent = await loadAgent(cfg, adapter, log);
  let env: Environment | undefined;
  let judge: { deps: RewardDeps; close(): void } | undefined;
  try {
    env = await openEnvironment(cfg, log, opts.progress, opts);
    judge = await rewardDeps(cfg, log, opts);
    const summary = await evaluate(cfg, agent, env, judge.deps, qs, {
      label,
      adapter,
      dir,
      log,
      batch: opts.batch,
      progress: opts.progress,
      signal: opts.signal,
    });
    const table = comparisonTable(join(cfg.run.dir, 'evals'), cfg.eval.table);
    writeFileSync(join(cfg.run.dir, 'evals', 'comparison.md'), table + '\n');
    return { summary, dir, table };
  } finally {
    await env?.close();
    judge?.close();
    agent.model.dispose();
  }
}

/** A markdown table of every evaluation under `evalsDir` (one row per label, in order of date). */
export function comparisonTable(evalsDir: string, shape: ResolvedConfig['eval']['table'] = 'full'): string {
  const rows: EvalSummary[] = [];
  for (const d of existsSync(evalsDir) ? readdirSync(evalsDir) : []) {
    const f = join(evalsDir, d, 'summary.json');
    if (!existsSync(f)) continue;
    try {
      rows.push(JSON.parse(readFileSync(f, 'utf8')));
    } catch {
      /* a damaged summary is left out */
    }
  }
  rows.sort((a, b) => a.date.localeCompare(b.date));
  if (shape === 'em_rouge_l') {
    // The SFT+PPO report's shape: one row per configuration, EM and ROUGE-L as fractions.
    return [
      '| configuration | EM | ROUGE-L |',
      '|---|---:|---:|',
      ...rows.map((r) => `| ${r.label} | ${r.em.toFixed(3)} | ${r.rouge_l.toFixed(3)} |`),
    ].join('\n');
  }
  const pct = (x: number) => `${(100 * x).toFixed(1)}`;
  const head = '| run | split | n | accuracy % | by | EM % | F1 % | ROUGE-L % | answered % | avg turns | reward |';
  const sep = '|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|';
  const body = rows.map(
    (r) =>
      `| ${r.label} | ${r.split} | ${r.questions} | ${pct(r.accuracy)} | ${r.accuracy_by} | ${pct(r.em)} | ${pct(r.f1)} | ${pct(r.rouge_l)} | ${pct(r.answered)} | ${r.avg_turns.toFixed(2)} | ${r.reward.toFixed(3)} |`,
  );
  return [head, sep, ...body].join('\n');
}
