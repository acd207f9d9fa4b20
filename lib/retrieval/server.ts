/**
 * `slm-train serve-retriever`: our index (HNSW, BM25 or hybrid) behind Search-R1's retrieval server
 * protocol, so Search-R1, verl and other trainers can point their `retriever.url` at it.
 *
 *   POST /retrieve  {queries: string[], topk?: int, return_scores?: bool}
 *     -> {result: [[{id, contents}, ...], ...]}                       (return_scores false)
 *     -> {result: [[{document: {id, contents}, score}, ...], ...]}    (return_scores true)
 *   GET /health     -> {status: "ok", pages, chunks, kind}
 *
 * `contents` is the page title, a newline, then the passage text, as in Search-R1's wiki-18 corpus
 * (its clients take the first line as the title). Bad requests get 422 with a message, as FastAPI's
 * validation does.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { describe } from '../errors.js';
import { HttpError, closeServer, listen, readBody, sendJson } from '../serve/http.js';
import type { Passage } from './index.js';

/** The most passages one query may ask for (the server's default maxTopK, and the CLI's --topk bound). */
export const MAX_TOPK = 100;

/** The longest query searched by default, in characters (a search query is a line, not a document). */
export const MAX_QUERY_CHARS = 8192;

/** What the server needs from an index (a SearchIndex has it). */
export interface PassageSearch {
  searchPassages(query: string, k: number): Promise<Passage[]>;
  readonly corpus?: { pages: readonly unknown[] };
  readonly chunks?: readonly unknown[];
  readonly params?: { kind: string };
}

export interface RetrieverServerOptions {
  index: PassageSearch;
  port: number;
  host?: string;
  /** topk when a request gives none (Search-R1's --topk; default 3). */
  topK?: number;
  /** Largest topk and most queries a request may ask (defaults 100 and 4096). */
  maxTopK?: number;
  maxQueries?: number;
  /** The longest query, in characters (default MAX_QUERY_CHARS); a longer one is refused before any search. */
  maxQueryChars?: number;
  /** The largest request body read (default 32 MiB); a larger one is a 413. */
  maxBodyBytes?: number;
  log?: (line: string) => void;
}

export class RetrieverServer {
  readonly server: Server;
  /** Requests answered and queries searched. */
  readonly stats = { requests: 0, queries: 0 };

  constructor(readonly o: RetrieverServerOptions) {
    this.server = createServer((req, res) => void this.handle(req, res));
  }

  listen(): Promise<number> {
    return listen(this.server, this.o.port, this.o.host);
  }

  close(): Promise<void> {
    return closeServer(this.server);
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    try {
      const url = (req.url ?? '/').split('?')[0].replace(/\/+$/, '');
      if (req.method === 'GET' && (url === '/health' || url === '')) {
        const ix = this.o.index;
        return sendJson(res, 200, {
          status: 'ok',
          pages: ix.corpus?.pages.length ?? null,
          chunks: ix.chunks?.length ?? null,
          kind: ix.params?.kind ?? null,
        });
      }
      if (req.method !== 'POST' || url !== '/retrieve')
        throw new HttpError(404, `no route ${req.method} ${url}; POST /retrieve with {queries, topk, return_scores}`, 'not_found');
      const body = (await readBody(req, this.o.maxBodyBytes)) as Record<string, unknown> | null;
      if (!body || typeof body !== 'object' || Array.isArray(body))
        throw new HttpError(422, 'the body must be a JSON object {queries, topk, return_scores}');
      const { queries } = body;
      const maxQ = this.o.maxQueries ?? 4096;
      if (!Array.isArray(queries) || queries.some((q) => typeof q !== 'string'))
        throw new HttpError(422, `queries must be a list of strings, found ${describe(queries)}`);
      if (queries.length > maxQ) throw new HttpError(422, `at most ${maxQ} queries per request, found ${queries.length}; split the batch`);
      const maxChars = this.o.maxQueryChars ?? MAX_QUERY_CHARS;
      const long = (queries as string[]).findIndex((q) => q.length > maxChars);
      if (long >= 0)
        throw new HttpError(
          422,
          `queries[${long}] has ${queries[long].length} characters, over this server's limit of ${maxChars}; send a shorter query (a question or a few key words)`,
          'invalid_request_error',
          'queries',
          'query_too_long',
        );
      const maxK = this.o.maxTopK ?? MAX_TOPK;
      const topk = body.topk ?? this.o.topK ?? 3;
      if (typeof topk !== 'number' || !Number.isInteger(topk) || topk < 1 || topk > maxK)
        throw new HttpError(422, `topk must be an integer from 1 to ${maxK}, found ${describe(body.topk)}`);
      const scores = body.return_scores ?? false;
      if (typeof scores !== 'boolean') throw new HttpError(422, `return_scores must be true or false, found ${describe(scores)}`);
      // An empty query matches nothing (rather than failing the whole batch).
      const found = await Promise.all(
        (queries as string[]).map((q) => (q.trim() ? this.o.index.searchPassages(q, topk) : Promise.resolve([]))),
      );
      this.stats.requests++;
      this.stats.queries += queries.length;
      const doc = (p: Passage) => ({ id: p.page_id, contents: `${p.title}\n${p.text}` });
      sendJson(res, 200, { result: found.map((ps) => ps.map((p) => (scores ? { document: doc(p), score: p.score } : doc(p)))) });
    } catch (e) {
      const status = e instanceof HttpError ? e.status : 500;
      if (status === 500) this.o.log?.(`retrieve failed: ${(e as Error).message}`);
      sendJson(res, status, {
        error: {
          message: (e as Error).message,
          type: e instanceof HttpError ? e.type : 'server_error',
          ...(e instanceof HttpError && e.code ? { code: e.code } : {}),
        },
        detail: (e as Error).message,
      });
    }
  }
}
