/**
 * OpenAI tool calling for the chat endpoint, in the Hermes / Qwen format (what vLLM's `hermes` tool
 * parser reads): the request's `tools` reach the chat template as its `tools` variable (Qwen2.5 and
 * Qwen3 templates list their JSON schemas in the system message inside <tools></tools>), and the
 * model's `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks become the reply's
 * `tool_calls` (streamed as `delta.tool_calls`). Earlier assistant turns' `tool_calls` and `role:
 * tool` results go to the template as transformers passes them (arguments as objects).
 */
import { randomUUID } from 'node:crypto';
import { describe } from '../errors.js';
import { HttpError } from './http.js';

export const TOOL_CALL_START = '<tool_call>';
export const TOOL_CALL_END = '</tool_call>';

/** The most tools a request may define, and the most bytes of their JSON. */
export const MAX_TOOLS = 128;
export const MAX_TOOLS_JSON = 256 << 10;
/** The deepest nesting of objects and lists in `tools` (JSON schemas nest a few levels; thousands overflow the template's stack). */
export const MAX_TOOLS_DEPTH = 64;

/** Whether `v` nests objects / lists deeper than `max` (iterative: a hostile value cannot overflow the stack here). */
function deeper(value: unknown, max: number): boolean {
  const stack: Array<[unknown, number]> = [[value, 0]];
  while (stack.length) {
    const [x, d] = stack.pop()!;
    if (!x || typeof x !== 'object') continue;
    if (d >= max) return true;
    for (const y of Object.values(x)) stack.push([y, d + 1]);
  }
  return false;
}

/** A tool as the chat template receives it (OpenAI's shape). */
export interface ToolDef {
  type: 'function';
  function: { name: string; description?: string; parameters?: Record<string, unknown>; strict?: boolean };
}

/** What a request asks of tools: the definitions rendered into the prompt, and whether replies are parsed for calls. */
export interface ToolRequest {
  tools: ToolDef[];
  /** tool_choice "auto" with tools: render them and parse <tool_call> blocks. "none": neither. */
  active: boolean;
  /** parallel_tool_calls: false keeps only the first call of a reply. */
  parallel: boolean;
}

export interface ToolCall {
  id: string;
  type: 'function';
  function: { name: string; arguments: string };
}

const isObj = (v: unknown): v is Record<string, unknown> => !!v && typeof v === 'object' && !Array.isArray(v);
const bad = (param: string, message: string, code = 'invalid_tools') => new HttpError(400, message, 'invalid_request_error', param, code);
/** OpenAI's rule for function names. */
const NAME = /^[A-Za-z0-9_.:-]{1,64}$/;

/** The request's tools / tool_choice / parallel_tool_calls, checked (a coded 400 naming the parameter). */
export function parseTools(body: Record<string, unknown>): ToolRequest {
  const raw = body.tools;
  const choice = body.tool_choice ?? null;
  const par = body.parallel_tool_calls ?? null;
  if (par !== null && typeof par !== 'boolean')
    throw bad('parallel_tool_calls', `parallel_tool_calls must be true or false, found ${describe(par)}`);
  const tools: ToolDef[] = [];
  if (raw !== undefined && raw !== null) {
    if (!Array.isArray(raw))
      throw bad('tools', `tools must be a list of {type: 'function', function: {name, description, parameters}}, found ${describe(raw)}`);
    if (raw.length > MAX_TOOLS) throw bad('tools', `tools has ${raw.length} entries; this server takes at most ${MAX_TOOLS}`);
    if (deeper(raw, MAX_TOOLS_DEPTH)) throw bad('tools', `tools nests objects and lists more than ${MAX_TOOLS_DEPTH} levels deep`);
    let size: number;
    try {
      size = JSON.stringify(raw).length;
    } catch (e) {
      throw bad('tools', `tools cannot be written as JSON: ${(e as Error).message}`);
    }
    if (size > MAX_TOOLS_JSON) throw bad('tools', `tools is ${size} characters of JSON; this server takes at most ${MAX_TOOLS_JSON}`);
    const seen = new Set<string>();
    raw.forEach((t, i) => {
      const at = `tools[${i}]`;
      if (!isObj(t) || t.type !== 'function')
        throw bad(
          'tools',
          `${at} must be {type: 'function', function: {...}}, found ${describe(t)}${isObj(t) ? ` with type ${describe(t.type)}` : ''}`,
        );
      const f = t.function;
      if (!isObj(f)) throw bad('tools', `${at}.function must be an object with a name, found ${describe(f)}`);
      if (typeof f.name !== 'string' || !NAME.test(f.name))
        throw bad('tools', `${at}.function.name must be 1 to 64 letters, digits, _ . : or -, found ${describe(f.name)}`);
      if (seen.has(f.name)) throw bad('tools', `${at}.function.name '${f.name}' is defined twice`);
      seen.add(f.name);
      if (f.description !== undefined && f.description !== null && typeof f.description !== 'string')
        throw bad('tools', `${at}.function.description must be a string, found ${describe(f.description)}`);
      if (f.parameters !== undefined && f.parameters !== null && !isObj(f.parameters))
        throw bad('tools', `${at}.function.parameters must be a JSON-schema object, found ${describe(f.parameters)}`);
      if (f.strict !== undefined && f.strict !== null && typeof f.strict !== 'boolean')
        throw bad('tools', `${at}.function.strict must be true or false, found ${describe(f.strict)}`);
      if (f.strict === true)
        throw bad(
          'tools',
          `${at}.function.strict: true is not supported: this server does not constrain generation to the schema`,
          'unsupported_tool_choice',
        );
      const fn: ToolDef['function'] = { name: f.name };
      if (typeof f.description === 'string') fn.description = f.description;
      if (isObj(f.parameters)) fn.parameters = f.parameters;
      tools.push({ type: 'function', function: fn });
    });
  }
  if (choice !== null) {
    if (choice === 'required' || isObj(choice))
      throw bad(
        'tool_choice',
        `tool_choice ${JSON.stringify(choice).slice(0, 80)} is not supported: this server does not constrain generation, so it cannot force a call. Use 'auto' (the model decides, its <tool_call> blocks are parsed) or 'none'.`,
        'unsupported_tool_choice',
      );
    if (choice !== 'auto' && choice !== 'none')
      throw bad(
        'tool_choice',
        `tool_choice must be 'auto' or 'none' (named and 'required' choices are not supported), found ${describe(choice)}`,
        'unsupported_tool_choice',
      );
    if (choice === 'auto' && !tools.length) throw bad('tool_choice', "tool_choice 'auto' needs tools", 'invalid_tools');
  }
  return { tools, active: tools.length > 0 && choice !== 'none', parallel: par !== false };
}

/**
 * An assistant message's `tool_calls` as the chat template receives them: each
 * `{type: 'function', function: {name, arguments}}` with the arguments' JSON string parsed into an
 * object (vLLM does the same: Qwen2.5's template writes `arguments | tojson`).
 */
export function templateToolCalls(
  value: unknown,
  where: string,
): Array<{ id?: string; type: 'function'; function: { name: string; arguments: unknown } }> {
  if (!Array.isArray(value)) throw bad('messages', `${where}.tool_calls must be a list, found ${describe(value)}`);
  if (value.length > MAX_TOOLS) throw bad('messages', `${where}.tool_calls has ${value.length} entries; at most ${MAX_TOOLS}`);
  return value.map((c, i) => {
    const at = `${where}.tool_calls[${i}]`;
    if (!isObj(c) || !isObj(c.function) || typeof c.function.name !== 'string' || !c.function.name)
      throw bad('messages', `${at} must be {id, type: 'function', function: {name, arguments}}, found ${describe(c)}`);
    if (c.type !== undefined && c.type !== null && c.type !== 'function')
      throw bad('messages', `${at}.type must be 'function', found ${describe(c.type)}`);
    let args: unknown = c.function.arguments ?? {};
    if (typeof args === 'string') {
      try {
        args = JSON.parse(args);
      } catch (e) {
        throw bad('messages', `${at}.function.arguments is not valid JSON: ${(e as Error).message}`);
      }
    }
    return {
      ...(typeof c.id === 'string' ? { id: c.id } : {}),
      type: 'function' as const,
      function: { name: c.function.name, arguments: args },
    };
  });
}

const newId = () => `chatcmpl-tool-${randomUUID().replace(/-/g, '')}`;

/** A <tool_call> block's JSON as a call (null: not `{"name": string, "arguments"?: object}`). */
function callOf(json: string): ToolCall | null {
  let v: unknown;
  try {
    v = JSON.parse(json);
  } catch {
    return null;
  }
  if (!isObj(v) || typeof v.name !== 'string' || !v.name) return null;
  const args = v.arguments ?? v.parameters ?? {};
  return { id: newId(), type: 'function', function: { name: v.name, arguments: typeof args === 'string' ? args : JSON.stringify(args) } };
}

/** Length of the longest end of `text` that is the beginning (not the whole) of `tag`. */
function partialTag(text: string, tag: string): number {
  for (let n = Math.min(tag.length - 1, text.length); n > 0; n--) if (text.endsWith(tag.slice(0, n))) return n;
  return 0;
}

/** What the parser hands out for a piece of text: content to send, and calls completed. */
export interface ToolDelta {
  content: string;
  calls: ToolCall[];
}

/**
 * Splits a reply's text, as it arrives, into content and tool calls. Text outside <tool_call>
 * blocks is content (text that may be the start of `<tool_call>` is held back until it is not); a
 * block becomes a call when it is closed (or at the end, unclosed) and its JSON is
 * `{"name", "arguments"}`, else its raw text is content. After a call, whitespace-only text between
 * or after calls is dropped. The non-streamed reply runs the same parser over its whole text, so the
 * streamed deltas add up to it.
 */
export class ToolCallParser {
  private buf = '';
  private inCall = false;
  private held = '';
  readonly calls: ToolCall[] = [];
  private contentOut = '';

  constructor(private readonly parallel = true) {}

  push(text: string): ToolDelta {
    this.buf += text;
    return this.drain(false);
  }

  end(): ToolDelta {
    return this.drain(true);
  }

  /** All content handed out (null: none, when there are calls; as OpenAI's message.content). */
  get content(): string | null {
    return this.contentOut === '' && this.calls.length ? null : this.contentOut;
  }

  private drain(final: boolean): ToolDelta {
    const out: ToolDelta = { content: '', calls: [] };
    const emit = (s: string) => {
      if (!s) return;
      // After a call, whitespace between or after calls is no content (unless text follows it).
      if (this.calls.length && !(this.held + s).trim()) {
        this.held += s;
        return;
      }
      out.content += this.held + s;
      this.held = '';
    };
    for (;;) {
      if (!this.inCall) {
        const at = this.buf.indexOf(TOOL_CALL_START);
        if (at < 0) {
          const keep = final ? 0 : partialTag(this.buf, TOOL_CALL_START);
          emit(this.buf.slice(0, this.buf.length - keep));
          this.buf = this.buf.slice(this.buf.length - keep);
          break;
        }
        emit(this.buf.slice(0, at));
        this.buf = this.buf.slice(at + TOOL_CALL_START.length);
        this.inCall = true;
      }
      const close = this.buf.indexOf(TOOL_CALL_END);
      if (close < 0 && !final) break;
      const body = close < 0 ? this.buf : this.buf.slice(0, close);
      const raw = TOOL_CALL_START + body + (close < 0 ? '' : TOOL_CALL_END);
      this.buf = close < 0 ? '' : this.buf.slice(close + TOOL_CALL_END.length);
      this.inCall = false;
      const call = callOf(body.trim());
      if (!call) emit(raw);
      else if (this.parallel || !this.calls.length) {
        this.calls.push(call);
        out.calls.push(call);
        this.held = '';
      }
      if (close < 0) break;
    }
    this.contentOut += out.content;
    return out;
  }
}
