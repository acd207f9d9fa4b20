/**
 * Answering a program's call to a search primitive, shared by the Python and QuickJS sandboxes:
 * enforce the per-program call limit and the arguments' size, check the name and arguments, run the
 * tool, record the call, and turn any failure into a message the program sees as an exception.
 */
import { isSlmError, SlmError } from '../errors.js';
import type { SearchTools, ToolCall, ToolName } from './types.js';
import { TOOL_NAMES } from './types.js';

const PARAM: Record<ToolName, string> = { search_pages: 'query', view_sections: 'page_id', read_section: 'section_id' };

/** Extra functions programs may call (sandbox.tools_module): JSON arguments, a JSON result. */
// biome-ignore lint/suspicious/noExplicitAny: a tool takes whatever the program passes it (JSON values); its own signature types them.
export type ExtraTools = Record<string, (...args: any[]) => unknown>;

/**
 * The most one tool call may pass, in characters (strings' lengths, 8 for any other value): a
 * longer call is refused with a ValueError the program sees and recorded without its arguments.
 */
export const MAX_TOOL_ARGS_CHARS = 64 * 1024;

/** The size of `v` as MAX_TOOL_ARGS_CHARS counts it, counted no further than past `limit`. */
function argsChars(value: unknown, limit: number, depth = 0): number {
  if (typeof value === 'string') return value.length;
  if (value === null || typeof value !== 'object' || depth > 32) return 8;
  let n = depth ? 2 : 0; // brackets, but not around the argument list
  for (const [k, x] of Array.isArray(value) ? value.entries() : Object.entries(value)) {
    n += (typeof k === 'string' ? k.length : 0) + argsChars(x, limit - n, depth + 1);
    if (n > limit) break;
  }
  return n;
}

export type ToolReply = { ok: true; value: unknown } | { ok: false; error: string; etype: 'ValueError' | 'TypeError' | 'RuntimeError' };

/**
 * Calls a tool for a program; never throws and never rejects. Answers synchronously when the tool is
 * synchronous (QuickJS relies on that: a promise there means suspending the interpreter).
 * `calls` receives the record of the call.
 */
export function invokeTool(
  tools: SearchTools | undefined,
  name: unknown,
  args: unknown,
  calls: ToolCall[],
  maxCalls: number,
  extra?: ExtraTools,
): ToolReply | Promise<ToolReply> {
  const t0 = performance.now();
  const argList = Array.isArray(args) ? args : [args];
  const shownName = typeof name === 'string' && name.length <= 100 ? name : String(name).slice(0, 100);
  let kept = argList;
  const record = (ok: boolean) => calls.push({ name: shownName, args: kept, ok, ms: performance.now() - t0 });
  const fail = (etype: 'ValueError' | 'TypeError' | 'RuntimeError', error: string): ToolReply => {
    record(false);
    return { ok: false, etype, error };
  };
  const failure = (e: unknown): ToolReply => fail('ValueError', isSlmError(e) || e instanceof Error ? e.message : String(e));
  // Calls a tool (sync or async) and turns its result into a JSON reply, or its error into a failure.
  const invoke = (label: string, call: () => unknown): ToolReply | Promise<ToolReply> => {
    const settle = (value: unknown): ToolReply => {
      try {
        const v = toJsonLike(value, `${label} result`);
        record(true);
        return { ok: true, value: v };
      } catch (e) {
        return failure(e);
      }
    };
    try {
      const out = call();
      if (out && typeof (out as Promise<unknown>).then === 'function') return Promise.resolve(out).then(settle, failure);
      return settle(out);
    } catch (e) {
      return failure(e);
    }
  };
  // Past the limit: refused, and recorded once (calls holds at most maxCalls + 1 records).
  if (calls.length >= maxCalls) {
    kept = [];
    const error = `call limit reached: a program may make at most ${maxCalls} tool calls`;
    return calls.length === maxCalls ? fail('RuntimeError', error) : { ok: false, etype: 'RuntimeError', error };
  }
  const size = argsChars(argList, MAX_TOOL_ARGS_CHARS);
  if (size > MAX_TOOL_ARGS_CHARS) {
    kept = []; // refused arguments are not kept
    return fail(
      'ValueError',
      `the arguments of ${shownName}() are too large: at most ${MAX_TOOL_ARGS_CHARS} characters per call, found more than ${MAX_TOOL_ARGS_CHARS}; pass a shorter query or id`,
    );
  }
  const builtin = typeof name === 'string' && (TOOL_NAMES as readonly string[]).includes(name);
  // A tool of sandbox.tools_module (checkTools keeps their names apart from the built-in ones).
  const custom = typeof name === 'string' && !builtin && extra && Object.hasOwn(extra, name);
  if (!builtin && !custom)
    return fail(
      'ValueError',
      `unknown tool ${JSON.stringify(shownName)}; the tools are ${[...TOOL_NAMES, ...Object.keys(extra ?? {})].join(', ')}`,
    );
  // Custom tools: any JSON arguments, a JSON result.
  if (custom) return invoke(name as string, () => extra![name as string](...argList));
  const tool = name as ToolName;
  if (argList.length !== 1 || typeof argList[0] !== 'string')
    return fail('TypeError', `${tool}(${PARAM[tool]}) expects one string argument`);
  if (!tools) return fail('RuntimeError', `${tool} is unavailable: no search corpus is configured for this sandbox`);
  return invoke(tool, () => tools[tool](argList[0] as string));
}

/** Checks that a tool result is made of JSON values only (what both sandboxes can hand to a program). */
function toJsonLike(value: unknown, what: string, depth = 0): unknown {
  if (depth > 32) throw new Error(`${what} is nested too deeply`);
  if (value === null || typeof value === 'string' || typeof value === 'boolean') return value;
  if (value === undefined) return null;
  if (typeof value === 'number') return Number.isFinite(value) ? value : null;
  if (Array.isArray(value)) return value.map((x) => toJsonLike(x, what, depth + 1));
  if (typeof value === 'object' && (Object.getPrototypeOf(value) === Object.prototype || Object.getPrototypeOf(value) === null)) {
    const out: Record<string, unknown> = {};
    for (const [k, x] of Object.entries(value as Record<string, unknown>)) out[k] = toJsonLike(x, what, depth + 1);
    return out;
  }
  throw new Error(`${what} contains a ${Object.prototype.toString.call(value).slice(8, -1)}; tools must return JSON values`);
}

/** A variable name both sandboxes' languages accept (what RunOptions.globals and questionVariable take). */
export const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]*$/;

/**
 * Checks a program's global variables (RunOptions.globals) and returns them as plain JSON values;
 * ARGUMENT_INVALID names the offending entry. Both sandboxes call it before queueing the program.
 */
export function checkGlobals(globals: Record<string, unknown> | undefined): Record<string, unknown> | undefined {
  if (globals === undefined) return undefined;
  if (globals === null || typeof globals !== 'object' || Array.isArray(globals)) {
    throw new SlmError(
      'ARGUMENT_INVALID',
      `Expected globals to be an object of name -> JSON value but received ${Array.isArray(globals) ? 'an array' : String(globals)}.`,
    );
  }
  const out: Record<string, unknown> = {};
  for (const [name, v] of Object.entries(globals)) {
    if (!IDENTIFIER.test(name))
      throw new SlmError(
        'ARGUMENT_INVALID',
        `Expected each global's name to be an identifier (letters, digits, _) but received ${JSON.stringify(name)}.`,
      );
    if ((TOOL_NAMES as readonly string[]).includes(name))
      throw new SlmError(
        'ARGUMENT_INVALID',
        `The global ${JSON.stringify(name)} would hide the search primitive of that name; choose another name.`,
      );
    try {
      out[name] = toJsonLike(v, `global ${name}`);
    } catch (e) {
      throw new SlmError('ARGUMENT_INVALID', `Expected global ${JSON.stringify(name)} to be a JSON value: ${(e as Error).message}.`);
    }
  }
  return out;
}
