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
 * - Tools (chat): `tools` are rendered by the chat template (Qwen's <tools> block); with
 *   tool_choice 'auto' the reply's `<tool_call>` blocks become `tool_calls` (finish_reason
 *   'tool_calls'), streamed as `delta.tool_calls` (lib/serve/tools.ts). 'required', a named choice
 *   and response_format json_object / json_schema need constrained decoding: coded 400s.
 * - `GET /metrics`: Prometheus text (lib/serve/metrics.ts).
 *
 * LoRA adapters at run time, as vLLM serves them (`--enable-lora`): POST /v1/load_lora_adapter
 * {lora_name, lora_path} (a PEFT folder) and POST /v1/unload_lora_adapter {lora_name}; a request
 * whose `model` is a loaded adapter's name runs with that adapter (the engine holds one adapter at a
 * time, so a call is one adapter's rows, and the adapter is swapped between calls). With
 * `return_tokens_as_token_ids` log-prob tokens are "token_id:N" (what lib/engine/openai-rollout.ts
 * reads).
 *
 * This file holds the HTTP routes and the completion endpoints; the request checks are in
 * lib/serve/request.ts, a request's rows in job.ts, the batching queue in batcher.ts, the log-prob
 * objects in logprobs.ts, the options in options.ts, tool calls in tools.ts, /metrics in metrics.ts.
 */
import { randomUUID } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { describe } from '../errors.js';
import { HttpError, closeServer, listen, readBody, sendJson } from './http.js';
import { readAdapterConfig } from '../engine/adapter.js';
import type { SessionStats } from '../engine/session.js';
import { Batcher, type CallRecord } from './batcher.js';
import type { History } from './history.js';
import { Job, type RowResult } from './job.js';
import { LogprobFormat } from './logprobs.js';
import type { ServeOptions } from './options.js';
import { ServeMetrics } from './metrics.js';
import { isObj, parseRequest, rowSeed, type Sampling } from './request.js';
import { ToolCallParser, type ToolCall } from './tools.js';

export type { ServeOptions } from './options.js';

export class OpenAIServer {
  readonly server: Server;
  private seq = 0;
  /** Adapters loaded at run time: name -> PEFT folder. */
  readonly adapters = new Map<string, string>();
  private readonly batcher: Batcher;
  private readonly logprobs: LogprobFormat;
  /** What GET /metrics reports. */
  readonly metrics = new ServeMetrics();

  constructor(readonly o: ServeOptions) {
    this.server = createServer((req, res) => void this.handle(req, res));
    this.batcher = new Batcher(o, this.adapters);
    this.logprobs = new LogprobFormat(o.tokenizer);
  }

  /** Rows submitted together to a decode session (tests and logs): the recent submissions and their count. */
  get batches(): History<number> {
    return this.batcher.batches;
  }

  /** Each finished submission: its rows, decode steps and how each row ended (tests and logs). */
  get calls(): History<CallRecord> {
    return this.batcher.calls;
  }

  /** Each finished decode session's counters (rows, rows that joined it running, steps, prefill). */
  get sessions(): History<SessionStats> {
    return this.batcher.sessionStats;
  }

  listen(): Promise<number> {
    return listen(this.server, this.o.port, this.o.host);
  }

  /** Stops listening and closes every connection: each request's rows are cancelled (see complete). */
  close(): Promise<void> {
    return closeServer(this.server);
  }

  /**
   * Resolves when no row is queued and no generate call runs. After close() a running call ends at
   * its next decode step (every row cancelled), but a prefill in progress runs to its end first: it
   * is one native step that a cancel does not interrupt.
   */
  idle(): Promise<void> {
    return this.batcher.idle();
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
          ...[...this.adapters].map(([id, path]) => ({
            id,
            object: 'model',
            created,
            owned_by: 'slm-train',
            root: path,
            parent: this.o.name,
          })),
        ];
        return sendJson(res, 200, { object: 'list', data });
      }
      if (req.method === 'GET' && url === '/metrics') {
        res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4; charset=utf-8' });
        res.end(this.metrics.render(this.o.name));
        return;
      }
      const lora = url === '/v1/load_lora_adapter' || url === '/v1/unload_lora_adapter';
      if (req.method !== 'POST' || (url !== '/v1/chat/completions' && url !== '/v1/completions' && !lora))
        throw new HttpError(
          404,
          `no route ${req.method} ${url}; POST /v1/chat/completions, /v1/completions, /v1/load_lora_adapter or /v1/unload_lora_adapter; GET /v1/models, /health or /metrics`,
          'not_found',
        );
      const body = (await readBody(req, this.o.maxBodyBytes)) as Record<string, unknown> | null;
      if (!isObj(body)) throw new HttpError(400, 'the body must be a JSON object');
      if (lora) return this.adapterRoute(res, url, body);
      const t0 = performance.now();
      this.metrics.start();
      let status = 500;
      try {
        await this.complete(res, url === '/v1/chat/completions', body);
        status = res.statusCode;
      } catch (e) {
        status = HttpError.from(e).status;
        throw e;
      } finally {
        // A client that left before its reply: 499, as nginx counts it.
        this.metrics.finish(url, res.destroyed && !res.writableFinished ? 499 : status, (performance.now() - t0) / 1000);
      }
    } catch (e) {
      const he = HttpError.from(e);
      if (!(e instanceof HttpError)) this.o.log?.(`serve: ${he.message}`);
      if (!res.headersSent) sendJson(res, he.status, he.body());
    }
  }

  /** Text of ids; ids past the tokenizer's vocabulary (a model's padding rows) have none. */
  private decoder(s: Sampling): (ids: number[]) => string {
    const V = this.o.tokenizer.vocabSize;
    return (ids) =>
      this.o.tokenizer.decode(ids.some((id) => id >= V) ? ids.filter((id) => id < V) : ids, { skipSpecialTokens: s.skipSpecial });
  }

  /** A chat or text completion, streamed or not. */
  private async complete(res: ServerResponse, chat: boolean, body: Record<string, unknown>): Promise<void> {
    const p = parseRequest(this, chat, body);
    const jobs: Job[] = [];
    const base = p.seed ?? this.seq++;
    for (const prompt of p.prompts)
      for (let i = 0; i < p.n; i++) jobs.push(new Job(Int32Array.from(prompt), p.s, rowSeed(base, i), this.decoder(p.s)));
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
    try {
      await this.run(res, chat, p, jobs, { id, created, model, usage });
    } finally {
      this.metrics.tokens(
        promptTokens,
        jobs.reduce((a, j) => a + j.ids.length, 0),
      );
    }
  }

  /** The reply (or the stream) of a checked request's rows. */
  private async run(
    res: ServerResponse,
    chat: boolean,
    request: ReturnType<typeof parseRequest>,
    jobs: Job[],
    {
      id,
      created,
      model,
      usage,
    }: {
      id: string;
      created: number;
      model: string;
      usage: () => { prompt_tokens: number; completion_tokens: number; total_tokens: number };
    },
  ): Promise<void> {
    const tools = chat && request.tools?.active ? request.tools : null;

    if (!request.stream) {
      this.batcher.enqueue(jobs);
      let results: RowResult[];
      try {
        results = await Promise.all(jobs.map((j) => j.result));
      } catch (e) {
        for (const j of jobs) j.abort.abort();
        throw e;
      }
      if (res.destroyed) return;
      const choices = jobs.map((job, index) => {
        const r = results[index];
        const lp = request.s.logprobs
          ? chat
            ? this.logprobs.chat(job, 0, job.ids.length, request)
            : this.logprobs.text(job, 0, job.ids.length, 0, request).logprobs
          : null;
        if (chat && tools && r.finish !== 'cancelled') {
          // The reply parsed for <tool_call> blocks (the same parser as the stream's).
          const parser = new ToolCallParser(tools.parallel);
          parser.push(r.text);
          parser.end();
          const calls = parser.calls;
          return {
            index,
            message: { role: 'assistant', content: parser.content, ...(calls.length ? { tool_calls: calls } : {}) },
            logprobs: lp,
            finish_reason: calls.length ? 'tool_calls' : r.finish,
          };
        }
        return chat
          ? { index, message: { role: 'assistant', content: r.text }, logprobs: lp, finish_reason: r.finish }
          : { index, text: r.text, logprobs: lp, finish_reason: r.finish };
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
        ...(request.continuousUsage ? { usage: usage() } : request.includeUsage ? { usage: null } : {}),
      });
    if (chat) jobs.forEach((_, index) => chunk({ index, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }));
    /** A tool call as streamed: its id, type and name, then its arguments (as vLLM's hermes parser ends a call). */
    const callChunks = (index: number, calls: ToolCall[], first: number) =>
      calls.forEach((c, k) => {
        chunk({
          index,
          delta: { tool_calls: [{ index: first + k, id: c.id, type: 'function', function: { name: c.function.name, arguments: '' } }] },
          logprobs: null,
          finish_reason: null,
        });
        chunk({
          index,
          delta: { tool_calls: [{ index: first + k, function: { arguments: c.function.arguments } }] },
          logprobs: null,
          finish_reason: null,
        });
      });
    jobs.forEach((job, index) => {
      let reported = 0; // tokens whose log-probs went out
      let offset = 0; // completions' text_offset of the next token
      const parser = tools ? new ToolCallParser(tools.parallel) : null;
      job.listener = (raw, end) => {
        const upto = job.ids.length;
        let piece = raw;
        let calls: ToolCall[] = [];
        const before = parser?.calls.length ?? 0;
        if (parser) {
          const d = parser.push(raw);
          const e = end ? parser.end() : { content: '', calls: [] };
          piece = d.content + e.content;
          calls = [...d.calls, ...e.calls];
        }
        if (piece || (end && request.s.logprobs && upto > reported)) {
          let lp = null;
          if (request.s.logprobs) {
            if (chat) lp = this.logprobs.chat(job, reported, upto, request);
            else {
              const t = this.logprobs.text(job, reported, upto, offset, request);
              offset = t.next;
              lp = t.logprobs;
            }
            reported = upto;
          }
          chunk(
            chat
              ? { index, delta: { content: piece }, logprobs: lp, finish_reason: null }
              : { index, text: piece, logprobs: lp, finish_reason: null },
          );
        }
        if (calls.length) callChunks(index, calls, before);
        // (a cancelled row never calls its listener)
        if (end) {
          const finish = parser?.calls.length ? 'tool_calls' : end.finish;
          chunk(
            chat ? { index, delta: {}, logprobs: null, finish_reason: finish } : { index, text: '', logprobs: null, finish_reason: finish },
          );
        }
      };
    });
    this.batcher.enqueue(jobs);
    try {
      await Promise.all(jobs.map((j) => j.result));
      if (request.includeUsage)
        send({ id, object: chat ? 'chat.completion.chunk' : 'text_completion', created, model, choices: [], usage: usage() });
    } catch (e) {
      for (const j of jobs) j.abort.abort();
      const he = HttpError.from(e);
      this.o.log?.(`serve: ${he.message}`);
      send(he.body());
    }
    for (const j of jobs)
      if (j.mismatch)
        this.o.log?.(`serve: the streamed text of ${id} differs from its decoded text (the tokenizer's decoder is not prefix-stable)`);
    if (!res.writableEnded && !res.destroyed) res.end('data: [DONE]\n\n');
  }

  /** vLLM's runtime LoRA routes: load {lora_name, lora_path} / unload {lora_name}. */
  private adapterRoute(res: ServerResponse, url: string, body: Record<string, unknown>): void {
    const name = body.lora_name;
    if (typeof name !== 'string' || !name || name === this.o.name)
      throw new HttpError(400, `lora_name must be a non-empty string other than the base model's name, found ${describe(name)}`);
    if (url === '/v1/unload_lora_adapter') {
      if (!this.adapters.delete(name)) throw new HttpError(404, `no adapter named '${name}' is loaded`, 'not_found');
      this.o.log?.(`serve: unloaded adapter ${name}`);
      res.writeHead(200, { 'content-type': 'text/plain' }).end(`Success: LoRA adapter '${name}' removed successfully.`);
      return;
    }
    if (this.adapters.has(name))
      throw new HttpError(400, `an adapter named '${name}' is already loaded; unload it first or choose another name`);
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
}
