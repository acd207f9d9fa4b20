/**
 * The keys of the config's `reward` section that lib/rewards owns (the schema in lib/config leaves
 * `reward.parts[]` items and `reward.judge` open): their defaults and checks, with the same kind
 * of messages as the schema (path, expected, found, did-you-mean for unknown keys).
 *
 *   reward:
 *     combine: weighted | sign_magnitude   # sign_magnitude (the reference): correct +a, wrong -(1 - a)
 *     on_failure: penalty | exclude        # a failed component (judge call): score failure_value, or
 *                                          # also mark the episode excluded: true (default penalty)
 *     failure_value: null                  # null: -1 under sign_magnitude (the reference), 0 weighted
 *     parts:                       # each: kind, weight (default 1), name (default the kind)
 *       - { kind: em }             # em | subem | f1 | rouge_l
 *       - { kind: format, no_answer: 1, empty_answer: 1, max_words: 20, overlong: 0.5 }
 *       - { kind: judge_correctness, weight: 0.75 }   # also judge_approach, judge (combined)
 *     judge:
 *       backend: openai | engine   # default: openai when base_url is set, else engine
 *       base_url, model, api_key_env, timeout_s, retries, backoff_s, max_backoff_s,
 *       concurrency, max_tokens, temperature, extra_body          # openai
 *       model_path, max_new_tokens, batch_size, enable_thinking    # engine (model_path: whoever
 *                                   # loads the engine reads it; null = the caller's choice)
 *       format: binary | graded    # binary (default, the reference's): a JSON {"category":
 *                                  # correct | incorrect | gave_up, "approach_score": 0-100},
 *                                  # correctness 1/0 and approach score / 100; graded: lines
 *                                  # "Correctness: 0-10" / "Approach: 0-10", each / 10
 *       gave_up_reward: null       # binary + sign_magnitude: the value of a "gave_up" verdict
 *                                  # (e.g. -1.5); null = as any wrong answer, -(1 - approach), which
 *                                  # is what the reference's recipe (one answer per call) computes
 *       match_shortcut: true       # an answer equal to or containing a gold (lowercased, trimmed)
 *                                  # is correct with approach 1, without a request (the reference)
 *       skip_without_answer: true  # no answer: correctness 0, approach 0, no request
 *                                  # (sign_magnitude: -1); false: the judge is asked about
 *                                  # "(no answer)" and its correctness is 0 whatever it says
 *                                  # (sign_magnitude: -(1 - approach), the reference's training)
 *       missing_approach: error    # binary: a verdict without approach_score is a failed call
 *                                  # (error: the reference's recipe, -1) or approach 0 (zero)
 *       prompt: slm-train          # or reference: the reference code-search system's own prompt
 *                                  # (binary, approach on, no system_prompt)
 *       approach, combine (default: reward.combine), correctness_weight, approach_weight, correct_threshold,
 *       max_trajectory_chars, system_prompt                       # judging (judge.combine only
 *                                  # shapes the combined `judge` part; reward.combine the total)
 */
import { SlmError, closest, describe } from '../errors.js';
import { MAX_TIMEOUT_S } from '../sandbox/types.js';

const PART_KINDS = ['em', 'subem', 'f1', 'rouge_l', 'format', 'judge', 'judge_correctness', 'judge_approach', 'module'] as const;
export type PartKind = (typeof PART_KINDS)[number];

export interface PartConfig {
  kind: PartKind;
  weight: number;
  /** The part's name in the logs (default: the kind). */
  name: string;
  /** format only */
  no_answer?: number;
  empty_answer?: number;
  max_words?: number | null;
  overlong?: number;
}

export interface JudgeConfig {
  backend: 'openai' | 'engine';
  base_url: string | null;
  model: string | null;
  api_key_env: string | null;
  timeout_s: number;
  retries: number;
  backoff_s: number;
  max_backoff_s: number;
  concurrency: number;
  max_tokens: number;
  temperature: number;
  extra_body: Record<string, unknown>;
  model_path: string | null;
  max_new_tokens: number;
  batch_size: number;
  enable_thinking: boolean | null;
  format: 'binary' | 'graded';
  gave_up_reward: number | null;
  match_shortcut: boolean;
  approach: boolean;
  combine: 'weighted' | 'sign_magnitude';
  correctness_weight: number;
  approach_weight: number;
  correct_threshold: number;
  max_trajectory_chars: number;
  skip_without_answer: boolean;
  missing_approach: 'error' | 'zero';
  prompt: 'slm-train' | 'reference';
  system_prompt: string | null;
}

type Check = (v: unknown) => boolean;
interface KeySpec {
  check: Check;
  expected: string;
}

const num = (min = -Infinity, max = Infinity): KeySpec => ({
  check: (v) => typeof v === 'number' && Number.isFinite(v) && v >= min && v <= max,
  expected: `a number${min > -Infinity ? ` >= ${min}` : ''}${max < Infinity ? ` and <= ${max}` : ''}`,
});
const int = (min: number): KeySpec => ({ check: (v) => Number.isInteger(v) && (v as number) >= min, expected: `an integer >= ${min}` });
const orNull = (s: KeySpec): KeySpec => ({ check: (v) => v === null || s.check(v), expected: `${s.expected} or null` });
const str: KeySpec = { check: (v) => typeof v === 'string' && v.length > 0, expected: 'a non-empty string' };
const bool: KeySpec = { check: (v) => typeof v === 'boolean', expected: 'true or false' };
const oneOf = (...vs: string[]): KeySpec => ({ check: (v) => vs.includes(v as string), expected: `one of ${vs.join(', ')}` });
const obj: KeySpec = { check: (v) => typeof v === 'object' && v !== null && !Array.isArray(v), expected: 'an object' };

const JUDGE_KEYS: Record<keyof JudgeConfig, KeySpec> = {
  backend: oneOf('openai', 'engine'),
  base_url: orNull(str),
  model: orNull(str),
  api_key_env: orNull(str),
  timeout_s: num(0.001, MAX_TIMEOUT_S),
  retries: int(0),
  backoff_s: num(0),
  max_backoff_s: num(0),
  concurrency: int(1),
  max_tokens: int(1),
  temperature: num(0),
  extra_body: obj,
  model_path: orNull(str),
  max_new_tokens: int(1),
  batch_size: int(1),
  enable_thinking: orNull(bool),
  format: oneOf('binary', 'graded'),
  gave_up_reward: orNull(num()),
  match_shortcut: bool,
  approach: bool,
  combine: oneOf('weighted', 'sign_magnitude'),
  correctness_weight: num(),
  approach_weight: num(),
  correct_threshold: num(0, 1),
  max_trajectory_chars: int(100),
  skip_without_answer: bool,
  missing_approach: oneOf('error', 'zero'),
  prompt: oneOf('slm-train', 'reference'),
  system_prompt: orNull(str),
};

const JUDGE_DEFAULTS: Omit<JudgeConfig, 'backend'> = {
  base_url: null,
  model: null,
  api_key_env: null,
  timeout_s: 60,
  retries: 3,
  backoff_s: 1,
  max_backoff_s: 30,
  concurrency: 8,
  max_tokens: 1024,
  temperature: 0,
  extra_body: {},
  model_path: null,
  max_new_tokens: 1024,
  batch_size: 16,
  enable_thinking: null,
  format: 'binary',
  gave_up_reward: null,
  match_shortcut: true,
  approach: true,
  combine: 'weighted',
  correctness_weight: 0.75,
  approach_weight: 0.25,
  correct_threshold: 0.7,
  max_trajectory_chars: 12000,
  skip_without_answer: true,
  missing_approach: 'error',
  prompt: 'slm-train',
  system_prompt: null,
};

const FORMAT_KEYS: Record<string, KeySpec> = { no_answer: num(0), empty_answer: num(0), max_words: orNull(int(1)), overlong: num(0) };
const COMMON_PART_KEYS: Record<string, KeySpec> = { kind: oneOf(...PART_KINDS), weight: num(), name: str };

function checkObject(v: unknown, path: string): Record<string, unknown> {
  if (typeof v !== 'object' || v === null || Array.isArray(v))
    throw new SlmError('CONFIG_INVALID', `${path}: expected an object, but found ${describe(v)}.`, { path });
  return v as Record<string, unknown>;
}

function checkKeys(section: Record<string, unknown>, specs: Record<string, KeySpec>, path: string, what: string): void {
  for (const [k, v] of Object.entries(section)) {
    const spec = specs[k];
    if (!spec) {
      const hint = closest(k, Object.keys(specs));
      throw new SlmError(
        'CONFIG_UNKNOWN_KEY',
        `${path}: unknown key "${k}" for ${what}${hint ? `; did you mean "${hint}"?` : ''} Known keys: ${Object.keys(specs).join(', ')}.`,
        { path: `${path}.${k}` },
      );
    }
    if (!spec.check(v))
      throw new SlmError('CONFIG_INVALID', `${path}.${k}: expected ${spec.expected}, but found ${describe(v)}.`, { path: `${path}.${k}` });
  }
}

/** One `reward.parts[i]` item, checked, with its defaults. */
export function parsePart(value: unknown, path = 'reward.parts[0]'): PartConfig {
  const o = checkObject(value, path);
  if (o.kind === undefined)
    throw new SlmError('CONFIG_INVALID', `${path}: expected a "kind" (${PART_KINDS.join(', ')}), but found none.`, { path });
  if (typeof o.kind === 'string' && !(PART_KINDS as readonly string[]).includes(o.kind)) {
    const hint = closest(o.kind, PART_KINDS);
    throw new SlmError(
      'CONFIG_INVALID',
      `${path}.kind: expected one of ${PART_KINDS.join(', ')}, but found "${o.kind}"${hint ? `; did you mean "${hint}"?` : '.'}`,
      { path: `${path}.kind` },
    );
  }
  checkKeys(o, o.kind === 'format' ? { ...COMMON_PART_KEYS, ...FORMAT_KEYS } : COMMON_PART_KEYS, path, `a "${String(o.kind)}" part`);
  return { weight: 1, name: o.kind as string, ...(o as Partial<PartConfig>) } as PartConfig;
}

/** `reward.judge`, checked, with its defaults. */
export function parseJudgeConfig(value: unknown, path = 'reward.judge'): JudgeConfig {
  const o = checkObject(value ?? {}, path);
  checkKeys(o, JUDGE_KEYS, path, 'the judge');
  const c = { ...JUDGE_DEFAULTS, ...(o as Partial<JudgeConfig>) };
  if (c.gave_up_reward !== null && c.format !== 'binary') {
    throw new SlmError(
      'CONFIG_INVALID',
      `${path}.gave_up_reward: only the binary format has a "gave_up" verdict, but format is ${c.format}. Set format: binary, or gave_up_reward: null.`,
      { path: `${path}.gave_up_reward` },
    );
  }
  if (c.prompt === 'reference' && (c.format !== 'binary' || !c.approach || c.system_prompt !== null)) {
    throw new SlmError(
      'CONFIG_INVALID',
      `${path}.prompt: reference is the reference code-search system's own prompt, which asks for the binary verdict with an approach score and has no system prompt; it needs format: binary, approach: true and system_prompt: null (found ${c.format}, ${c.approach}, ${c.system_prompt === null ? 'null' : 'a system prompt'}).`,
      { path: `${path}.prompt` },
    );
  }
  return { backend: c.base_url ? 'openai' : 'engine', ...c } as JudgeConfig;
}
