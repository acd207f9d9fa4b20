/**
 * Composing reward components into the trainer's reward: `{ total, parts, correct, errors }`.
 *
 * A spec lists terms: a part name, its weight and the component (RewardFn) that computes it. Each
 * distinct component runs once per episode (the judge's correctness and approach terms share one
 * request), every value any component returns is kept in `parts` (logged as `reward/<name>`),
 * and the total is
 *
 *   weighted:        Σ weight_i · value_i
 *   sign_magnitude:  (c >= threshold ? +a : -(1 - a))  +  Σ weight_i · value_i over the other terms
 *                    (c, a: the values of the correctness and approach terms, a clamped to [0, 1];
 *                    their weights unused. The reference project's formula: a right answer earns its
 *                    approach, a wrong one loses what its approach lacked; no answer, c = a = 0,
 *                    gives -1. With `gaveUp`, a pair whose gave-up part is 1 gives its value instead.)
 *
 * A value that could not be computed (null: the judge failed) counts as `failedValue` in its place:
 * weighted, each failed term adds weight · failedValue (default 0); sign_magnitude, a failed
 * correctness or approach value makes the pair give failedValue (default -1, the reference's score
 * of a failed judge call), so a reward of the judge pair alone totals exactly -1. Never silently:
 * `parts.<component>_error` is 1, `errors` says why, `onError` is called, and the result carries
 * `failed: true`; with `onFailure: 'exclude'` also `excluded: true`, which tells the trainers to
 * leave the episode out of the loss (its total is still the penalty, so a consumer that ignores the
 * flag sees the penalty, not a zero). A component that throws or returns a non-finite value is
 * recorded the same way. `correct` comes from the first term whose component gives a verdict (em,
 * subem, the judge), or the term named by `correctFrom`; undefined when none does.
 */
import { SlmError, describe, isSlmError } from '../errors.js';
import { customReward, type CustomRewardFn } from '../extensions.js';
import { sectionDefaults } from '../config/schema.js';
import type { RewardConfig } from '../config/types.js';
import type { TrainEpisode } from '../episodes/runner-types.js';
import type { RewardResult } from './types.js';
import type { ChatMessage } from '../model/tokenizer-types.js';
import { formatReward, matchReward } from './basic.js';
import { parseJudgeConfig, parsePart, type JudgeConfig, type PartConfig } from './config.js';
import { engineJudgeBackend, openAIJudgeBackend, type EngineJudgeOptions, type JudgeBackend } from './judge-backends.js';
import { judgeReward } from './judge.js';
import type { RewardContext, RewardEpisode, RewardFn, RewardParts } from './types.js';

export interface RewardTerm {
  /** The part name: a key of what `fn` returns. */
  name: string;
  weight: number;
  fn: RewardFn;
  /** Label of the component in errors (default: the term's name). */
  component?: string;
}

export type CombineSpec =
  | { kind: 'weighted' }
  | {
      kind: 'sign_magnitude';
      correctness: string;
      approach: string;
      threshold?: number;
      /** When the parts hold `part` = 1 (the judge's `judge_gave_up`), the pair gives `value` (e.g. -1.5). */
      gaveUp?: { part: string; value: number };
    };

/** What happens to an episode whose reward has a failed component. */
export type FailurePolicy = 'penalty' | 'exclude';
const FAILURE_POLICIES: readonly FailurePolicy[] = ['penalty', 'exclude'];

export interface ComposeSpec {
  terms: RewardTerm[];
  combine?: CombineSpec;
  /** The value of a failed term (default: -1 for the sign_magnitude pair, 0 for a weighted term). */
  failedValue?: number;
  /** 'penalty' (default): the failed episode scores with failedValue; 'exclude': also `excluded: true`. */
  onFailure?: FailurePolicy;
  correctFrom?: string;
  /** Called once per failed component and episode, with the reason. */
  onError?: (component: string, message: string, ctx: RewardContext) => void;
}

export interface ComposedReward extends RewardResult {
  /** Why a component failed, by component ({} when none did). */
  errors: Record<string, string>;
  /**
   * Present (true) only when a component failed and the policy is `onFailure: 'exclude'`
   * (`reward.on_failure: exclude`): the trainer leaves the episode out of the loss and counts it.
   * `failed` is then true too; `total` still holds the penalty.
   */
  excluded?: boolean;
}

export type ComposedRewardFn = (ctx: RewardContext) => Promise<ComposedReward>;

function checkSpec(spec: ComposeSpec): void {
  if (!spec || !Array.isArray(spec.terms) || spec.terms.length === 0)
    throw new SlmError(
      'ARGUMENT_INVALID',
      `Expected composeRewards({ terms }) with at least one term, but found ${describe(spec?.terms)}.`,
    );
  const names = new Set<string>();
  for (const t of spec.terms) {
    if (typeof t.name !== 'string' || typeof t.fn !== 'function' || typeof t.weight !== 'number' || !Number.isFinite(t.weight)) {
      throw new SlmError(
        'ARGUMENT_INVALID',
        `Expected each reward term to have a name, a finite weight and a function, but found name ${describe(t.name)}, weight ${describe(t.weight)}.`,
      );
    }
    if (names.has(t.name))
      throw new SlmError(
        'ARGUMENT_INVALID',
        `Expected distinct reward term names, but "${t.name}" appears twice. Give one of them another name.`,
      );
    names.add(t.name);
  }
  const c = spec.combine;
  if (c?.kind === 'sign_magnitude') {
    for (const role of ['correctness', 'approach'] as const) {
      if (!names.has(c[role]))
        throw new SlmError(
          'ARGUMENT_INVALID',
          `Expected the ${role} term of sign_magnitude ("${c[role]}") among the terms (${[...names].join(', ')}), but it is not there.`,
        );
    }
    if (
      c.gaveUp !== undefined &&
      (typeof c.gaveUp.part !== 'string' || typeof c.gaveUp.value !== 'number' || !Number.isFinite(c.gaveUp.value))
    ) {
      throw new SlmError(
        'ARGUMENT_INVALID',
        `Expected sign_magnitude's gaveUp to be { part, value } with a finite value, but found part ${describe(c.gaveUp.part)}, value ${describe(c.gaveUp.value)}.`,
      );
    }
  }
  if (spec.failedValue !== undefined && (typeof spec.failedValue !== 'number' || !Number.isFinite(spec.failedValue))) {
    throw new SlmError(
      'ARGUMENT_INVALID',
      `Expected composeRewards' failedValue to be a finite number, but found ${describe(spec.failedValue)}.`,
    );
  }
  if (spec.onFailure !== undefined && !FAILURE_POLICIES.includes(spec.onFailure)) {
    throw new SlmError(
      'ARGUMENT_INVALID',
      `Expected composeRewards' onFailure to be one of ${FAILURE_POLICIES.join(', ')}, but found ${describe(spec.onFailure)}.`,
    );
  }
}

/** Run each distinct component once; a throw becomes a recorded failure of its terms. */
async function runComponents(terms: RewardTerm[], ctx: RewardContext): Promise<Map<RewardFn, RewardParts>> {
  const fns = [...new Set(terms.map((t) => t.fn))];
  const results = await Promise.all(
    fns.map(async (fn): Promise<RewardParts> => {
      try {
        return await fn(ctx);
      } catch (e) {
        // A custom reward that returned a non-number is a bug in the user's module: the run stops.
        if (isSlmError(e) && e.code === 'REWARD_MODULE_INVALID') throw e;
        const label = terms.find((t) => t.fn === fn)!;
        return { parts: {}, errors: { [label.component ?? label.name]: (e as Error).message } };
      }
    }),
  );
  return new Map(fns.map((fn, i) => [fn, results[i]]));
}

export function composeRewards(spec: ComposeSpec): ComposedRewardFn {
  checkSpec(spec);
  const combine = spec.combine ?? { kind: 'weighted' };
  const failed = spec.failedValue ?? (combine.kind === 'sign_magnitude' ? -1 : 0);
  const exclude = spec.onFailure === 'exclude';
  return async (ctx) => {
    const byFn = await runComponents(spec.terms, ctx);
    const parts: Record<string, number | null> = {};
    const errors: Record<string, string> = {};
    for (const r of byFn.values()) {
      Object.assign(parts, r.parts);
      Object.assign(errors, r.errors);
    }
    const values = new Map<string, number | null>();
    for (const t of spec.terms) {
      const v = byFn.get(t.fn)!.parts[t.name];
      const label = t.component ?? t.name;
      if (v === null || (typeof v === 'number' && Number.isFinite(v))) values.set(t.name, v);
      else {
        values.set(t.name, null);
        parts[t.name] = null;
        errors[label] ??=
          v === undefined
            ? `the component gave no value named "${t.name}" (it gave ${Object.keys(byFn.get(t.fn)!.parts).join(', ') || 'nothing'})`
            : `the component gave ${describe(v)} for "${t.name}"`;
      }
      if (values.get(t.name) === null && !errors[label]) errors[label] = `"${t.name}" could not be computed`;
    }
    for (const c of Object.keys(errors)) {
      parts[`${c}_error`] = 1;
      spec.onError?.(c, errors[c], ctx);
    }
    const val = (name: string) => values.get(name) ?? failed;
    let total = 0;
    let skip = new Set<string>();
    if (combine.kind === 'sign_magnitude') {
      skip = new Set([combine.correctness, combine.approach]);
      const c = values.get(combine.correctness);
      const a = values.get(combine.approach);
      if (c == null || a == null) total += failed;
      else if (combine.gaveUp && parts[combine.gaveUp.part] === 1) total += combine.gaveUp.value;
      else {
        const m = Math.min(1, Math.max(0, a));
        total += c >= (combine.threshold ?? 0.5) ? m : -(1 - m);
      }
    }
    for (const t of spec.terms) if (!skip.has(t.name)) total += t.weight * val(t.name);
    total += 0; // no -0 in the logs
    const from = spec.correctFrom !== undefined ? spec.terms.filter((t) => t.name === spec.correctFrom) : spec.terms;
    const correct = from.map((t) => byFn.get(t.fn)!.correct).find((c) => c !== undefined);
    const out: ComposedReward = { total, parts, errors };
    if (correct !== undefined) out.correct = correct;
    if (Object.keys(errors).length > 0) {
      out.failed = true;
      if (exclude) out.excluded = true;
    }
    return out;
  };
}

// ---------------------------------------------------------------------------------------------
// From the config

export interface RewardDeps {
  /** The judge, already built (overrides reward.judge's backend keys). */
  judgeBackend?: JudgeBackend;
  /** The judge model on the native engine, for `backend: engine` (built by the caller from judge.model_path). */
  judgeEngine?: Pick<EngineJudgeOptions, 'generator' | 'tokenizer' | 'formatter'>;
  onError?: ComposeSpec['onError'];
  /** Environment for judge.api_key_env (default process.env). */
  env?: Record<string, string | undefined>;
  /** The function of reward.module, already imported (lib/extensions.ts loadRewardModule), and its file for messages. */
  customReward?: { fn: CustomRewardFn; file: string };
}

/** The judge backend reward.judge describes. */
function judgeBackendFromConfig(judgeConfig: JudgeConfig, deps: RewardDeps = {}): JudgeBackend {
  if (deps.judgeBackend) return deps.judgeBackend;
  if (judgeConfig.backend === 'openai') {
    if (!judgeConfig.base_url || !judgeConfig.model) {
      throw new SlmError(
        'CONFIG_INVALID',
        `reward.judge: the openai backend needs base_url and model, but found base_url ${describe(judgeConfig.base_url)} and model ${describe(judgeConfig.model)}. Set both (e.g. base_url: http://127.0.0.1:8000/v1).`,
        { path: 'reward.judge' },
      );
    }
    return openAIJudgeBackend({
      baseUrl: judgeConfig.base_url,
      model: judgeConfig.model,
      apiKeyEnv: judgeConfig.api_key_env ?? undefined,
      timeoutMs: judgeConfig.timeout_s * 1000,
      retries: judgeConfig.retries,
      backoffMs: judgeConfig.backoff_s * 1000,
      maxBackoffMs: judgeConfig.max_backoff_s * 1000,
      concurrency: judgeConfig.concurrency,
      maxTokens: judgeConfig.max_tokens,
      temperature: judgeConfig.temperature,
      extraBody: judgeConfig.extra_body,
      env: deps.env,
    });
  }
  if (!deps.judgeEngine) {
    throw new SlmError(
      'CONFIG_INVALID',
      `reward.judge: the judge runs on the native engine (backend: engine${judgeConfig.base_url ? '' : ', the default without base_url'}), but no judge model was loaded for it. Set base_url and model for an OpenAI-compatible endpoint, or load judge.model_path and pass it as judgeEngine.`,
      { path: 'reward.judge' },
    );
  }
  return engineJudgeBackend({
    ...deps.judgeEngine,
    maxNewTokens: judgeConfig.max_new_tokens,
    batchSize: judgeConfig.batch_size,
    ...(judgeConfig.enable_thinking === null ? {} : { enableThinking: judgeConfig.enable_thinking }),
  });
}

function judgeFromConfig(judge: JudgeConfig, deps: RewardDeps): RewardFn {
  return judgeReward({
    backend: judgeBackendFromConfig(judge, deps),
    format: judge.format,
    gaveUpReward: judge.gave_up_reward,
    matchShortcut: judge.match_shortcut,
    approach: judge.approach,
    combine: judge.combine,
    correctnessWeight: judge.correctness_weight,
    approachWeight: judge.approach_weight,
    correctThreshold: judge.correct_threshold,
    maxTrajectoryChars: judge.max_trajectory_chars,
    skipWithoutAnswer: judge.skip_without_answer,
    missingApproach: judge.missing_approach,
    prompt: judge.prompt,
    ...(judge.system_prompt === null ? {} : { systemPrompt: judge.system_prompt }),
  });
}

/** `fn` computed once per context object (the same episode asked twice gets the first answer). */
function oncePerContext(fn: RewardFn): RewardFn {
  const seen = new WeakMap<RewardContext, Promise<RewardParts>>();
  return (ctx) => {
    let p = seen.get(ctx);
    if (!p) seen.set(ctx, (p = fn(ctx)));
    return p;
  };
}

function termOf(part: PartConfig, judge: () => RewardFn, custom: () => RewardFn): RewardTerm {
  switch (part.kind) {
    case 'module':
      return { name: part.name, weight: part.weight, fn: custom(), component: part.name };
    case 'em':
    case 'subem':
    case 'f1':
    case 'rouge_l':
      return { name: part.name, weight: part.weight, fn: matchReward(part.kind, part.name) };
    case 'format':
      return {
        name: part.name,
        weight: part.weight,
        fn: formatReward(
          { noAnswer: part.no_answer, emptyAnswer: part.empty_answer, maxWords: part.max_words, overlong: part.overlong },
          part.name,
        ),
      };
    default: {
      // judge parts read the judge's own names; a custom name is an alias of that value
      const fn = judge();
      if (part.name === part.kind) return { name: part.name, weight: part.weight, fn, component: 'judge' };
      const alias: RewardFn = async (ctx) => {
        const r = await fn(ctx);
        return { ...r, parts: { ...r.parts, [part.name]: r.parts[part.kind] ?? null } };
      };
      return { name: part.name, weight: part.weight, fn: alias, component: 'judge' };
    }
  }
}

/**
 * The reward of a config's `reward` section (lib/config RewardConfig; missing keys take the schema's
 * defaults). With `combine: sign_magnitude` the correctness term is the judge_correctness part (else
 * em, subem) and the approach term the judge_approach part; the threshold is judge.correct_threshold,
 * and judge.gave_up_reward (when a number) is the pair's value for a "gave_up" verdict.
 * judge.combine (the combined `judge` part) defaults to reward.combine.
 * `on_failure` and `failure_value` (null: -1 under sign_magnitude, 0 under weighted) say what a
 * failed component does to the episode (see the module comment).
 */
export function rewardFromConfig(cfg: Partial<RewardConfig> = {}, deps: RewardDeps = {}): ComposedRewardFn {
  const defaults = sectionDefaults('reward');
  const combine = cfg.combine ?? defaults.combine;
  if (combine !== 'weighted' && combine !== 'sign_magnitude')
    throw new SlmError('CONFIG_INVALID', `reward.combine: expected weighted or sign_magnitude, but found ${describe(combine)}.`, {
      path: 'reward.combine',
    });
  const onFailure = cfg.on_failure ?? defaults.on_failure;
  if (!FAILURE_POLICIES.includes(onFailure))
    throw new SlmError(
      'CONFIG_INVALID',
      `reward.on_failure: expected ${FAILURE_POLICIES.join(' or ')}, but found ${describe(onFailure)}.`,
      { path: 'reward.on_failure' },
    );
  const failureValue = cfg.failure_value ?? defaults.failure_value;
  if (failureValue !== null && (typeof failureValue !== 'number' || !Number.isFinite(failureValue))) {
    throw new SlmError(
      'CONFIG_INVALID',
      `reward.failure_value: expected a number or null (null: -1 with sign_magnitude, 0 with weighted), but found ${describe(failureValue)}.`,
      { path: 'reward.failure_value' },
    );
  }
  const raw = cfg.parts ?? defaults.parts;
  if (!Array.isArray(raw) || raw.length === 0)
    throw new SlmError('CONFIG_INVALID', `reward.parts: expected a non-empty list of parts, but found ${describe(raw)}.`, {
      path: 'reward.parts',
    });
  const parts = raw.map((p, i) => parsePart(p, `reward.parts[${i}]`));
  // reward.module: its function is the part `module` (weight 1) unless the parts place it themselves.
  const moduleFile = cfg.module ?? defaults.module;
  if ((moduleFile || deps.customReward) && !parts.some((p) => p.kind === 'module'))
    parts.push({ kind: 'module', weight: 1, name: 'module' });
  const custom = (name: string) => () => {
    const c = deps.customReward;
    if (!c)
      throw new SlmError(
        'CONFIG_INVALID',
        moduleFile
          ? `reward.module ${moduleFile} was not loaded: pass deps.customReward = { fn: await loadRewardModule(file), file } (rewardDeps does this).`
          : 'reward.parts: a {kind: module} part needs reward.module, the file of the reward function.',
        { path: 'reward.module' },
      );
    return customReward(c.fn, name, c.file);
  };
  const parsed = parseJudgeConfig(cfg.judge ?? defaults.judge);
  // judge.combine (the logged `judge` part) follows reward.combine unless set, so that the part
  // shows what the total counts
  const j: JudgeConfig = cfg.judge && 'combine' in cfg.judge ? parsed : { ...parsed, combine };
  let judge: RewardFn | undefined;
  // One judge for every judge part, asked once per episode even where a renamed part wraps it.
  const terms = parts.map((p) => termOf(p, () => (judge ??= oncePerContext(judgeFromConfig(j, deps))), custom(p.name)));
  let spec: ComposeSpec = { terms, onError: deps.onError, onFailure, ...(failureValue === null ? {} : { failedValue: failureValue }) };
  if (combine === 'sign_magnitude') {
    const find = (...kinds: string[]) => kinds.map((k) => parts.find((p) => p.kind === k)).find((p) => p !== undefined);
    const c = find('judge_correctness', 'em', 'subem');
    const a = find('judge_approach');
    if (!c || !a) {
      throw new SlmError(
        'CONFIG_INVALID',
        `reward.combine: sign_magnitude needs a correctness part (judge_correctness, em or subem) and a judge_approach part, but found parts ${parts.map((p) => p.kind).join(', ')}. Add them, or use combine: weighted.`,
        { path: 'reward.combine' },
      );
    }
    const gaveUp = j.gave_up_reward === null ? {} : { gaveUp: { part: 'judge_gave_up', value: j.gave_up_reward } };
    spec = {
      ...spec,
      combine: { kind: 'sign_magnitude', correctness: c.name, approach: a.name, threshold: j.correct_threshold, ...gaveUp },
    };
  }
  return composeRewards(spec);
}

// ---------------------------------------------------------------------------------------------
// For the trainers

/**
 * Gold answers from a question row's answer: a string, a number, a list of them, or Search-R1's
 * `{ target: [...] }`.
 */
export function goldAnswers(answer: unknown): string[] {
  if (typeof answer === 'string') return [answer];
  if (typeof answer === 'number' && Number.isFinite(answer)) return [String(answer)];
  if (Array.isArray(answer) && answer.length > 0 && answer.every((a) => typeof a === 'string' || typeof a === 'number'))
    return answer.map(String);
  if (answer && typeof answer === 'object' && 'target' in answer) return goldAnswers((answer as { target: unknown }).target);
  throw new SlmError(
    'DATA_INVALID',
    `Expected a question's answer to be a string, a number, a list of them, or { target: [...] }, but found ${describe(answer)}.`,
  );
}

/** The reward context of a trainer's episode (TrainEpisode.record carries messages, calls, finish). */
export function episodeContext(
  ep: Pick<TrainEpisode, 'answer' | 'turns' | 'record'>,
  question: string,
  golds: readonly string[],
  id?: string,
): RewardContext {
  const rec = ep.record ?? {};
  const episode: RewardEpisode = { turns: ep.turns };
  if (Array.isArray(rec.messages)) episode.messages = rec.messages as ChatMessage[];
  if (Array.isArray(rec.calls)) episode.calls = rec.calls;
  if (typeof rec.finish === 'string') episode.finish = rec.finish;
  return { answer: ep.answer, golds, question, ...(id !== undefined ? { id } : {}), episode };
}

/** `GrpoDeps.reward` from a composed reward and a way to read a question's text and golds. */
export function trainerReward<Q>(
  fn: ComposedRewardFn,
  read: (q: Q) => { question: string; golds: readonly string[]; id?: string },
): (ep: TrainEpisode, q: Q) => Promise<ComposedReward> {
  return (ep, q) => {
    const { question, golds, id } = read(q);
    return fn(episodeContext(ep, question, golds, id));
  };
}
