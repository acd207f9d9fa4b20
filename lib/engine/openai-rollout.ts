/**
 * Rollouts on OpenAI-compatible inference servers (vLLM, `slm-train serve`): `rollout.engine: openai`.
 *
 * - Generation: POST {url}/v1/completions with the prompt as token ids, per-row temperature and seed,
 *   stop strings (kept in the output, as the native engine keeps them) and `logprobs: 0` with
 *   `return_tokens_as_token_ids: true`, so the reply names the sampled token ids ("token_id:N") and
 *   the episode keeps exact ids. Rows go to the server with the fewest requests in flight (each at
 *   most `concurrency`); a failed attempt (connection error, timeout, 408/429/5xx) is retried with
 *   exponential backoff on the next server.
 * - The policy: after each optimizer step the trainer writes the adapter (PEFT) into a folder the
 *   servers can read and asks each server to load it under a fresh name (vLLM's runtime LoRA API:
 *   POST /v1/load_lora_adapter {lora_name, lora_path}, the previous one unloaded with POST
 *   /v1/unload_lora_adapter {lora_name}); requests then name it as their `model`.
 * - The log-probs the loss needs are not the server's: the trainer recomputes them with its own
 *   engine (lib/train/stages.ts), so a server's kernels or sampling never bias the update.
 */
import { mkdirSync, rmSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { SlmError } from '../errors.js';
import { Limiter } from '../util/limiter.js';
import { AttemptError, backoffMs, fetchText, retryableStatus, withRetries } from '../util/http-retry.js';
import type { Model } from './model.js';
import type { GenerateRequest, GenerateResult, TextGenerator } from './types.js';

export interface OpenAIRolloutOptions {
  urls: string[];
  /** The base model's name on the servers (null: the first of GET /v1/models). */
  model: string | null;
  timeoutS: number;
  retries: number;
  /** Requests in flight per server. */
  concurrency: number;
  /** Token ids that end a row (the tokenizer's), to tell a stop token from a stop string. */
  stopTokenIds: number[];
  /** Where adapters are written for the servers to load (a folder they can read). */
  adapterDir: string;
  /** Prefix of the adapter names on the servers. */
  name?: string;
  backoffMs?: number;
}

interface Server {
  url: string;
  limiter: Limiter;
  inFlight: number;
}

export class OpenAIRollout implements TextGenerator {
  private servers: Server[];
  private baseModel: string | null;
  /** The adapter the requests name (null: the base model). */
  current: string | null = null;
  private version = 0;
  private currentDir: string | null = null;
  /** Requests sent per server URL (logs, tests of the load balancing). */
  readonly sent = new Map<string, number>();

  constructor(readonly o: OpenAIRolloutOptions) {
    if (!o.urls.length)
      throw new SlmError(
        'CONFIG_INVALID',
        'rollout.engine openai needs rollout.openai.urls: the base URLs of OpenAI-compatible servers (e.g. http://10.0.0.5:8000).',
        { path: 'rollout.openai.urls' },
      );
    this.servers = o.urls.map((u) => ({
      url: u.replace(/\/+$/, '').replace(/\/v1$/, ''),
      limiter: new Limiter(o.concurrency),
      inFlight: 0,
    }));
    this.baseModel = o.model;
  }

  /** Writes the model's adapter and has every server load it; later requests use it. */
  async syncAdapter(model: Model): Promise<string> {
    const name = `${this.o.name ?? 'slm-train'}-v${++this.version}`;
    const dir = resolve(join(this.o.adapterDir, name));
    mkdirSync(dir, { recursive: true });
    await model.saveAdapter(dir);
    const old = this.current;
    try {
      await Promise.all(
        this.servers.map(async (s) => {
          await this.post(s, '/v1/load_lora_adapter', { lora_name: name, lora_path: dir }, `loading adapter ${name}`);
          if (old) await this.post(s, '/v1/unload_lora_adapter', { lora_name: old }, `unloading adapter ${old}`).catch(() => {});
        }),
      );
    } catch (e) {
      rmSync(dir, { recursive: true, force: true });
      throw e;
    }
    this.current = name;
    if (this.currentDir) rmSync(this.currentDir, { recursive: true, force: true });
    this.currentDir = dir;
    return name;
  }

  async generate(req: GenerateRequest): Promise<GenerateResult> {
    const model = this.current ?? (this.baseModel ??= await this.firstModel());
    const n = req.prompts.length;
    const temps =
      req.temperature === undefined
        ? new Array(n).fill(1)
        : typeof req.temperature === 'number'
          ? new Array(n).fill(req.temperature)
          : Array.from(req.temperature);
    const rows = await Promise.all(
      req.prompts.map((promptTokens, i) =>
        this.complete({
          model,
          prompt: Array.from(promptTokens),
          max_tokens: req.maxNewTokens,
          temperature: req.greedy ? 0 : temps[i],
          top_p: typeof req.topP === 'object' ? req.topP[i] : (req.topP ?? 1),
          ...(req.topK ? { top_k: req.topK } : {}),
          ...(req.rowSeeds ? { seed: req.rowSeeds[i] % 2 ** 31 } : req.seed !== undefined ? { seed: (req.seed + i) % 2 ** 31 } : {}),
          ...(req.stopStrings?.length ? { stop: req.stopStrings, include_stop_str_in_output: true } : {}),
          ...(req.stopTokenIds?.length ? { stop_token_ids: req.stopTokenIds } : {}),
          logprobs: 0,
          return_tokens_as_token_ids: true,
          skip_special_tokens: false,
        }),
      ),
    );
    const stops = new Set(req.stopTokenIds ?? this.o.stopTokenIds);
    return {
      tokens: rows.map((r) => r.ids),
      logprobs: rows.map((r) => new Float32Array(r.ids.length)),
      finishReasons: rows.map((r) =>
        r.finish === 'length' ? 'length' : r.ids.length && stops.has(r.ids[r.ids.length - 1]) ? 'stop_token' : 'stop_string',
      ),
    };
  }

  private async firstModel(): Promise<string> {
    const r = (await this.request(this.servers[0], 'GET', '/v1/models', undefined, 'listing models')) as { data?: Array<{ id?: string }> };
    const id = r?.data?.[0]?.id;
    if (!id) throw new SlmError('ROLLOUT_SERVER_ERROR', `${this.servers[0].url}/v1/models lists no model; set rollout.openai.model.`);
    return id;
  }

  private async complete(body: Record<string, unknown>): Promise<{ ids: Int32Array; finish: string }> {
    const r = (await this.post(null, '/v1/completions', body, 'completion')) as {
      choices?: Array<{ finish_reason?: string; logprobs?: { tokens?: string[] } }>;
    };
    const c = r?.choices?.[0];
    const toks = c?.logprobs?.tokens;
    if (!c || !Array.isArray(toks) || toks.some((t) => !/^token_id:\d+$/.test(t)))
      throw new SlmError(
        'ROLLOUT_SERVER_ERROR',
        `a completion reply carries no token ids (expected choices[0].logprobs.tokens as "token_id:N", which vLLM gives for logprobs + return_tokens_as_token_ids); found ${JSON.stringify(r).slice(0, 200)}.`,
      );
    return { ids: Int32Array.from(toks, (t) => Number(t.slice(9))), finish: c.finish_reason ?? 'stop' };
  }

  /** POST to one server (or, with null, to the least busy, moving to the next on a retry). */
  private async post(server: Server | null, path: string, body: unknown, what: string): Promise<unknown> {
    return this.request(server, 'POST', path, body, what);
  }

  private pick(skip: Server | undefined): Server {
    const pool = this.servers.length > 1 && skip ? this.servers.filter((s) => s !== skip) : this.servers;
    return pool.reduce((a, b) => (b.inFlight < a.inFlight ? b : a));
  }

  private async request(server: Server | null, method: string, path: string, body: unknown, what: string): Promise<unknown> {
    const tried: string[] = [];
    let s: Server | undefined;
    try {
      return await withRetries(
        () => {
          // A server stays counted until the next attempt starts, so other rows avoid it during the backoff.
          if (s) s.inFlight--;
          const cur = server ?? this.pick(s);
          s = cur;
          tried.push(cur.url);
          cur.inFlight++;
          return cur.limiter.run(() => this.attempt(cur, method, path, body));
        },
        {
          retries: this.o.retries,
          delayMs: (n) => backoffMs(n, this.o.backoffMs ?? 500, 10_000),
          fail: (last, errors) =>
            new SlmError(
              last.retry ? 'ROLLOUT_SERVER_UNAVAILABLE' : 'ROLLOUT_SERVER_ERROR',
              `rollout server ${what} failed after ${errors.length} attempt(s): ${errors.map((m, i) => `${tried[i]}: ${m}`).join('; ')}.${last.retry ? ' Check that the servers in rollout.openai.urls are up, or raise rollout.openai.timeout_s / retries.' : ''}`,
            ),
        },
      );
    } finally {
      if (s) s.inFlight--;
    }
  }

  private async attempt(server: Server, method: string, path: string, body: unknown): Promise<unknown> {
    this.sent.set(server.url, (this.sent.get(server.url) ?? 0) + 1);
    const init = { method, headers: { 'content-type': 'application/json' }, body: body === undefined ? undefined : JSON.stringify(body) };
    const { res, text } = await fetchText(server.url + path, init, this.o.timeoutS * 1000);
    if (!res.ok) throw new AttemptError(`HTTP ${res.status} on ${path}: ${text.slice(0, 300)}`, retryableStatus(res.status));
    try {
      return JSON.parse(text);
    } catch {
      return text; // vLLM answers the adapter calls in plain text
    }
  }
}

/**
 * The sampling log-probs of episodes generated elsewhere, recomputed by the trainer's engine (one
 * teacher-forced pass, each row under its own temperature), 0 where the loss mask is 0.
 */
export async function recomputeLogprobs<E extends { ids: Int32Array; lossMask: Uint8Array; logprobs: Float32Array; temperature: number }>(
  model: Model,
  episodes: E[],
): Promise<E[]> {
  // Greedy rows (temperature 0) are scored at 1.
  // The loss mask as the scoring mask: only the trained tokens go through the vocabulary head.
  const lps = await model.sequenceLogprobs(
    episodes.map((e) => e.ids),
    episodes.map((e) => (e.temperature > 0 ? e.temperature : 1)),
    episodes.map((e) => e.lossMask),
  );
  return episodes.map((e, i) => ({ ...e, logprobs: lps[i] }));
}
