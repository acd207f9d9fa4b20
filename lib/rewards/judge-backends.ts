/**
 * Where the judge model runs. A backend turns chat messages into the judge's reply text:
 *
 * - `openAIJudgeBackend`: any OpenAI-compatible server (`POST {baseUrl}/chat/completions`; vLLM,
 *   SGLang, llama.cpp, `slm-train serve`, OpenAI). Every attempt has a timeout (AbortController,
 *   covering the body too); network errors, timeouts, 408, 429 and 5xx are retried with exponential
 *   backoff (a 429's Retry-After is honoured, capped at the maximum backoff); other statuses and
 *   malformed bodies fail at once. At most `concurrency` requests are in flight. Worst case for one
 *   call: (retries + 1) · timeout + the backoffs.
 * - `engineJudgeBackend`: a local TextGenerator (the native engine) with the judge model's tokenizer
 *   and chat template, greedy. Requests that arrive together are sent as one batched generate call
 *   (the engine decodes a whole batch at once). No timeout: max_new_tokens bounds the work.
 *
 * Failures throw SlmError JUDGE_FAILED; judge.ts records them as failed parts.
 */
import { SlmError, describe } from '../errors.js';
import type { TextGenerator } from '../engine/types.js';
import type { ChatMessage, Tokenizer } from '../model/tokenizer-types.js';
import { AttemptError, backoffMs, fetchText, retryAfterMs, retryableStatus, withRetries } from '../util/http-retry.js';
import { Limiter } from '../util/limiter.js';

export interface JudgeReply {
  text: string;
  /** The reply stopped at the token limit (it may lack the grades). */
  truncated?: boolean;
}

export interface JudgeBackend {
  /** For messages: where the judge runs. */
  readonly description: string;
  complete(messages: readonly ChatMessage[]): Promise<JudgeReply>;
}

// ---------------------------------------------------------------------------------------------
// Small helpers

function positive(name: string, v: number, integer = false, min = 0): number {
  if (typeof v !== 'number' || !Number.isFinite(v) || v < min || (integer && !Number.isInteger(v))) {
    throw new SlmError(
      'ARGUMENT_INVALID',
      `Expected the judge option ${name} to be ${integer ? 'an integer' : 'a number'} >= ${min}, but found ${describe(v)}.`,
    );
  }
  return v;
}

// ---------------------------------------------------------------------------------------------
// OpenAI-compatible endpoint

export interface OpenAIJudgeOptions {
  /** The API root, e.g. `http://127.0.0.1:8000/v1`; requests go to `{baseUrl}/chat/completions`. */
  baseUrl: string;
  model: string;
  /** The key itself (sent as `Authorization: Bearer ...`); see apiKeyEnv. */
  apiKey?: string;
  /** Name of the environment variable that holds the key; it must be set when given. */
  apiKeyEnv?: string;
  /** Per attempt, headers and body (default 60000). */
  timeoutMs?: number;
  /** Retries after the first attempt (default 3). */
  retries?: number;
  /** First backoff; doubles per retry (default 1000), capped at maxBackoffMs (default 30000). */
  backoffMs?: number;
  maxBackoffMs?: number;
  /** Requests in flight at once (default 8). */
  concurrency?: number;
  /** `max_tokens` of the request (default 1024). */
  maxTokens?: number;
  /** Default 0. */
  temperature?: number;
  /** Merged into the request body (e.g. `{ chat_template_kwargs: { enable_thinking: false } }`). */
  extraBody?: Record<string, unknown>;
  /** Environment to read apiKeyEnv from (default process.env). */
  env?: Record<string, string | undefined>;
}

function chatUrl(baseUrl: string): string {
  const b = baseUrl.replace(/\/+$/, '');
  return b.endsWith('/chat/completions') ? b : `${b}/chat/completions`;
}

/** The reply text of a chat completion body, or an AttemptError saying what the body held. */
function replyOf(body: unknown): JudgeReply {
  const choice = (body as { choices?: Array<{ message?: { content?: unknown }; finish_reason?: unknown }> })?.choices?.[0];
  const content = choice?.message?.content;
  if (typeof content !== 'string') {
    throw new AttemptError(
      `Expected a chat completion with choices[0].message.content as a string, but found ${choice ? `content ${describe(content)}` : `no choices in ${JSON.stringify(body)?.slice(0, 200)}`}.`,
      false,
    );
  }
  return { text: content, truncated: choice?.finish_reason === 'length' };
}

export function openAIJudgeBackend(opts: OpenAIJudgeOptions): JudgeBackend {
  if (typeof opts?.baseUrl !== 'string' || !/^https?:\/\//.test(opts.baseUrl)) {
    throw new SlmError(
      'ARGUMENT_INVALID',
      `Expected the judge's base URL to start with http:// or https:// (e.g. http://127.0.0.1:8000/v1), but found ${describe(opts?.baseUrl)}.`,
    );
  }
  if (typeof opts.model !== 'string' || opts.model === '') {
    throw new SlmError(
      'ARGUMENT_INVALID',
      `Expected the judge's model name (the "model" of the request, as the server lists it at /v1/models), but found ${describe(opts.model)}.`,
    );
  }
  let apiKey = opts.apiKey;
  if (opts.apiKeyEnv) {
    apiKey = (opts.env ?? process.env)[opts.apiKeyEnv];
    if (!apiKey)
      throw new SlmError(
        'CONFIG_INVALID',
        `Expected the environment variable ${opts.apiKeyEnv} to hold the judge's API key, but it is not set. Export it, or leave api_key_env out for a server without keys.`,
      );
  }
  const url = chatUrl(opts.baseUrl);
  const timeout = positive('timeoutMs', opts.timeoutMs ?? 60000, false, 1);
  const retries = positive('retries', opts.retries ?? 3, true);
  const base = positive('backoffMs', opts.backoffMs ?? 1000);
  const maxBackoff = positive('maxBackoffMs', opts.maxBackoffMs ?? 30000);
  const limiter = new Limiter(positive('concurrency', opts.concurrency ?? 8, true, 1));
  const headers: Record<string, string> = { 'content-type': 'application/json', ...(apiKey ? { authorization: `Bearer ${apiKey}` } : {}) };
  const description = `judge ${opts.model} at ${url}`;

  async function attempt(body: string): Promise<JudgeReply> {
    const { res, text } = await fetchText(url, { method: 'POST', headers, body }, timeout);
    if (!res.ok) {
      const hint =
        res.status === 401 || res.status === 403
          ? ' Check the API key (api_key_env).'
          : res.status === 404
            ? ' Check base_url (it should end in /v1) and the model name.'
            : '';
      throw new AttemptError(
        `HTTP ${res.status}: ${text.slice(0, 300)}.${hint}`,
        retryableStatus(res.status),
        res.status === 429 ? retryAfterMs(res.headers.get('retry-after')) : undefined,
      );
    }
    let json: unknown;
    try {
      json = JSON.parse(text);
    } catch {
      throw new AttemptError(`Expected a JSON body, but found ${JSON.stringify(text.slice(0, 200))}.`, false);
    }
    return replyOf(json);
  }

  async function complete(messages: readonly ChatMessage[]): Promise<JudgeReply> {
    const body = JSON.stringify({
      model: opts.model,
      messages,
      temperature: opts.temperature ?? 0,
      max_tokens: opts.maxTokens ?? 1024,
      ...opts.extraBody,
    });
    return withRetries(() => limiter.run(() => attempt(body)), {
      retries,
      delayMs: (n, err) => Math.min(maxBackoff, err.waitMs ?? backoffMs(n, base, maxBackoff)),
      fail: (last, errors) =>
        new SlmError(
          'JUDGE_FAILED',
          `The ${description} gave no usable reply (${errors.map((m, i) => `attempt ${i + 1}: ${m}`).join('; ')}).${last.retry ? ' Raise timeout_s or retries, or check that the server is up.' : ''}`,
          { url, attempts: errors.length },
        ),
    });
  }

  return { description, complete };
}

// ---------------------------------------------------------------------------------------------
// Native engine

export interface EngineJudgeOptions {
  generator: TextGenerator;
  /** The judge model's tokenizer. */
  tokenizer: Pick<Tokenizer, 'encode' | 'decode' | 'stopTokenIds'>;
  /** Renders the judge's prompt with its chat template (lib/model/chat.ts ChatFormatter). */
  formatter: { prompt(messages: readonly ChatMessage[], opts?: { enableThinking?: boolean }): string };
  /** Tokens one reply may have (default 1024). */
  maxNewTokens?: number;
  /** Prompts per generate call (default 16). */
  batchSize?: number;
  /** Passed to the chat template when set (Qwen3 hybrid models: false = no thinking block). */
  enableThinking?: boolean;
  /** For messages (default 'engine judge'). */
  description?: string;
}

interface Pending {
  ids: Int32Array;
  resolve: (r: JudgeReply) => void;
  reject: (e: Error) => void;
}

export function engineJudgeBackend(opts: EngineJudgeOptions): JudgeBackend {
  if (typeof opts?.generator?.generate !== 'function') {
    throw new SlmError(
      'ARGUMENT_INVALID',
      `Expected engineJudgeBackend({ generator }) with a TextGenerator (the judge model's engine), but found ${describe(opts?.generator)}.`,
    );
  }
  const maxNewTokens = positive('maxNewTokens', opts.maxNewTokens ?? 1024, true, 1);
  const batchSize = positive('batchSize', opts.batchSize ?? 16, true, 1);
  const description = opts.description ?? 'engine judge';
  const queue: Pending[] = [];
  let draining = false;

  async function drain(): Promise<void> {
    while (queue.length) {
      const batch = queue.splice(0, batchSize);
      try {
        const res = await opts.generator.generate({
          prompts: batch.map((p) => p.ids),
          maxNewTokens,
          greedy: true,
          temperature: 0,
          seed: 0,
          stopTokenIds: opts.tokenizer.stopTokenIds,
        });
        batch.forEach((p, i) =>
          p.resolve({
            text: opts.tokenizer.decode(res.tokens[i], { skipSpecialTokens: true }),
            truncated: res.finishReasons[i] === 'length',
          }),
        );
      } catch (e) {
        const err = new SlmError('JUDGE_FAILED', `The ${description} failed to generate: ${(e as Error).message}`);
        for (const p of batch) p.reject(err);
      }
    }
    draining = false;
  }

  function complete(messages: readonly ChatMessage[]): Promise<JudgeReply> {
    const renderOpts = opts.enableThinking === undefined ? {} : { enableThinking: opts.enableThinking };
    const ids = Int32Array.from(opts.tokenizer.encode(opts.formatter.prompt(messages, renderOpts)));
    return new Promise<JudgeReply>((resolve, reject) => {
      queue.push({ ids, resolve, reject });
      if (!draining) {
        draining = true;
        // Wait one turn of the event loop so that requests made together go in one batch.
        setImmediate(() => void drain());
      }
    });
  }

  return { description, complete };
}
