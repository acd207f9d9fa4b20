/**
 * The metrics of a step's rollouts, shared by the GRPO and PPO rows of metrics.jsonl: reward and its
 * parts, accuracy, answered, turns, response lengths, mask coverage, and the tools' use and errors
 * (from the turn records the EpisodeRunner keeps in each episode's `record`).
 */
import type { RewardResult, TrainEpisode } from '../types.js';

/** One trajectories.jsonl row of a training step (GRPO adds the advantage, PPO the value and return). */
export function trajectoryLine(step: number, question: unknown, e: TrainEpisode, r: RewardResult, extra: Record<string, unknown>): string {
  const errors = r.errors && Object.keys(r.errors).length ? { reward_errors: r.errors } : {};
  return JSON.stringify({
    step,
    question,
    temperature: e.temperature,
    answer: e.answer,
    reward: r.total,
    parts: r.parts,
    ...errors,
    ...extra,
    turns: e.turns,
    ...e.record,
  });
}

export function mean(xs: number[]): number {
  return xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : NaN;
}

interface TurnLike {
  turn?: number;
  action?: string;
  program?: { error?: string | null; timed_out?: boolean };
}
interface CallLike {
  turn?: number;
  ok?: boolean;
}

/**
 * Tool turns of an episode (a program run or a search) and how many of them failed: the program
 * raised or timed out, or a tool call made in that turn failed. Undefined without turn records.
 */
export function toolTurns(record: Record<string, unknown> | undefined): { turns: number; errors: number } | undefined {
  const steps = record?.steps as TurnLike[] | undefined;
  if (!Array.isArray(steps)) return undefined;
  const calls = (Array.isArray(record?.calls) ? record.calls : []) as CallLike[];
  const failedCallTurns = new Set(calls.filter((c) => c.ok === false).map((c) => c.turn));
  const tool = steps.filter((s) => s.action === 'code' || s.action === 'search');
  const errors = tool.filter((s) => !!s.program?.error || !!s.program?.timed_out || failedCallTurns.has(s.turn)).length;
  return { turns: tool.length, errors };
}

export function rolloutMetrics(episodes: readonly TrainEpisode[], rewards: readonly RewardResult[]): Record<string, unknown> {
  const totals = rewards.map((r) => r.total);
  const m = mean(totals);
  const partNames = [...new Set(rewards.flatMap((r) => Object.keys(r.parts)))];
  const genTokens = episodes.map((e) => e.lossMask.reduce((a, b) => a + (b ? 1 : 0), 0));
  const tools = episodes.map((e) => toolTurns(e.record)).filter((x): x is { turns: number; errors: number } => !!x);
  const toolTurnsAll = tools.reduce((a, x) => a + x.turns, 0);
  return {
    reward_mean: m,
    reward_std: Math.sqrt(mean(totals.map((x) => (x - m) ** 2))),
    ...Object.fromEntries(
      partNames.map((p) => [`reward/${p}`, mean(rewards.map((r) => r.parts[p]).filter((x): x is number => typeof x === 'number'))]),
    ),
    accuracy: rewards.some((r) => r.correct !== undefined) ? mean(rewards.map((r) => (r.correct ? 1 : 0))) : undefined,
    answered: mean(episodes.map((e) => (e.answer !== null ? 1 : 0))),
    episodes: episodes.length,
    turns_mean: mean(episodes.map((e) => e.turns)),
    response_tokens_mean: mean(genTokens),
    response_tokens_min: genTokens.length ? Math.min(...genTokens) : undefined,
    response_tokens_max: genTokens.length ? Math.max(...genTokens) : undefined,
    sequence_tokens_mean: mean(episodes.map((e) => e.ids.length)),
    mask_coverage: mean(episodes.map((e, i) => genTokens[i] / Math.max(1, e.ids.length))),
    tool_turns_mean: tools.length ? toolTurnsAll / tools.length : undefined,
    tool_errors_mean: tools.length ? tools.reduce((a, x) => a + x.errors, 0) / tools.length : undefined,
    tool_error_rate: toolTurnsAll ? tools.reduce((a, x) => a + x.errors, 0) / toolTurnsAll : undefined,
  };
}
