/**
 * A client of Search-R1's retrieval server protocol (`retrieval: {kind: http, url}`): `POST
 * /retrieve` with `{queries, topk, return_scores}`, answered by `{result: [...]}` with one list per
 * query of documents `{id, contents}` (or `{document: {id, contents}, score}` with return_scores),
 * where the first line of `contents` is the title. It speaks to Search-R1's `retrieval_server.py`,
 * verl's search tool servers, and `slm-train serve-retriever`.
 *
 * Every query asked in the same turn of the event loop (the episode runner asks all active
 * episodes' searches at once) goes out in one request (up to `maxBatch` queries per request).
 * Requests time out, and connection errors, timeouts, 408, 429 and 5xx are retried with exponential
 * backoff; after the last try the run stops with RETRIEVER_UNAVAILABLE (a retriever that is down
 * must not turn into "no passages" observations that the policy then learns from).
 */
import { SlmError, describe } from '../errors.js';
import { AttemptError, backoffMs, fetchText, retryableStatus, withRetries } from '../util/http-retry.js';
import type { Passage } from './index.js';

export interface HttpRetrieverOptions {
  /** The server, e.g. `http://127.0.0.1:8000/retrieve` (a URL without a path gets `/retrieve`). */
  url: string;
  /** Seconds per request before it is abandoned (and retried). Default 30. */
  timeoutS?: number;
  /** Retries after the first try. Default 3. */
  retries?: number;
  /** Queries per request. Default 512. */
  maxBatch?: number;
  /** First backoff in ms, doubled per retry. Default 250. */
  backoffMs?: number;
}

interface Pending {
  query: string;
  k: number;
  resolve: (p: Passage[]) => void;
  reject: (e: Error) => void;
}

/** The `/retrieve` URL for what a user wrote (`host:port`, `http://host:port`, or the full URL). */
export function retrieveUrl(url: string): string {
  let u: URL;
  try {
    u = new URL(/^[a-z]+:\/\//i.test(url) ? url : `http://${url}`);
  } catch {
    throw new SlmError(
      'CONFIG_INVALID',
      `retrieval.url: expected an http(s) URL of a retrieval server such as http://127.0.0.1:8000/retrieve, found ${describe(url)}.`,
      { path: 'retrieval.url' },
    );
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:')
    throw new SlmError(
      'CONFIG_INVALID',
      `retrieval.url: expected http:// or https://, found ${u.protocol}//. Point it at a Search-R1-style retrieval server.`,
      { path: 'retrieval.url' },
    );
  if (u.pathname === '/' || u.pathname === '') u.pathname = '/retrieve';
  return u.toString();
}

/** Splits a Search-R1 document's `contents` into title (first line) and text (the rest), as its `_passages2string` does. */
export function splitContents(contents: string): { title: string; text: string } {
  const nl = contents.indexOf('\n');
  return nl < 0 ? { title: contents, text: '' } : { title: contents.slice(0, nl), text: contents.slice(nl + 1) };
}

function toPassage(item: unknown, where: string): Passage {
  const o = item as Record<string, unknown> | null;
  const doc = (o && typeof o === 'object' && o.document && typeof o.document === 'object' ? o.document : o) as Record<
    string,
    unknown
  > | null;
  const score = o && typeof o.score === 'number' ? o.score : 0;
  if (!doc || typeof doc !== 'object')
    throw new SlmError('RETRIEVER_ERROR', `${where}: expected a document {id, contents} or {document, score}, found ${describe(item)}.`);
  const id = doc.id === undefined || doc.id === null ? '' : String(doc.id);
  if (typeof doc.contents === 'string') return { page_id: id, ...splitContents(doc.contents), score };
  if (typeof doc.text === 'string') return { page_id: id, title: typeof doc.title === 'string' ? doc.title : '', text: doc.text, score };
  throw new SlmError(
    'RETRIEVER_ERROR',
    `${where}: the document has no "contents" (or "text") string; found keys ${Object.keys(doc).join(', ') || 'none'}.`,
  );
}

export class HttpRetriever {
  readonly url: string;
  private readonly timeoutMs: number;
  private readonly retries: number;
  private readonly maxBatch: number;
  private readonly backoffMs: number;
  private queue: Pending[] = [];
  private scheduled = false;
  /** Requests sent and queries asked (batching shows as queries > requests). */
  readonly stats = { requests: 0, queries: 0, retries: 0 };

  constructor(opts: HttpRetrieverOptions) {
    this.url = retrieveUrl(opts.url);
    this.timeoutMs = (opts.timeoutS ?? 30) * 1000;
    this.retries = opts.retries ?? 3;
    this.maxBatch = Math.max(1, opts.maxBatch ?? 512);
    this.backoffMs = opts.backoffMs ?? 250;
  }

  /** The top-k passages for a query; queries asked together share a request. */
  searchPassages(query: string, k = 3): Promise<Passage[]> {
    if (typeof query !== 'string' || !query.trim())
      return Promise.reject(new SlmError('ARGUMENT_INVALID', `a search needs a non-empty text query, found ${describe(query)}.`));
    return new Promise((resolve, reject) => {
      this.queue.push({ query, k, resolve, reject });
      if (!this.scheduled) {
        this.scheduled = true;
        setImmediate(() => this.flush());
      }
    });
  }

  private flush(): void {
    this.scheduled = false;
    const q = this.queue;
    this.queue = [];
    const byK = new Map<number, Pending[]>();
    for (const p of q) {
      const g = byK.get(p.k);
      if (g) g.push(p);
      else byK.set(p.k, [p]);
    }
    for (const [k, group] of byK)
      for (let i = 0; i < group.length; i += this.maxBatch) {
        const part = group.slice(i, i + this.maxBatch);
        this.retrieve(
          part.map((p) => p.query),
          k,
        ).then(
          (res) => part.forEach((p, j) => p.resolve(res[j])),
          (e: Error) => part.forEach((p) => p.reject(e)),
        );
      }
  }

  /** One POST /retrieve for a list of queries (with timeouts and retries); one passage list per query. */
  async retrieve(queries: string[], k: number): Promise<Passage[][]> {
    this.stats.requests++;
    this.stats.queries += queries.length;
    const body = JSON.stringify({ queries, topk: k, return_scores: true });
    return withRetries(
      async () => {
        const { res, text } = await fetchText(
          this.url,
          { method: 'POST', headers: { 'content-type': 'application/json' }, body },
          this.timeoutMs,
        );
        // 408, 429 and 5xx are retried; another status means the server does not take this request.
        if (retryableStatus(res.status)) throw new AttemptError(`HTTP ${res.status} ${text.slice(0, 200)}`, true);
        if (!res.ok)
          throw new SlmError(
            'RETRIEVER_ERROR',
            `POST ${this.url} answered HTTP ${res.status}: ${text.slice(0, 300)}. Expected a Search-R1 retrieval server taking {queries, topk, return_scores}.`,
          );
        return this.parse(text, queries.length);
      },
      {
        retries: this.retries,
        delayMs: (n) => backoffMs(n, this.backoffMs, Infinity),
        onRetry: () => this.stats.retries++,
        fail: (last, errors) =>
          new SlmError(
            'RETRIEVER_UNAVAILABLE',
            `the retrieval server at ${this.url} failed ${errors.length} times (last: ${last.message}). Is it running? Start one with \`slm-train serve-retriever --index DIR --port N\` (or Search-R1's retrieval_server.py), or raise retrieval.timeout_s / retrieval.retries.`,
          ),
      },
    );
  }

  private parse(text: string, n: number): Passage[][] {
    let body: { result?: unknown };
    try {
      body = JSON.parse(text);
    } catch {
      throw new SlmError(
        'RETRIEVER_ERROR',
        `${this.url} did not answer JSON (found ${describe(text.slice(0, 80))}); expected {"result": [[documents], ...]}.`,
      );
    }
    const result = body?.result;
    if (!Array.isArray(result) || result.length !== n || result.some((r) => !Array.isArray(r)))
      throw new SlmError(
        'RETRIEVER_ERROR',
        `${this.url}: expected {"result": [...]} with one list of documents per query (${n}), found ${describe(result)}.`,
      );
    return result.map((docs: unknown[], i) => docs.map((d, j) => toPassage(d, `${this.url}: result[${i}][${j}]`)));
  }
}
