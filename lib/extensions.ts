/**
 * User code named by a config, without forking: `reward.module` (a reward function, as verl's
 * custom_reward_function path or TRL's reward_funcs) and `sandbox.tools_module` (extra functions
 * that model-written programs can call beside the search tools). Both are JavaScript ES modules
 * (.js / .mjs; a .ts file needs a Node that strips types itself, 22.6+ with
 * --experimental-strip-types or 23.6+), imported once, when the run starts.
 *
 *   // reward.mjs                                  // tools.mjs
 *   export function reward(ctx) {                  export const tools = {
 *     return ctx.answer?.startsWith('A:') ? 1 : 0;   word_count: (text) => text.split(/\s+/).length,
 *   }                                              };
 *
 * A module that cannot be imported, or lacks the export, is REWARD_MODULE_INVALID /
 * TOOLS_MODULE_INVALID naming the file; so is a reward function that returns anything but a finite
 * number or `{ score: number, parts?, correct? }` (the message names the file, the question and the
 * value). A reward function that throws counts as a failed reward component (reward.on_failure),
 * as a failed judge call does.
 */
import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { SlmError, describe } from './errors.js';
import type { RewardContext, RewardFn, RewardParts } from './rewards/types.js';
import { TOOL_NAMES } from './sandbox/types.js';
import { IDENTIFIER } from './sandbox/tools.js';

/** What a custom reward function receives: the episode's answer, golds, question and trajectory. */
export interface CustomRewardContext extends RewardContext {
  /** The question's id (its `id` field, or its position in the file). */
  id?: string;
}

/** A finite number, or a score with extra named values (logged as reward/<name>) and a verdict. */
export type CustomRewardValue = number | { score: number; parts?: Record<string, number>; correct?: boolean };

/** A user's reward function (the export of a `reward.module`). */
export type CustomRewardFn = (ctx: CustomRewardContext) => CustomRewardValue | Promise<CustomRewardValue>;

/** A user's tool: JSON arguments in, a JSON value (or a promise of one) out. */
// biome-ignore lint/suspicious/noExplicitAny: a tool takes whatever the program passes it (JSON values); its own signature types them.
export type CustomTool = (...args: any[]) => unknown;
export type CustomTools = Record<string, CustomTool>;

async function importModule(
  file: string,
  code: 'REWARD_MODULE_INVALID' | 'TOOLS_MODULE_INVALID',
  key: string,
): Promise<Record<string, unknown>> {
  const abs = resolve(file);
  if (!existsSync(abs))
    throw new SlmError(code, `${key}: ${abs} does not exist. Expected a JavaScript module (.js or .mjs).`, { path: key });
  try {
    return (await import(pathToFileURL(abs).href)) as Record<string, unknown>;
  } catch (e) {
    const ts = /\.[mc]?ts$/.test(abs)
      ? ' (a .ts module needs a Node that strips types: 22.6+ with --experimental-strip-types, or 23.6+; else compile it to .js)'
      : '';
    throw new SlmError(code, `${key}: ${abs} could not be imported${ts}: ${(e as Error)?.message ?? String(e)}`, { path: key });
  }
}

/**
 * Turns a custom reward function into a reward component giving the part `name`; a value that is not
 * a finite number (or `{ score }` with one) throws REWARD_MODULE_INVALID naming `file` and the question.
 */
export function customReward(fn: CustomRewardFn, name = 'module', file = '<function>'): RewardFn {
  if (typeof fn !== 'function')
    throw new SlmError('REWARD_MODULE_INVALID', `${file}: expected a reward function, but found ${describe(fn)}.`);
  return async (ctx: CustomRewardContext): Promise<RewardParts> => {
    const v = await fn(ctx);
    const q = `question ${ctx.id !== undefined ? JSON.stringify(ctx.id) : JSON.stringify(ctx.question.slice(0, 80))}`;
    const bad = (what: string) =>
      new SlmError(
        'REWARD_MODULE_INVALID',
        `${file}: the reward function returned ${what} for ${q}; expected a finite number or { score: number, parts?: { name: number }, correct?: boolean }.`,
      );
    if (typeof v === 'number') {
      if (!Number.isFinite(v)) throw bad(String(v));
      return { parts: { [name]: v } };
    }
    if (!v || typeof v !== 'object' || typeof v.score !== 'number' || !Number.isFinite(v.score)) throw bad(describe(v));
    const parts: Record<string, number | null> = {};
    for (const [k, x] of Object.entries(v.parts ?? {})) {
      if (typeof x !== 'number' || !Number.isFinite(x)) throw bad(`parts.${k} = ${describe(x)}`);
      parts[k] = x;
    }
    parts[name] = v.score;
    return { parts, ...(typeof v.correct === 'boolean' ? { correct: v.correct } : {}) };
  };
}

/** The reward function of a module: its `reward` export, else its default export. */
export async function loadRewardModule(file: string, key = 'reward.module'): Promise<CustomRewardFn> {
  const m = await importModule(file, 'REWARD_MODULE_INVALID', key);
  const fn = typeof m.reward === 'function' ? m.reward : m.default;
  if (typeof fn !== 'function')
    throw new SlmError(
      'REWARD_MODULE_INVALID',
      `${key}: ${resolve(file)} exports no reward function; expected \`export function reward(ctx) { return 1 }\` or a default export, found exports ${Object.keys(m).join(', ') || 'none'}.`,
      { path: key },
    );
  return fn as CustomRewardFn;
}

/** Checks a tools object: identifiers mapping to functions, not named like a built-in. */
export function checkTools(tools: unknown, file = '<tools>', key = 'sandbox.tools_module'): CustomTools {
  if (!tools || typeof tools !== 'object' || Array.isArray(tools))
    throw new SlmError(
      'TOOLS_MODULE_INVALID',
      `${key}: ${file} must export \`tools\` (or a default export): an object of name -> function, but found ${describe(tools)}.`,
      { path: key },
    );
  const reserved = new Set<string>([...TOOL_NAMES, 'final_answer', 'exit', 'quit', 'print', 'console']);
  const out: CustomTools = {};
  for (const [name, fn] of Object.entries(tools as Record<string, unknown>)) {
    if (!IDENTIFIER.test(name))
      throw new SlmError(
        'TOOLS_MODULE_INVALID',
        `${key}: ${file}: tool name ${JSON.stringify(name)} is not an identifier (letters, digits, _).`,
        { path: key },
      );
    if (reserved.has(name))
      throw new SlmError('TOOLS_MODULE_INVALID', `${key}: ${file}: tool name "${name}" is taken by a built-in; choose another name.`, {
        path: key,
      });
    if (typeof fn !== 'function')
      throw new SlmError('TOOLS_MODULE_INVALID', `${key}: ${file}: tool "${name}" is ${describe(fn)}; expected a function.`, { path: key });
    out[name] = fn as CustomTool;
  }
  if (!Object.keys(out).length)
    throw new SlmError('TOOLS_MODULE_INVALID', `${key}: ${file} exports no tools (an empty object).`, { path: key });
  return out;
}

/** The tools of a module: its `tools` export, else its default export. */
export async function loadToolsModule(file: string, key = 'sandbox.tools_module'): Promise<CustomTools> {
  const m = await importModule(file, 'TOOLS_MODULE_INVALID', key);
  return checkTools(m.tools ?? m.default, resolve(file), key);
}
