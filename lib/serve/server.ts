/**
 * An OpenAI-compatible server over the native engine: `POST /v1/chat/completions` (messages rendered
 * with the model's chat template), `POST /v1/completions` (a prompt string or token ids, or a list
 * of them), `GET /v1/models`, `GET /health`. What it accepts follows OpenAI's API reference, with
 * vLLM's extra sampling parameters; every parameter it accepts is honoured, or accepted only at the
 * value that changes nothing (e.g. `presence_penalty: 0`), and anything else is a 400 that names the
 * parameter (as OpenAI answers "Unrecognized request argument").
 *
 * - Batching: while a generate call runs, new requests queue, and the next call takes every queued
 *   row (up to `maxBatch`) in one batched native call with per-row temperature, top_p, seed and
 *   max_tokens. top_k, stop strings, stop token ids and the adapter apply per call, so a call mixes only
 *   rows that agree on them. A row leaves the call when it finishes, and its reply is sent then.
 * - `n` choices are n rows of the same call, choice i seeded from (seed, i) (choice 0 with the seed
 *   itself, so it equals the n = 1 reply).
 * - Streaming (`stream: true`): Server-Sent Events in OpenAI's chunk format, each token sent as the
 *   engine samples it (the native call reports every decode step). Text that could be the start of a
 *   stop string is held back until it is not, so the streamed pieces add up to the non-streamed text
 *   for the same seed (lib/serve/text.ts). `stream_options.include_usage` ends with a usage chunk.
 *   A client that disconnects (streaming or not) cancels its rows: they leave the batch at the next
 *   decode step, and a call whose rows all left ends.
 * - Log-probs: chat `logprobs` / `top_logprobs`, completions `logprobs: N`, are the engine's own:
 *   log softmax(logits / temperature) (temperature 1 for greedy rows) of the sampled token and of the
 *   N most likely ones, before top-k / top-p.
 * - An unknown `model` is a 404 that lists the served ids (the model's name and the loaded adapters).
 *
 * LoRA adapters at run time, as vLLM serves them (`--enable-lora`): POST /v1/load_lora_adapter
 * {lora_name, lora_path} (a PEFT folder) and POST /v1/unload_lora_adapter {lora_name}; a request
 * whose `model` is a loaded adapter's name runs with that adapter (the engine holds one adapter at a
 * time, so a call is one adapter's rows, and the adapter is swapped between calls). With
 * `return_tokens_as_token_ids` log-prob tokens are "token_id:N" (what lib/engine/openai-rollout.ts
 * reads).
 */
import { randomUUID } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Model } from '../engine/model.js';
import type { TokenEvent } from '../engine/types.js';
import { describe } from '../errors.js';
import type { ChatFormatter } from '../model/chat.js';
import type { HfTokenizer } from '../model/tokenizer.js';
import type { ChatMessage } from '../model/tokenizer-types.js';
import { HttpError, closeServer, listen, readBody, sendJson } from './http.js';
import { readAdapterConfig } from '../engine/adapter.js';
import { IncrementalText } from './text.js';

export interface ServeOptions {
  model: Model;
  tokenizer: HfTokenizer;
  formatter: ChatFormatter;
  /** The name reported by /v1/models and in responses. */
  name: string;
  port: number;
  host?: string;
  /** Rows per batched generate call (default 32); also the largest `n`. */
  maxBatch?: number;
  /** Default and upper bound of max_tokens (default 512 / 4096). */
  defaultMaxTokens?: number;
  maxTokensLimit?: number;
  log?: (line: string) => void;
  /** The adapter the model was loaded with (requests naming no loaded adapter run with it). */
  adapter?: string;
}

/** The most top log-probs a request may ask for (OpenAI's and vLLM's default limit). */
const MAX_TOP_LOGPROBS = 20;

/** How a request's rows are generated and their text made. */
interface Sampling {
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

type Top = { ids: Int32Array; logprobs: Float32Array } | undefined;

interface RowResult {
  text: string;
  finish: 'stop' | 'length' | 'cancelled';
}

/** One choice of one request: a row of a generate call. */
class Job {
  readonly ids: number[] = [];
  readonly logprobs: number[] = [];
  readonly top: Top[] = [];
  readonly abort = new AbortController();
  readonly result: Promise<RowResult>;
  ended = false;
  /** Streaming: text that can be sent now (and, at the end, the row's result). */
  listener?: (piece: string, end?: RowResult) => void;
  private text: IncrementalText;
  private settle!: { resolve: (r: RowResult) => void; reject: (e: Error) => void };

  constructor(
    readonly prompt: Int32Array,
    readonly s: Sampling,
    readonly seed: number,
    decode: (ids: number[]) => string,
  ) {
    this.text = new IncrementalText(decode, s.stop, s.keepStop);
    this.result = new Promise((resolve, reject) => (this.settle = { resolve, reject }));
    this.result.catch(() => {}); // a failed call rejects every row; the request handler reports it
  }

  /** A sampled token of this row (from the engine, as it is sampled). */
  token(ev: TokenEvent): void {
    if (this.ended) return;
    this.ids.push(ev.token);
    this.logprobs.push(ev.logprob);
    this.top.push(ev.top);
    // A stop token ends the text unseen unless include_stop_str_in_output (vLLM). Only a streamed
    // row decodes as it goes (its listener is set before the call starts); the others decode once.
    if (this.listener && (ev.finish !== 'stop_token' || this.s.keepStop)) this.text.push(ev.token);
    if (ev.finish) this.end(ev.finish);
    else this.listener?.(this.text.take());
  }

  end(reason: 'stop_token' | 'stop_string' | 'length' | 'cancelled'): void {
    if (this.ended) return;
    this.ended = true;
    if (reason === 'cancelled') {
      this.settle.resolve({ text: '', finish: 'cancelled' });
      return;
    }
    const textIds = reason === 'stop_token' && !this.s.keepStop ? this.ids.slice(0, -1) : this.ids;
    const { text, rest, cut } = this.text.finish(textIds);
    const r: RowResult = { text, finish: reason === 'length' && !cut ? 'length' : 'stop' };
    this.listener?.(rest, r);
    this.settle.resolve(r);
  }

  fail(e: Error): void {
    if (this.ended) return;
    this.ended = true;
    this.settle.reject(e);
  }

  get mismatch(): boolean {
    return this.text.mismatch;
  }
}

// ---------------------------------------------------------------------------------------------
// Request parameters

const isObj = (v: unknown): v is Record<string, unknown> => !!v && typeof v === 'object' && !Array.isArray(v);

/** Parameters that are honoured, per endpoint. */
const HONOURED_COMMON = [
  'model', 'max_tokens', 'temperature', 'top_p', 'top_k', 'seed', 'stop', 'stop_token_ids', 'ignore_eos', 'n', 'stream', 'stream_options', 'logprobs',
  'include_stop_str_in_output', 'skip_special_tokens', 'return_tokens_as_token_ids', 'add_special_tokens', 'request_id', 'user',
];
const HONOURED_CHAT = ['messages', 'max_completion_tokens', 'top_logprobs', 'chat_template_kwargs', 'add_generation_prompt'];
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
  tools: [(v) => Array.isArray(v) && v.length === 0, '[] (tool calls are not supported)'],
  functions: [(v) => Array.isArray(v) && v.length === 0, '[] (function calls are not supported)'],
  tool_choice: [(v) => v === 'none' || v === 'auto', "'none' or 'auto' (there are no tools)"],
  function_call: [(v) => v === 'none' || v === 'auto', "'none' or 'auto' (there are no functions)"],
  parallel_tool_calls: [(v) => typeof v === 'boolean', 'true or false (there are no tools)'],
  response_format: [(v) => isObj(v) && v.type === 'text' && Object.keys(v).length === 1, "{type: 'text'}"],
  modalities: [(v) => Array.isArray(v) && v.length === 1 && v[0] === 'text', "['text']"],
  spaces_between_special_tokens: [(v) => v === true, 'true'],
  continue_final_message: [(v) => v === false, 'false'],
  priority: [(v) => v === 0, '0'],
};

const param = (name: string, message: string) => new HttpError(400, message, 'invalid_request_error', name);

function number(body: Record<string, unknown>, name: string, d: number, lo: number, hi: number, opts: { integer?: boolean; loOpen?: boolean } = {}): number {
  const v = body[name];
  if (v === undefined || v === null) return d;
  if (typeof v !== 'number' || !Number.isFinite(v) || v < lo || (opts.loOpen && v === lo) || v > hi || (opts.integer && !Number.isInteger(v)))
    throw param(name, `${name} must be ${opts.integer ? 'an integer' : 'a number'} from ${lo}${opts.loOpen ? ' (excluded)' : ''} to ${hi}, found ${describe(v)}`);
  return v;
}

function boolean(body: Record<string, unknown>, name: string, d: boolean): boolean {
  const v = body[name];
  if (v === undefined || v === null) return d;
  if (typeof v !== 'boolean') throw param(name, `${name} must be true or false, found ${describe(v)}`);
  return v;
}

/** A seed for a row: seeds are any safe integers, the engine takes non-negative ones below 2^53. */
const rowSeed = (seed: number, choice: number): number => {
  const base = ((seed % 2 ** 53) + 2 ** 53) % 2 ** 53;
  return choice === 0 ? base : (base + choice * 0x9e3779b1) % 2 ** 53;
};

interface Parsed {
  prompts: number[][];
  n: number;
  s: Sampling;
  seed: number | null;
  stream: boolean;
  includeUsage: boolean;
  continuousUsage: boolean;
  asIds: boolean;
  requestId: string | null;
}

// ---------------------------------------------------------------------------------------------

export class OpenAIServer {
  readonly server: Server;
  private queue: Job[] = [];
  private busy = false;
  private seq = 0;
  /** Generate calls made and rows per call (tests and logs). */
  readonly batches: number[] = [];
  /** Each finished generate call: its rows, decode steps and how each row ended (tests and logs). */
  readonly calls: Array<{ rows: number; steps: number; finish: string[] }> = [];
  /** Adapters loaded at run time: name -> PEFT folder. */
  readonly adapters = new Map<string, string>();
  private active: string | null = null;
  private bytes: Uint8Array[] | null = null;

  constructor(readonly o: ServeOptions) {
    this.server = createServer((req, res) => void this.handle(req, res));
  }

  listen(): Promise<number> {
    return listen(this.server, this.o.port, this.o.host);
  }

  close(): Promise<void> {
    return closeServer(this.server);
  }

  /** The model ids this server answers to: its name, then the loaded adapters. */
  servedIds(): string[] {
    return [this.o.name, ...this.adapters.keys()];
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    try {
      const url = (req.url ?? '/').split('?')[0].replace(/\/+$/, '');
      if (req.method === 'GET' && (url === '/health' || url === '')) return sendJson(res, 200, { status: 'ok' });
      if (req.method === 'GET' && url === '/v1/models') {
        const created = Math.floor(Date.now() / 1000);
        const data = [
          { id: this.o.name, object: 'model', created, owned_by: 'slm-train', root: this.o.name, parent: null },
          ...[...this.adapters].map(([id, path]) => ({ id, object: 'model', created, owned_by: 'slm-train', root: path, parent: this.o.name })),
        ];
        return sendJson(res, 200, { object: 'list', data });
      }
      const lora = url === '/v1/load_lora_adapter' || url === '/v1/unload_lora_adapter';
      if (req.method !== 'POST' || (url !== '/v1/chat/completions' && url !== '/v1/completions' && !lora)) throw new HttpError(404, `no route ${req.method} ${url}; POST /v1/chat/completions, /v1/completions, /v1/load_lora_adapter or /v1/unload_lora_adapter`, 'not_found');
      const body = (await readBody(req)) as Record<string, unknown> | null;
      if (!isObj(body)) throw new HttpError(400, 'the body must be a JSON object');
      if (lora) return this.adapterRoute(res, url, body);
      await this.complete(res, url === '/v1/chat/completions', body);
    } catch (e) {
      const he = HttpError.from(e);
      if (!(e instanceof HttpError)) this.o.log?.(`serve: ${he.message}`);
      if (!res.headersSent) sendJson(res, he.status, he.body());
    }
  }

  /** The request's parameters, checked: every one honoured, neutral, or a 400 naming it. */
  private parse(chat: boolean, body: Record<string, unknown>): Parsed {
    const honoured = new Set([...HONOURED_COMMON, ...(chat ? HONOURED_CHAT : HONOURED_COMPLETIONS)]);
    for (const [k, v] of Object.entries(body)) {
      if (honoured.has(k) || v === null || v === undefined) continue;
      const neutral = NEUTRAL[k];
      if (!neutral) throw param(k, `Unrecognized request argument supplied: ${k}. This server does not support it; ${chat ? '/v1/chat/completions' : '/v1/completions'} takes ${[...honoured].join(', ')} (and ${Object.keys(NEUTRAL).join(', ')} at their defaults).`);
      if (!neutral[0](v)) throw param(k, `${k} is not supported: this server accepts it only as ${neutral[1]}, found ${JSON.stringify(v)?.slice(0, 80)}.`);
    }

    // The model: this server's name or a loaded adapter (or none: the model as started).
    let adapter: string | null = null;
    if (body.model !== undefined && body.model !== null) {
      if (typeof body.model !== 'string') throw param('model', `model must be a string, found ${describe(body.model)}`);
      if (this.adapters.has(body.model)) adapter = body.model;
      else if (body.model !== this.o.name) throw new HttpError(404, `The model \`${body.model}\` does not exist. This server serves: ${this.servedIds().join(', ')}.`, 'invalid_request_error', 'model', 'model_not_found');
    }

    const prompts: number[][] = [];
    const addSpecial = boolean(body, 'add_special_tokens', false);
    if (chat) {
      const msgs = body.messages;
      if (!Array.isArray(msgs) || !msgs.length) throw param('messages', 'messages must be a non-empty list of {role, content} with string content');
      const messages = msgs.map((m, i) => this.message(m, i));
      const kw = body.chat_template_kwargs ?? {};
      if (!isObj(kw)) throw param('chat_template_kwargs', `chat_template_kwargs must be an object, found ${describe(kw)}`);
      const { enable_thinking, ...variables } = kw;
      if (enable_thinking !== undefined && typeof enable_thinking !== 'boolean') throw param('chat_template_kwargs', `chat_template_kwargs.enable_thinking must be true or false, found ${describe(enable_thinking)}`);
      const text = this.o.formatter.render(messages, {
        addGenerationPrompt: boolean(body, 'add_generation_prompt', true),
        ...(enable_thinking === undefined ? {} : { enableThinking: enable_thinking }),
        ...(Object.keys(variables).length ? { variables } : {}),
      });
      prompts.push(this.o.tokenizer.encode(text, { addSpecialTokens: addSpecial }));
    } else {
      const p = body.prompt;
      const one = (x: unknown): number[] | null =>
        typeof x === 'string' ? this.o.tokenizer.encode(x, { addSpecialTokens: addSpecial }) : Array.isArray(x) && x.length && x.every((y) => Number.isInteger(y)) ? (x as number[]) : null;
      const single = one(p);
      if (single) prompts.push(single);
      else if (Array.isArray(p) && p.length && p.every((x) => typeof x === 'string' || Array.isArray(x))) for (const x of p) prompts.push(one(x) ?? []);
      else throw param('prompt', 'prompt must be a string, a list of token ids, or a non-empty list of either');
    }
    for (const pr of prompts) {
      if (!pr.length) throw param(chat ? 'messages' : 'prompt', 'the prompt is empty');
      for (const id of pr) if (id < 0 || id >= this.o.model.vocabSize) throw param(chat ? 'messages' : 'prompt', `token id ${id} is outside the vocabulary [0, ${this.o.model.vocabSize})`);
    }

    const stopRaw = body.stop;
    const stop = stopRaw === undefined || stopRaw === null ? [] : typeof stopRaw === 'string' ? [stopRaw] : Array.isArray(stopRaw) && stopRaw.every((s) => typeof s === 'string') ? (stopRaw as string[]) : null;
    if (!stop || stop.some((s) => !s)) throw param('stop', 'stop must be a non-empty string or a list of them');
    const extraStops = body.stop_token_ids ?? [];
    if (!Array.isArray(extraStops) || !extraStops.every((x) => Number.isInteger(x) && x >= 0 && x < this.o.model.vocabSize))
      throw param('stop_token_ids', `stop_token_ids must be a list of token ids in [0, ${this.o.model.vocabSize}), found ${describe(extraStops)}`);
    const stopTokenIds = [...new Set([...(boolean(body, 'ignore_eos', false) ? [] : this.o.tokenizer.stopTokenIds), ...(extraStops as number[])])].sort((a, b) => a - b);

    const limit = this.o.maxTokensLimit ?? 4096;
    const maxName = body.max_tokens === undefined || body.max_tokens === null ? 'max_completion_tokens' : 'max_tokens';
    const maxTokens = number(body, chat ? maxName : 'max_tokens', this.o.defaultMaxTokens ?? 512, 1, limit, { integer: true });
    const maxBatch = this.o.maxBatch ?? 32;
    const n = number(body, 'n', 1, 1, maxBatch, { integer: true });
    if (n * prompts.length > maxBatch) throw param('n', `n x prompts = ${n * prompts.length} rows, over this server's --max-batch ${maxBatch}`);
    if (!chat && body.best_of !== undefined && body.best_of !== null && body.best_of !== n) throw param('best_of', `best_of is supported only equal to n (${n}), found ${describe(body.best_of)}`);
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
      for (const k of Object.keys(so)) if (k !== 'include_usage' && k !== 'continuous_usage_stats') throw param('stream_options', `stream_options.${k} is not supported (include_usage and continuous_usage_stats are)`);
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
    if (user !== undefined && user !== null && typeof user !== 'string') throw param('user', `user must be a string, found ${describe(user)}`);
    const requestId = body.request_id;
    if (requestId !== undefined && requestId !== null && (typeof requestId !== 'string' || !/^[\w.:-]{1,128}$/.test(requestId))) throw param('request_id', `request_id must be a string of letters, digits and _ . : - (at most 128), found ${describe(requestId)}`);

    return {
      prompts,
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
        topK: topK < 0 ? 0 : topK,
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

  /** A chat message: role and content (a string, or text parts joined by newlines, as vLLM does). */
  private message(m: unknown, i: number): ChatMessage {
    const where = `messages[${i}]`;
    if (!isObj(m) || typeof m.role !== 'string') throw param('messages', `${where} must be an object with a string role, found ${describe(m)}`);
    for (const k of Object.keys(m)) if (k !== 'role' && k !== 'content' && m[k] !== null && m[k] !== undefined) throw param('messages', `${where}.${k} is not supported (messages take role and content)`);
    let content = m.content;
    if (Array.isArray(content)) {
      if (!content.every((p) => isObj(p) && p.type === 'text' && typeof p.text === 'string')) throw param('messages', `${where}.content: only text parts ({type: 'text', text}) are supported`);
      content = content.map((p) => (p as { text: string }).text).join('\n');
    }
    if (typeof content !== 'string') throw param('messages', `${where}.content must be a string or a list of text parts, found ${describe(content)}`);
    return { role: m.role as ChatMessage['role'], content };
  }

  /** Text of ids; ids past the tokenizer's vocabulary (a model's padding rows) have none. */
  private decoder(s: Sampling): (ids: number[]) => string {
    const V = this.o.tokenizer.vocabSize;
    return (ids) => this.o.tokenizer.decode(ids.some((id) => id >= V) ? ids.filter((id) => id < V) : ids, { skipSpecialTokens: s.skipSpecial });
  }

  /** A chat or text completion, streamed or not. */
  private async complete(res: ServerResponse, chat: boolean, body: Record<string, unknown>): Promise<void> {
    const p = this.parse(chat, body);
    const jobs: Job[] = [];
    const base = p.seed ?? this.seq++;
    for (const prompt of p.prompts) for (let i = 0; i < p.n; i++) jobs.push(new Job(Int32Array.from(prompt), p.s, rowSeed(base, i), this.decoder(p.s)));
    const id = `${chat ? 'chatcmpl' : 'cmpl'}-${p.requestId ?? randomUUID().replace(/-/g, '')}`;
    const created = Math.floor(Date.now() / 1000);
    const model = p.s.adapter ?? this.o.name;
    const promptTokens = p.prompts.reduce((a, x) => a + x.length, 0);
    const usage = () => {
      const completion = jobs.reduce((a, j) => a + j.ids.length, 0);
      return { prompt_tokens: promptTokens, completion_tokens: completion, total_tokens: promptTokens + completion };
    };
    // A client that goes away cancels its rows (queued or in a running call).
    res.on('close', () => {
      if (!res.writableFinished) for (const j of jobs) j.abort.abort();
    });

    if (!p.stream) {
      this.enqueue(jobs);
      let results: RowResult[];
      try {
        results = await Promise.all(jobs.map((j) => j.result));
      } catch (e) {
        for (const j of jobs) j.abort.abort();
        throw e;
      }
      if (res.destroyed) return;
      const choices = jobs.map((j, index) => {
        const r = results[index];
        const lp = p.s.logprobs ? (chat ? this.chatLogprobs(j, 0, j.ids.length, p) : this.textLogprobs(j, 0, j.ids.length, 0, p).logprobs) : null;
        return chat ? { index, message: { role: 'assistant', content: r.text }, logprobs: lp, finish_reason: r.finish } : { index, text: r.text, logprobs: lp, finish_reason: r.finish };
      });
      sendJson(res, 200, { id, object: chat ? 'chat.completion' : 'text_completion', created, model, choices, usage: usage() });
      return;
    }

    res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', connection: 'keep-alive' });
    const send = (data: unknown) => {
      if (!res.writableEnded && !res.destroyed) res.write(`data: ${JSON.stringify(data)}\n\n`);
    };
    const chunk = (choice: Record<string, unknown>) =>
      send({
        id,
        object: chat ? 'chat.completion.chunk' : 'text_completion',
        created,
        model,
        choices: [choice],
        ...(p.continuousUsage ? { usage: usage() } : p.includeUsage ? { usage: null } : {}),
      });
    if (chat) jobs.forEach((_, index) => chunk({ index, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }));
    jobs.forEach((j, index) => {
      let reported = 0; // tokens whose log-probs went out
      let offset = 0; // completions' text_offset of the next token
      j.listener = (piece, end) => {
        const upto = j.ids.length;
        if (piece || (end && p.s.logprobs && upto > reported)) {
          let lp = null;
          if (p.s.logprobs) {
            if (chat) lp = this.chatLogprobs(j, reported, upto, p);
            else {
              const t = this.textLogprobs(j, reported, upto, offset, p);
              offset = t.next;
              lp = t.logprobs;
            }
            reported = upto;
          }
          chunk(chat ? { index, delta: { content: piece }, logprobs: lp, finish_reason: null } : { index, text: piece, logprobs: lp, finish_reason: null });
        }
        // (a cancelled row never calls its listener)
        if (end) chunk(chat ? { index, delta: {}, logprobs: null, finish_reason: end.finish } : { index, text: '', logprobs: null, finish_reason: end.finish });
      };
    });
    this.enqueue(jobs);
    try {
      await Promise.all(jobs.map((j) => j.result));
      if (p.includeUsage) send({ id, object: chat ? 'chat.completion.chunk' : 'text_completion', created, model, choices: [], usage: usage() });
    } catch (e) {
      for (const j of jobs) j.abort.abort();
      const he = HttpError.from(e);
      this.o.log?.(`serve: ${he.message}`);
      send(he.body());
    }
    for (const j of jobs) if (j.mismatch) this.o.log?.(`serve: the streamed text of ${id} differs from its decoded text (the tokenizer's decoder is not prefix-stable)`);
    if (!res.writableEnded && !res.destroyed) res.end('data: [DONE]\n\n');
  }

  // -------------------------------------------------------------------------------------------
  // Log-probs

  private tokenBytes(id: number): number[] {
    this.bytes ??= this.o.tokenizer.tokenBytes();
    return Array.from(this.bytes[id] ?? []);
  }

  private tokenString(id: number, asIds: boolean): string {
    if (asIds) return `token_id:${id}`;
    return id < this.o.tokenizer.vocabSize ? this.o.tokenizer.decode([id]) : '';
  }

  /** Chat log-probs of tokens [from, to): {content: [{token, logprob, bytes, top_logprobs}]}. */
  private chatLogprobs(j: Job, from: number, to: number, p: Parsed) {
    const entry = (id: number, lp: number) => ({ token: this.tokenString(id, p.asIds), logprob: Math.max(lp, -9999), bytes: this.tokenBytes(id) });
    const content = [];
    for (let t = from; t < to; t++) {
      const top = j.top[t];
      const alts = [];
      for (let k = 0; k < p.s.topN && top; k++) alts.push(entry(top.ids[k], top.logprobs[k]));
      content.push({ ...entry(j.ids[t], j.logprobs[t]), top_logprobs: alts });
    }
    return { content };
  }

  /**
   * Completions log-probs of tokens [from, to): {tokens, token_logprobs, top_logprobs (the N best
   * and the sampled token, as OpenAI's legacy API), text_offset}, and the text offset of token `to`.
   */
  private textLogprobs(j: Job, from: number, to: number, offset: number, p: Parsed) {
    const tokens: string[] = [];
    const tokenLogprobs: number[] = [];
    const tops: Array<Record<string, number>> = [];
    const offsets: number[] = [];
    for (let t = from; t < to; t++) {
      const id = j.ids[t];
      const s = this.tokenString(id, p.asIds);
      tokens.push(s);
      tokenLogprobs.push(Math.max(j.logprobs[t], -9999));
      const dict: Record<string, number> = {};
      const top = j.top[t];
      for (let k = 0; k < p.s.topN && top; k++) {
        const key = this.tokenString(top.ids[k], p.asIds);
        if (!(key in dict)) dict[key] = Math.max(top.logprobs[k], -9999);
      }
      if (!(s in dict)) dict[s] = Math.max(j.logprobs[t], -9999);
      tops.push(dict);
      offsets.push(offset);
      offset += p.asIds ? this.tokenString(id, false).length : s.length;
    }
    return { logprobs: { tokens, token_logprobs: tokenLogprobs, top_logprobs: tops, text_offset: offsets }, next: offset };
  }

  // -------------------------------------------------------------------------------------------
  // Scheduling

  private enqueue(jobs: Job[]): void {
    for (const j of jobs) {
      j.abort.signal.addEventListener(
        'abort',
        () => {
          this.queue = this.queue.filter((x) => x !== j);
          j.end('cancelled');
        },
        { once: true },
      );
    }
    this.queue.push(...jobs.filter((j) => !j.ended));
    void this.pump();
  }

  /** vLLM's runtime LoRA routes: load {lora_name, lora_path} / unload {lora_name}. */
  private adapterRoute(res: ServerResponse, url: string, body: Record<string, unknown>): void {
    const name = body.lora_name;
    if (typeof name !== 'string' || !name || name === this.o.name) throw new HttpError(400, `lora_name must be a non-empty string other than the base model's name, found ${describe(name)}`);
    if (url === '/v1/unload_lora_adapter') {
      if (!this.adapters.delete(name)) throw new HttpError(404, `no adapter named '${name}' is loaded`, 'not_found');
      this.o.log?.(`serve: unloaded adapter ${name}`);
      res.writeHead(200, { 'content-type': 'text/plain' }).end(`Success: LoRA adapter '${name}' removed successfully.`);
      return;
    }
    if (this.adapters.has(name)) throw new HttpError(400, `an adapter named '${name}' is already loaded; unload it first or choose another name`);
    const path = body.lora_path;
    if (typeof path !== 'string' || !path) throw new HttpError(400, `lora_path must be a PEFT adapter folder, found ${describe(path)}`);
    try {
      readAdapterConfig(path, this.o.model.config.num_hidden_layers);
    } catch (e) {
      throw new HttpError(400, `lora_path ${path}: ${(e as Error).message}`);
    }
    this.adapters.set(name, path);
    this.o.log?.(`serve: loaded adapter ${name} from ${path}`);
    res.writeHead(200, { 'content-type': 'text/plain' }).end(`Success: LoRA adapter '${name}' added successfully.`);
  }

  /** Puts the job's adapter on the model (the started adapter, or none, for null). */
  private async useAdapter(name: string | null): Promise<void> {
    if (name === this.active && (name === null || this.adapters.has(name))) return;
    const dir = name === null ? this.o.adapter : this.adapters.get(name);
    if (dir) await this.o.model.loadAdapter(dir);
    else this.o.model.detachLora();
    this.active = name;
  }

  /** Runs queued rows in batched generate calls, one call at a time. */
  private async pump(): Promise<void> {
    if (this.busy) return;
    this.busy = true;
    try {
      while (this.queue.length) {
        // Give requests that arrive together a chance to share the call.
        await new Promise((r) => setImmediate(r));
        if (!this.queue.length) break;
        const first = this.queue[0];
        // The engine applies top-k / stops / the adapter per call: batch only rows that agree (top-p is per row).
        const key = (j: Job) => JSON.stringify([j.s.topK, [...j.s.stop].sort(), j.s.stopTokenIds, j.s.adapter]);
        const firstKey = key(first);
        const take = this.queue.filter((j) => key(j) === firstKey).slice(0, this.o.maxBatch ?? 32);
        this.queue = this.queue.filter((j) => !take.includes(j));
        this.batches.push(take.length);
        try {
          await this.useAdapter(first.s.adapter);
          const r = await this.o.model.generateStream({
            prompts: take.map((j) => j.prompt),
            maxNewTokens: Math.max(...take.map((j) => j.s.maxTokens)),
            rowMaxNewTokens: take.map((j) => j.s.maxTokens),
            temperature: take.map((j) => j.s.temperature),
            topP: take.map((j) => j.s.topP),
            topK: first.s.topK,
            // Each row's own seed: its samples do not depend on what it was batched with.
            rowSeeds: take.map((j) => j.seed),
            stopTokenIds: first.s.stopTokenIds,
            stopStrings: first.s.stop,
            topLogprobs: Math.max(...take.map((j) => j.s.topN)),
            signals: take.map((j) => j.abort.signal),
            onToken: (ev) => {
              const j = take[ev.row];
              try {
                j.token(ev);
              } catch (e) {
                // This row alone fails (its request gets the error); the others go on.
                j.fail(e as Error);
                j.abort.abort();
              }
            },
          });
          this.calls.push({ rows: take.length, steps: r.steps, finish: r.finishReasons });
          take.forEach((j, i) => j.end(r.finishReasons[i]));
        } catch (e) {
          for (const j of take) j.fail(e as Error);
        }
      }
    } finally {
      this.busy = false;
    }
  }
}
