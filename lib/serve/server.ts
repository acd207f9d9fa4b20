/**
 * An OpenAI-compatible server over the native engine: `POST /v1/chat/completions` (messages rendered
 * with the model's chat template), `POST /v1/completions` (a prompt string or token ids), `GET
 * /v1/models`, `GET /health`. Concurrent requests are batched: while a generate call runs, new
 * requests queue, and the next call takes every queued request (up to `maxBatch` rows) in one
 * batched native call with per-row temperature; rows share max_tokens (the largest asked) and each
 * row's text is cut at its own limit. top_p, top_k and stop strings apply per call, so a batch
 * mixes only requests that agree on them. No streaming.
 *
 * LoRA adapters at run time, as vLLM serves them (`--enable-lora`): POST /v1/load_lora_adapter
 * {lora_name, lora_path} (a PEFT folder) and POST /v1/unload_lora_adapter {lora_name}; a request
 * whose `model` is a loaded adapter's name runs with that adapter (the engine holds one adapter at a
 * time, so a batch is one adapter's requests, and the adapter is swapped between calls). Completion
 * requests with `logprobs` get vLLM's `logprobs` object; with `return_tokens_as_token_ids` its
 * tokens are "token_id:N" (what lib/engine/openai-rollout.ts reads).
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Model } from '../engine/model.js';
import { describe } from '../errors.js';
import type { ChatFormatter } from '../model/chat.js';
import type { HfTokenizer } from '../model/tokenizer.js';
import type { ChatMessage } from '../model/tokenizer-types.js';
import { HttpError, closeServer, listen, readBody, sendJson } from './http.js';
import { readAdapterConfig } from '../engine/adapter.js';

export interface ServeOptions {
  model: Model;
  tokenizer: HfTokenizer;
  formatter: ChatFormatter;
  /** The name reported by /v1/models and in responses. */
  name: string;
  port: number;
  host?: string;
  /** Rows per batched generate call (default 32). */
  maxBatch?: number;
  /** Default and upper bound of max_tokens (default 512 / 4096). */
  defaultMaxTokens?: number;
  maxTokensLimit?: number;
  log?: (line: string) => void;
  /** The adapter the model was loaded with (requests naming no loaded adapter run with it). */
  adapter?: string;
}

interface Job {
  prompt: Int32Array;
  maxTokens: number;
  temperature: number;
  topP: number;
  topK: number;
  stop: string[];
  keepStop: boolean;
  seed: number;
  /** A loaded adapter's name, or null for the model as started. */
  adapter: string | null;
  resolve: (r: Completion) => void;
  reject: (e: Error) => void;
}

interface Completion {
  text: string;
  ids: number[];
  logprobs: number[];
  finish: 'stop' | 'length';
}

const num = (v: unknown, name: string, d: number, lo: number, hi: number): number => {
  if (v === undefined || v === null) return d;
  if (typeof v !== 'number' || !Number.isFinite(v) || v < lo || v > hi) throw new HttpError(400, `${name} must be a number from ${lo} to ${hi}, found ${describe(v)}`);
  return v;
};

export class OpenAIServer {
  readonly server: Server;
  private queue: Job[] = [];
  private busy = false;
  private seq = 0;
  /** Generate calls made and rows per call (tests and logs). */
  readonly batches: number[] = [];
  /** Adapters loaded at run time: name -> PEFT folder. */
  readonly adapters = new Map<string, string>();
  private active: string | null = null;

  constructor(readonly o: ServeOptions) {
    this.server = createServer((req, res) => void this.handle(req, res));
  }

  listen(): Promise<number> {
    return listen(this.server, this.o.port, this.o.host);
  }

  close(): Promise<void> {
    return closeServer(this.server);
  }

  private send(res: ServerResponse, status: number, body: unknown): void {
    sendJson(res, status, body);
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    try {
      const url = (req.url ?? '/').split('?')[0].replace(/\/+$/, '');
      if (req.method === 'GET' && (url === '/health' || url === '')) return this.send(res, 200, { status: 'ok' });
      if (req.method === 'GET' && url === '/v1/models') return this.send(res, 200, { object: 'list', data: [{ id: this.o.name, object: 'model', owned_by: 'slm-train' }] });
      const lora = url === '/v1/load_lora_adapter' || url === '/v1/unload_lora_adapter';
      if (req.method !== 'POST' || (url !== '/v1/chat/completions' && url !== '/v1/completions' && !lora)) throw new HttpError(404, `no route ${req.method} ${url}; POST /v1/chat/completions, /v1/completions, /v1/load_lora_adapter or /v1/unload_lora_adapter`, 'not_found');
      const body = (await readBody(req)) as Record<string, unknown> | null;
      if (!body || typeof body !== 'object') throw new HttpError(400, 'the body must be a JSON object');
      if (lora) return this.adapterRoute(res, url, body);
      const adapter = typeof body.model === 'string' && this.adapters.has(body.model) ? body.model : null;
      if (body.stream) throw new HttpError(400, 'stream: true is not supported; ask without streaming');
      const chat = url === '/v1/chat/completions';
      let prompt: number[];
      if (chat) {
        const msgs = body.messages;
        if (!Array.isArray(msgs) || !msgs.length || msgs.some((m) => !m || typeof m.role !== 'string' || typeof m.content !== 'string'))
          throw new HttpError(400, 'messages must be a non-empty list of {role, content} with string content');
        const kw = (body.chat_template_kwargs ?? {}) as { enable_thinking?: boolean };
        prompt = this.o.tokenizer.encode(this.o.formatter.prompt(msgs as ChatMessage[], kw.enable_thinking === undefined ? {} : { enableThinking: kw.enable_thinking }));
      } else {
        const p = body.prompt;
        if (typeof p === 'string') prompt = this.o.tokenizer.encode(p);
        else if (Array.isArray(p) && p.length && p.every((x) => Number.isInteger(x))) prompt = p as number[];
        else throw new HttpError(400, 'prompt must be a string or a list of token ids (one prompt per request)');
      }
      if (!prompt.length) throw new HttpError(400, 'the prompt is empty');
      for (const id of prompt) if (id < 0 || id >= this.o.model.vocabSize) throw new HttpError(400, `token id ${id} is outside the vocabulary [0, ${this.o.model.vocabSize})`);
      const stopRaw = body.stop;
      const stop = stopRaw === undefined || stopRaw === null ? [] : typeof stopRaw === 'string' ? [stopRaw] : Array.isArray(stopRaw) && stopRaw.every((s) => typeof s === 'string') ? (stopRaw as string[]) : null;
      if (!stop) throw new HttpError(400, 'stop must be a string or a list of strings');
      const limit = this.o.maxTokensLimit ?? 4096;
      const job = await new Promise<Completion>((resolve, reject) => {
        this.queue.push({
          prompt: Int32Array.from(prompt),
          maxTokens: Math.round(num(body.max_tokens ?? body.max_completion_tokens, 'max_tokens', this.o.defaultMaxTokens ?? 512, 1, limit)),
          temperature: num(body.temperature, 'temperature', 1, 0, 2),
          topP: num(body.top_p, 'top_p', 1, 0, 1),
          topK: Math.round(num(body.top_k, 'top_k', 0, 0, 1e6)),
          stop,
          keepStop: body.include_stop_str_in_output === true,
          adapter,
          seed: Math.round(num(body.seed, 'seed', this.seq++, 0, 2 ** 31)),
          resolve,
          reject,
        });
        void this.pump();
      });
      const id = `${chat ? 'chatcmpl' : 'cmpl'}-${Date.now().toString(36)}${(this.seq++).toString(36)}`;
      const usage = { prompt_tokens: prompt.length, completion_tokens: job.ids.length, total_tokens: prompt.length + job.ids.length };
      const asIds = body.return_tokens_as_token_ids === true;
      const logprobs = body.logprobs === undefined || body.logprobs === null || body.logprobs === false ? null : { tokens: job.ids.map((id) => (asIds ? `token_id:${id}` : this.o.tokenizer.decode([id]))), token_logprobs: job.logprobs, top_logprobs: null, text_offset: null };
      const name = adapter ?? this.o.name;
      const created = Math.floor(Date.now() / 1000);
      if (chat) this.send(res, 200, { id, object: 'chat.completion', created, model: name, choices: [{ index: 0, message: { role: 'assistant', content: job.text }, finish_reason: job.finish }], usage });
      else this.send(res, 200, { id, object: 'text_completion', created, model: name, choices: [{ index: 0, text: job.text, finish_reason: job.finish, logprobs }], usage });
    } catch (e) {
      const he = e instanceof HttpError ? e : new HttpError(500, (e as Error).message ?? String(e), 'server_error');
      if (!(e instanceof HttpError)) this.o.log?.(`serve: ${he.message}`);
      if (!res.headersSent) this.send(res, he.status, { error: { message: he.message, type: he.type } });
    }
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

  /** Runs queued jobs in batched generate calls, one call at a time. */
  private async pump(): Promise<void> {
    if (this.busy) return;
    this.busy = true;
    try {
      while (this.queue.length) {
        // Give requests that arrive together a chance to share the call.
        await new Promise((r) => setImmediate(r));
        const first = this.queue[0];
        // The engine stops a row on any stop string of the call: batch only requests that agree.
        const key = (j: Job) => JSON.stringify([j.topP, j.topK, [...j.stop].sort(), j.adapter]);
        const take = this.queue.filter((j) => key(j) === key(first)).slice(0, this.o.maxBatch ?? 32);
        this.queue = this.queue.filter((j) => !take.includes(j));
        this.batches.push(take.length);
        try {
          await this.useAdapter(first.adapter);
          const r = await this.o.model.generate({
            prompts: take.map((j) => j.prompt),
            maxNewTokens: Math.max(...take.map((j) => j.maxTokens)),
            temperature: take.map((j) => j.temperature),
            topP: first.topP,
            topK: first.topK,
            // Each request's own seed: its samples do not depend on what it was batched with.
            rowSeeds: take.map((j) => j.seed),
            stopTokenIds: this.o.tokenizer.stopTokenIds,
            stopStrings: first.stop,
          });
          take.forEach((j, i) => {
            let ids = Array.from(r.tokens[i]);
            const lps = Array.from(r.logprobs[i]).slice(0, j.maxTokens);
            let finish: 'stop' | 'length' = r.finishReasons[i] === 'length' ? 'length' : 'stop';
            if (ids.length > j.maxTokens) {
              ids = ids.slice(0, j.maxTokens);
              finish = 'length';
            }
            const stopped = ids.length && this.o.tokenizer.stopTokenIds.includes(ids[ids.length - 1]);
            let text = this.o.tokenizer.decode(stopped ? ids.slice(0, -1) : ids, { skipSpecialTokens: true });
            // OpenAI semantics: the stop string ends the text and is not part of it.
            let cut = -1;
            for (const s of j.stop) {
              const at = text.indexOf(s);
              if (at >= 0 && (cut < 0 || at < cut)) cut = j.keepStop ? at + s.length : at;
            }
            if (cut >= 0) {
              text = text.slice(0, cut);
              finish = 'stop';
            }
            j.resolve({ text, ids, logprobs: lps, finish });
          });
        } catch (e) {
          for (const j of take) j.reject(e as Error);
        }
      }
    } finally {
      this.busy = false;
    }
  }
}
