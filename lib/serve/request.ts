/**
 * Request parameters of the OpenAI-compatible endpoints: which parameters are honoured, which are
 * accepted only at their neutral value, and the checks that turn a request body into prompts and
 * the Sampling of its rows (or a 400 naming the parameter at fault).
 */
import { SlmError, describe } from '../errors.js';
import type { ChatMessage } from '../model/tokenizer-types.js';
import { HttpError } from './http.js';
import type { ServeOptions } from './options.js';
import { parseTools, templateToolCalls, type ToolRequest } from './tools.js';

/** The most top log-probs a request may ask for (OpenAI's and vLLM's default limit). */
const MAX_TOP_LOGPROBS = 20;

/** How a request's rows are generated and their text made. */
export interface Sampling {
  maxTokens: number;
  temperature: number;
  topP: number;
  topK: number;
  stop: string[];
  /** The stop token ids of the engine call (the tokenizer's unless ignore_eos, plus stop_token_ids). */
  stopTokenIds: number[];
  keepStop: boolean;
  skipSpecial: boolean;
  /** Log-probs are returned, with this many alternatives per token. */
  logprobs: boolean;
  topN: number;
  adapter: string | null;
}

export const isObj = (v: unknown): v is Record<string, unknown> => !!v && typeof v === 'object' && !Array.isArray(v);

/** Parameters that are honoured, per endpoint. */
const HONOURED_COMMON = [
  'model',
  'max_tokens',
  'temperature',
  'top_p',
  'top_k',
  'seed',
  'stop',
  'stop_token_ids',
  'ignore_eos',
  'n',
  'stream',
  'stream_options',
  'logprobs',
  'include_stop_str_in_output',
  'skip_special_tokens',
  'return_tokens_as_token_ids',
  'add_special_tokens',
  'request_id',
  'user',
];
const HONOURED_CHAT = [
  'messages',
  'max_completion_tokens',
  'top_logprobs',
  'chat_template_kwargs',
  'add_generation_prompt',
  'tools',
  'tool_choice',
  'parallel_tool_calls',
  'response_format',
];
const HONOURED_COMPLETIONS = ['prompt', 'best_of'];

/**
 * Parameters accepted only at the value that leaves generation as it is (their default): any other
 * value is refused with a 400 naming the parameter. [test, the values accepted].
 */
const NEUTRAL: Record<string, [(v: unknown) => boolean, string]> = {
  frequency_penalty: [(v) => v === 0, '0'],
  presence_penalty: [(v) => v === 0, '0'],
  repetition_penalty: [(v) => v === 1, '1'],
  length_penalty: [(v) => v === 1, '1'],
  min_p: [(v) => v === 0, '0'],
  min_tokens: [(v) => v === 0, '0'],
  logit_bias: [(v) => isObj(v) && Object.keys(v).length === 0, '{}'],
  use_beam_search: [(v) => v === false, 'false'],
  echo: [(v) => v === false, 'false'],
  suffix: [(v) => v === '', "''"],
  store: [(v) => v === false, 'false'],
  metadata: [(v) => isObj(v), 'an object (it only labels stored completions, and none are stored)'],
  service_tier: [(v) => v === 'auto' || v === 'default', "'auto' or 'default'"],
  functions: [(v) => Array.isArray(v) && v.length === 0, '[] (the legacy functions are not supported; use tools)'],
  function_call: [
    (v) => v === 'none' || v === 'auto',
    "'none' or 'auto' (the legacy functions are not supported; use tools and tool_choice)",
  ],
  modalities: [(v) => Array.isArray(v) && v.length === 1 && v[0] === 'text', "['text']"],
  spaces_between_special_tokens: [(v) => v === true, 'true'],
  continue_final_message: [(v) => v === false, 'false'],
  priority: [(v) => v === 0, '0'],
};

const param = (name: string, message: string) => new HttpError(400, message, 'invalid_request_error', name);

function number(
  body: Record<string, unknown>,
  name: string,
  d: number,
  lo: number,
  hi: number,
  opts: { integer?: boolean; loOpen?: boolean } = {},
): number {
  const v = Object.hasOwn(body, name) ? body[name] : undefined;
  if (v === undefined || v === null) return d;
  if (
    typeof v !== 'number' ||
    !Number.isFinite(v) ||
    v < lo ||
    (opts.loOpen && v === lo) ||
    v > hi ||
    (opts.integer && !Number.isInteger(v))
  )
    throw param(
      name,
      `${name} must be ${opts.integer ? 'an integer' : 'a number'} from ${lo}${opts.loOpen ? ' (excluded)' : ''} to ${hi}, found ${describe(v)}`,
    );
  return v;
}

function boolean(body: Record<string, unknown>, name: string, d: boolean): boolean {
  const v = Object.hasOwn(body, name) ? body[name] : undefined;
  if (v === undefined || v === null) return d;
  if (typeof v !== 'boolean') throw param(name, `${name} must be true or false, found ${describe(v)}`);
  return v;
}

/** A seed for a row: seeds are any safe integers, the engine takes non-negative ones below 2^53. */
export const rowSeed = (seed: number, choice: number): number => {
  const base = ((seed % 2 ** 53) + 2 ** 53) % 2 ** 53;
  return choice === 0 ? base : (base + choice * 0x9e3779b1) % 2 ** 53;
};

export interface Parsed {
  prompts: number[][];
  /** Chat with tools: what the request asked (active: the reply is parsed for <tool_call> blocks). */
  tools: ToolRequest | null;
  n: number;
  s: Sampling;
  seed: number | null;
  stream: boolean;
  includeUsage: boolean;
  continuousUsage: boolean;
  asIds: boolean;
  requestId: string | null;
}

/** What the checks read from the server: its options and the adapters loaded now. */
interface RequestContext {
  readonly o: ServeOptions;
  readonly adapters: ReadonlyMap<string, string>;
  /** The model ids the server answers to. */
  servedIds(): string[];
}

/** The request's parameters, checked: every one honoured, neutral, or a 400 naming it. */
export function parseRequest(server: RequestContext, chat: boolean, body: Record<string, unknown>): Parsed {
  const { o, adapters } = server;
  const honoured = new Set([...HONOURED_COMMON, ...(chat ? HONOURED_CHAT : HONOURED_COMPLETIONS)]);
  for (const [k, v] of Object.entries(body)) {
    if (honoured.has(k) || v === null || v === undefined) continue;
    // Own properties only: `toString`, `constructor` or `__proto__` must not find Object.prototype's.
    const neutral = Object.hasOwn(NEUTRAL, k) ? NEUTRAL[k] : undefined;
    if (!neutral)
      throw param(
        k,
        `Unrecognized request argument supplied: ${k}. This server does not support it; ${chat ? '/v1/chat/completions' : '/v1/completions'} takes ${[...honoured].join(', ')} (and ${Object.keys(NEUTRAL).join(', ')} at their defaults).`,
      );
    if (!neutral[0](v))
      throw param(k, `${k} is not supported: this server accepts it only as ${neutral[1]}, found ${JSON.stringify(v)?.slice(0, 80)}.`);
  }

  // The model: this server's name or a loaded adapter (or none: the model as started).
  let adapter: string | null = null;
  if (body.model !== undefined && body.model !== null) {
    if (typeof body.model !== 'string') throw param('model', `model must be a string, found ${describe(body.model)}`);
    if (adapters.has(body.model)) adapter = body.model;
    else if (body.model !== o.name)
      throw new HttpError(
        404,
        `The model \`${body.model}\` does not exist. This server serves: ${server.servedIds().join(', ')}.`,
        'invalid_request_error',
        'model',
        'model_not_found',
      );
  }

  const prompts: number[][] = [];
  const addSpecial = boolean(body, 'add_special_tokens', false);
  let tools: ToolRequest | null = null;
  if (chat) {
    tools = parseTools(body);
    responseFormat(body.response_format);
    const msgs = body.messages;
    if (!Array.isArray(msgs) || !msgs.length)
      throw param('messages', 'messages must be a non-empty list of {role, content} with string content');
    const messages = msgs.map((m, i) => message(m, i));
    const kw = body.chat_template_kwargs ?? {};
    if (!isObj(kw)) throw param('chat_template_kwargs', `chat_template_kwargs must be an object, found ${describe(kw)}`);
    const { enable_thinking, ...variables } = kw;
    if (enable_thinking !== undefined && typeof enable_thinking !== 'boolean')
      throw param('chat_template_kwargs', `chat_template_kwargs.enable_thinking must be true or false, found ${describe(enable_thinking)}`);
    const text = renderChat(o, messages, {
      addGenerationPrompt: boolean(body, 'add_generation_prompt', true),
      ...(enable_thinking === undefined ? {} : { enableThinking: enable_thinking }),
      ...(Object.keys(variables).length ? { variables } : {}),
      // tool_choice 'none': the tools are not rendered (and the reply is not parsed for calls).
      ...(tools.active ? { tools: tools.tools } : {}),
    });
    prompts.push(o.tokenizer.encode(text, { addSpecialTokens: addSpecial }));
  } else {
    const p = body.prompt;
    const one = (x: unknown): number[] | null =>
      typeof x === 'string'
        ? o.tokenizer.encode(x, { addSpecialTokens: addSpecial })
        : Array.isArray(x) && x.length && x.every((y) => Number.isInteger(y))
          ? (x as number[])
          : null;
    const single = one(p);
    if (single) prompts.push(single);
    else if (Array.isArray(p) && p.length && p.every((x) => typeof x === 'string' || Array.isArray(x)))
      for (const x of p) prompts.push(one(x) ?? []);
    else throw param('prompt', 'prompt must be a string, a list of token ids, or a non-empty list of either');
  }
  for (const pr of prompts) {
    if (!pr.length) throw param(chat ? 'messages' : 'prompt', 'the prompt is empty');
    for (const id of pr)
      if (id < 0 || id >= o.model.vocabSize)
        throw param(chat ? 'messages' : 'prompt', `token id ${id} is outside the vocabulary [0, ${o.model.vocabSize})`);
  }

  const stopRaw = body.stop;
  const stop =
    stopRaw === undefined || stopRaw === null
      ? []
      : typeof stopRaw === 'string'
        ? [stopRaw]
        : Array.isArray(stopRaw) && stopRaw.every((s) => typeof s === 'string')
          ? (stopRaw as string[])
          : null;
  if (!stop || stop.some((s) => !s)) throw param('stop', 'stop must be a non-empty string or a list of them');
  const extraStops = body.stop_token_ids ?? [];
  if (!Array.isArray(extraStops) || !extraStops.every((x) => Number.isInteger(x) && x >= 0 && x < o.model.vocabSize))
    throw param('stop_token_ids', `stop_token_ids must be a list of token ids in [0, ${o.model.vocabSize}), found ${describe(extraStops)}`);
  const stopTokenIds = [
    ...new Set([...(boolean(body, 'ignore_eos', false) ? [] : o.tokenizer.stopTokenIds), ...(extraStops as number[])]),
  ].sort((a, b) => a - b);

  const limit = o.maxTokensLimit ?? DEFAULT_MAX_TOKENS_LIMIT;
  const maxName = body.max_tokens === undefined || body.max_tokens === null ? 'max_completion_tokens' : 'max_tokens';
  const asked = body[chat ? maxName : 'max_tokens'];
  // Over the server's limit is a 400 (as vLLM refuses a max_tokens past the context), never clamped.
  if (typeof asked === 'number' && Number.isInteger(asked) && asked > limit)
    throw new HttpError(
      400,
      `${chat ? maxName : 'max_tokens'} is ${asked}, over this server's limit of ${limit} (its --max-tokens-limit)`,
      'invalid_request_error',
      chat ? maxName : 'max_tokens',
      'max_tokens_over_limit',
    );
  const maxTokens = number(body, chat ? maxName : 'max_tokens', o.defaultMaxTokens ?? DEFAULT_MAX_TOKENS, 1, limit, { integer: true });
  // vLLM's rule and words: the prompt and the completion must fit the model's context, checked here
  // before the batcher allocates a KV cache for them (a 100,000-token prompt used to be accepted and
  // grew the server until the kernel killed it).
  const maxLen = o.maxModelLen ?? o.model.config.max_position_embeddings;
  for (const pr of prompts)
    if (pr.length + maxTokens > maxLen)
      throw param(
        chat ? 'messages' : 'prompt',
        `This model's maximum context length is ${maxLen} tokens. However, you requested ${pr.length + maxTokens} tokens (${pr.length} in the ${chat ? 'messages' : 'prompt'}, ${maxTokens} in the completion). Please reduce the length of the ${chat ? 'messages' : 'prompt'} or completion.`,
      );
  const maxBatch = o.maxBatch ?? 32;
  const n = number(body, 'n', 1, 1, maxBatch, { integer: true });
  if (n * prompts.length > maxBatch)
    throw param('n', `n x prompts = ${n * prompts.length} rows, over this server's --max-batch ${maxBatch}`);
  if (!chat && body.best_of !== undefined && body.best_of !== null && body.best_of !== n)
    throw param('best_of', `best_of is supported only equal to n (${n}), found ${describe(body.best_of)}`);
  const topK = number(body, 'top_k', 0, -1, 1e9, { integer: true });

  // Log-probs: chat {logprobs: bool, top_logprobs: N}, completions {logprobs: N}.
  let logprobs = false;
  let topN = 0;
  if (chat) {
    logprobs = boolean(body, 'logprobs', false);
    if (body.top_logprobs !== undefined && body.top_logprobs !== null) {
      if (!logprobs) throw param('top_logprobs', 'top_logprobs needs logprobs: true');
      topN = number(body, 'top_logprobs', 0, 0, MAX_TOP_LOGPROBS, { integer: true });
    }
  } else if (body.logprobs !== undefined && body.logprobs !== null) {
    logprobs = true;
    topN = number(body, 'logprobs', 0, 0, MAX_TOP_LOGPROBS, { integer: true });
  }

  const stream = boolean(body, 'stream', false);
  let includeUsage = false;
  let continuousUsage = false;
  if (body.stream_options !== undefined && body.stream_options !== null) {
    if (!stream) throw param('stream_options', 'stream_options needs stream: true');
    const so = body.stream_options;
    if (!isObj(so)) throw param('stream_options', `stream_options must be an object, found ${describe(so)}`);
    for (const k of Object.keys(so))
      if (k !== 'include_usage' && k !== 'continuous_usage_stats')
        throw param('stream_options', `stream_options.${k} is not supported (include_usage and continuous_usage_stats are)`);
    includeUsage = boolean(so, 'include_usage', false);
    // vLLM: usage on every chunk, when the usage is asked for at all.
    continuousUsage = includeUsage && boolean(so, 'continuous_usage_stats', false);
  }
  let seed: number | null = null;
  if (body.seed !== undefined && body.seed !== null) {
    if (!Number.isSafeInteger(body.seed)) throw param('seed', `seed must be an integer, found ${describe(body.seed)}`);
    seed = body.seed as number;
  }
  const user = body.user;
  if (user !== undefined && user !== null && typeof user !== 'string')
    throw param('user', `user must be a string, found ${describe(user)}`);
  const requestId = body.request_id;
  if (requestId !== undefined && requestId !== null && (typeof requestId !== 'string' || !/^[\w.:-]{1,128}$/.test(requestId)))
    throw param('request_id', `request_id must be a string of letters, digits and _ . : - (at most 128), found ${describe(requestId)}`);

  return {
    prompts,
    tools,
    n,
    seed,
    stream,
    includeUsage,
    continuousUsage,
    asIds: boolean(body, 'return_tokens_as_token_ids', false),
    requestId: (requestId as string | undefined) ?? null,
    s: {
      maxTokens,
      temperature: number(body, 'temperature', 1, 0, 2),
      topP: number(body, 'top_p', 1, 0, 1, { loOpen: true }),
      topK: Math.max(topK, 0),
      stop,
      stopTokenIds,
      keepStop: boolean(body, 'include_stop_str_in_output', false),
      skipSpecial: boolean(body, 'skip_special_tokens', true),
      logprobs,
      topN,
      adapter,
    },
  };
}

/**
 * A chat message: role and content (a string, or text parts joined by newlines, as vLLM does); an
 * assistant message may carry tool_calls (its content then may be null), a tool message its
 * tool_call_id.
 */
function message(m: unknown, i: number): ChatMessage {
  const where = `messages[${i}]`;
  if (!isObj(m) || typeof m.role !== 'string')
    throw param('messages', `${where} must be an object with a string role, found ${describe(m)}`);
  const extra = m.role === 'assistant' ? ['tool_calls'] : m.role === 'tool' ? ['tool_call_id'] : [];
  for (const k of Object.keys(m))
    if (k !== 'role' && k !== 'content' && !extra.includes(k) && m[k] !== null && m[k] !== undefined)
      throw param(
        'messages',
        `${where}.${k} is not supported (messages take role and content; assistant messages tool_calls, tool messages tool_call_id)`,
      );
  if (m.role === 'tool' && m.tool_call_id !== undefined && m.tool_call_id !== null && typeof m.tool_call_id !== 'string')
    throw param('messages', `${where}.tool_call_id must be a string, found ${describe(m.tool_call_id)}`);
  if (m.role === 'assistant' && m.tool_calls !== undefined && m.tool_calls !== null) {
    const toolCalls = templateToolCalls(m.tool_calls, where);
    const c = m.content ?? '';
    if (typeof c !== 'string') throw param('messages', `${where}.content must be a string or null beside tool_calls, found ${describe(c)}`);
    return { role: 'assistant', content: c, tool_calls: toolCalls } as ChatMessage;
  }
  let content = m.content;
  if (Array.isArray(content)) {
    if (!content.every((p) => isObj(p) && p.type === 'text' && typeof p.text === 'string'))
      throw param('messages', `${where}.content: only text parts ({type: 'text', text}) are supported`);
    content = content.map((p) => (p as { text: string }).text).join('\n');
  }
  if (typeof content !== 'string')
    throw param('messages', `${where}.content must be a string or a list of text parts, found ${describe(content)}`);
  if (m.role === 'tool' && typeof m.tool_call_id === 'string')
    return { role: 'tool', content, tool_call_id: m.tool_call_id } as ChatMessage;
  return { role: m.role as ChatMessage['role'], content };
}

/**
 * The chat prompt; a template that fails on the request's messages or tools (its raise_exception
 * on a conversation it refuses; a hostile value nested deep enough to overflow its stack) is a 400,
 * as vLLM answers, not a 500.
 */
function renderChat(serveOptions: ServeOptions, messages: ChatMessage[], opts: Parameters<ServeOptions['formatter']['render']>[1]): string {
  try {
    return serveOptions.formatter.render(messages, opts);
  } catch (e) {
    if (e instanceof SlmError && e.code === 'CHAT_TEMPLATE_ERROR')
      throw new HttpError(400, e.message, 'invalid_request_error', 'messages', 'chat_template_error');
    throw e;
  }
}

/**
 * response_format: only {type: 'text'}. JSON output (json_object, json_schema) needs constrained
 * decoding, which this server does not do: a coded 400 rather than a reply that may not parse.
 */
function responseFormat(value: unknown): void {
  if (value === undefined || value === null) return;
  if (isObj(value) && value.type === 'text' && Object.keys(value).length === 1) return;
  const type = isObj(value) && typeof value.type === 'string' ? value.type : null;
  throw new HttpError(
    400,
    type === 'json_object' || type === 'json_schema'
      ? `response_format ${type} is not supported: this server does not constrain generation to JSON. Ask for JSON in the messages and parse the reply, or use tools.`
      : `response_format must be {type: 'text'} (json_object and json_schema are not supported), found ${JSON.stringify(value)?.slice(0, 80)}`,
    'invalid_request_error',
    'response_format',
    'unsupported_response_format',
  );
}

/** max_tokens of a request that names none, and the most one may ask (serve's --max-tokens-default / --max-tokens-limit). */
export const DEFAULT_MAX_TOKENS = 512;
export const DEFAULT_MAX_TOKENS_LIMIT = 4096;
