// Search-R1's retrieval server protocol both ways (issue 10, items 2 and 3): `slm-train
// serve-retriever` answers POST /retrieve like Search-R1's retrieval_server.py, and the
// `retrieval.kind: http` client (batching, timeouts, retries) reads it, over loopback.
import { spawn } from 'node:child_process';
import { createServer, type Server } from 'node:http';
import { recordWaits } from './helpers/waits.js';
import type { AddressInfo } from 'node:net';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { validateConfig } from '../lib/config/load.js';
import { formatInformation } from '../lib/episodes/tags.js';
import { HttpRetriever, retrieveUrl, splitContents } from '../lib/retrieval/http.js';
import { SearchIndex } from '../lib/retrieval/index.js';
import { Corpus } from '../lib/retrieval/corpus.js';
import { RetrieverServer } from '../lib/retrieval/server.js';
import { syntheticCorpus } from '../lib/retrieval/synthetic.js';
import { openEnvironment } from '../lib/train/environment.js';
import { repoRoot } from './helpers/shared.js';

const { pages, questions } = syntheticCorpus({ pages: 60, seed: 5 });
let index: SearchIndex;
let server: RetrieverServer;
let base = '';

t.before(async () => {
  index = await SearchIndex.build(new Corpus(pages), { kind: 'hybrid' });
  server = new RetrieverServer({ index, port: 0, topK: 3 });
  base = `http://127.0.0.1:${await server.listen()}`;
});
t.teardown(() => server.close());

const post = async (body: unknown, path = '/retrieve') => {
  const r = await fetch(base + path, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  return { status: r.status, body: (await r.json()) as Record<string, unknown> };
};

t.test('the server answers like Search-R1: one list per query, contents = title line + text', async (t) => {
  const qs = questions.slice(0, 4).map((q) => q.question);
  const plain = await post({ queries: qs, topk: 2 });
  t.equal(plain.status, 200);
  const result = plain.body.result as Array<Array<{ id: string; contents: string }>>;
  t.equal(result.length, 4);
  for (let i = 0; i < qs.length; i++) {
    const want = await index.searchPassages(qs[i], 2);
    t.same(
      result[i],
      want.map((p) => ({ id: p.page_id, contents: `${p.title}\n${p.text}` })),
      `query ${i}: the index's top-2 passages, in order`,
    );
    t.equal(result[i][0].contents.split('\n')[0], pages.find((p) => p.id === want[0].page_id)!.title, 'first line is the page title');
  }
  const scored = await post({ queries: qs.slice(0, 1), return_scores: true });
  const docs = (scored.body.result as Array<Array<{ document: { id: string; contents: string }; score: number }>>)[0];
  t.equal(docs.length, 3, 'no topk: the server default (--topk 3)');
  const want = await index.searchPassages(qs[0], 3);
  t.same(
    docs.map((d) => d.score),
    want.map((p) => p.score),
    'return_scores: {document, score}',
  );
  t.same((await post({ queries: ['', '   '] })).body.result, [[], []], 'empty queries match nothing without failing the batch');
  const health = await (await fetch(`${base}/health`)).json();
  t.match(health, { status: 'ok', pages: 60, kind: 'hybrid' });
});

t.test('bad requests get 422/404 with a message, not a crash', async (t) => {
  for (const [body, re] of [
    [{ topk: 3 }, /queries must be a list of strings/],
    [{ queries: 'who' }, /queries must be a list of strings/],
    [{ queries: ['a', 3] }, /queries must be a list of strings/],
    [{ queries: ['a'], topk: 0 }, /topk must be an integer from 1 to 100/],
    [{ queries: ['a'], topk: 2.5 }, /topk must be an integer/],
    [{ queries: ['a'], return_scores: 'yes' }, /return_scores must be true or false/],
    [[1, 2], /must be a JSON object/],
  ] as const) {
    const r = await post(body);
    t.equal(r.status, 422, JSON.stringify(body));
    t.match((r.body.error as { message: string }).message, re);
  }
  const notJson = await post('{"queries": [');
  t.equal(notJson.status, 400);
  t.match((notJson.body.error as { message: string }).message, /not valid JSON/);
  const wrong = await post({ queries: ['a'] }, '/search');
  t.equal(wrong.status, 404);
  t.match((wrong.body.error as { message: string }).message, /POST \/retrieve/);
  t.equal((await post({ queries: ['a'] })).status, 200, 'still serving after bad requests');
});

t.test('the client returns what the index returns, and batches concurrent queries into one request', async (t) => {
  const client = new HttpRetriever({ url: base });
  t.equal(client.url, `${base}/retrieve`, 'a URL without a path gets /retrieve');
  const before = { ...server.stats };
  const qs = questions.slice(0, 12).map((q) => q.question);
  const got = await Promise.all(qs.map((q) => client.searchPassages(q, 3)));
  for (let i = 0; i < qs.length; i++) t.same(got[i], await index.searchPassages(qs[i], 3), `query ${i}`);
  t.equal(client.stats.requests, 1, 'twelve queries asked together: one request');
  t.equal(server.stats.requests - before.requests, 1);
  t.equal(server.stats.queries - before.queries, 12);
  // Different k in the same tick: one request per k.
  await Promise.all([client.searchPassages(qs[0], 1), client.searchPassages(qs[1], 1), client.searchPassages(qs[2], 5)]);
  t.equal(client.stats.requests, 3);
  // maxBatch splits a large batch.
  const small = new HttpRetriever({ url: base, maxBatch: 5 });
  await Promise.all(qs.map((q) => small.searchPassages(q, 2)));
  t.equal(small.stats.requests, 3, '12 queries at 5 per request');
  await t.rejects(client.searchPassages('  ', 3), { code: 'ARGUMENT_INVALID' }, "an empty query is the model's mistake, shown to it");
});

t.test('Search-R1 documents: contents split at the first newline; text/title documents too', async (t) => {
  t.same(splitContents('"Paris"\nParis is the capital.\nMore.'), { title: '"Paris"', text: 'Paris is the capital.\nMore.' });
  t.same(splitContents('no newline'), { title: 'no newline', text: '' });
  t.equal(retrieveUrl('127.0.0.1:8000'), 'http://127.0.0.1:8000/retrieve');
  t.equal(retrieveUrl('http://h:1/custom/retrieve'), 'http://h:1/custom/retrieve');
  t.throws(() => retrieveUrl('ftp://h/x'), { code: 'CONFIG_INVALID' });
  const fake = await serve((_req, body, res) => {
    const n = (body as { queries: string[] }).queries.length;
    const docs = [
      { document: { id: '7', contents: '"Eiffel Tower"\nA tower in Paris.' }, score: 0.9 },
      { id: 8, title: 'Louvre', text: 'A museum.' },
    ];
    res.end(JSON.stringify({ result: Array.from({ length: n }, () => docs) }));
  });
  const c = new HttpRetriever({ url: fake.url });
  const ps = await c.searchPassages('paris', 2);
  t.same(ps, [
    { page_id: '7', title: '"Eiffel Tower"', text: 'A tower in Paris.', score: 0.9 },
    { page_id: '8', title: 'Louvre', text: 'A museum.', score: 0 },
  ]);
  t.equal(
    formatInformation(ps),
    '\n\n<information>Doc 1(Title: "Eiffel Tower") A tower in Paris.\nDoc 2(Title: Louvre) A museum.</information>\n\n',
    "Search-R1's Doc i(Title: …) lines",
  );
  await fake.close();
});

type Handler = (req: import('node:http').IncomingMessage, body: unknown, res: import('node:http').ServerResponse, n: number) => void;
// Every fake server still open when the file ends (a failed assertion skips its close) is closed then.
const open = new Set<Server>();
t.teardown(() => {
  for (const s of open) s.closeAllConnections(), s.close();
});

async function serve(h: Handler): Promise<{ url: string; hits: () => number; close: () => Promise<void> }> {
  let n = 0;
  const s: Server = createServer((req, res) => {
    let raw = '';
    req.on('data', (c) => (raw += c));
    req.on('end', () => h(req, raw ? JSON.parse(raw) : null, res, ++n));
  });
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', () => r()));
  open.add(s);
  return {
    url: `http://127.0.0.1:${(s.address() as AddressInfo).port}/retrieve`,
    hits: () => n,
    close: () =>
      new Promise<void>((r) => {
        open.delete(s);
        s.closeAllConnections();
        s.close(() => r());
      }),
  };
}

t.test('timeouts and retries: 503, 408, a dropped connection and a silent server are retried; other 4xx are not', async (t) => {
  const answer = (body: unknown) =>
    JSON.stringify({ result: (body as { queries: string[] }).queries.map(() => [{ id: '1', contents: 'T\nx' }]) });
  const flaky = await serve((req, body, res, n) => {
    if (n === 1) {
      res.writeHead(503);
      res.end('busy');
      return;
    }
    if (n === 2) {
      req.socket.destroy();
      return;
    }
    if (n === 3) {
      res.writeHead(408);
      res.end('request timeout');
      return;
    }
    res.end(answer(body));
  });
  const c = new HttpRetriever({ url: flaky.url, retries: 3, backoffMs: 10 });
  t.same(await c.searchPassages('q', 1), [{ page_id: '1', title: 'T', text: 'x', score: 0 }], 'answered on the fourth try');
  t.equal(flaky.hits(), 4);
  t.equal(c.stats.retries, 3);
  await flaky.close();

  const silent = await serve(() => {});
  const s = new HttpRetriever({ url: silent.url, timeoutS: 0.2, retries: 1, backoffMs: 10 });
  const waits = recordWaits(t);
  await t.rejects(s.searchPassages('q', 1), {
    code: 'RETRIEVER_UNAVAILABLE',
    message: /failed 2 times \(last: no reply within 200 ms\).*serve-retriever/,
  });
  t.equal(waits.length, 1, 'gives up after its tries (one wait between two attempts) instead of hanging');
  t.equal(silent.hits(), 2);
  await silent.close();

  const bad = await serve((_req, _b, res) => {
    res.writeHead(422);
    res.end('{"detail":"queries missing"}');
  });
  const b = new HttpRetriever({ url: bad.url, retries: 3, backoffMs: 10 });
  await t.rejects(b.searchPassages('q', 1), { code: 'RETRIEVER_ERROR', message: /HTTP 422.*queries missing/ });
  t.equal(bad.hits(), 1, 'a client error is not retried');
  await bad.close();

  const garbled = await serve((_req, _b, res) => res.end('{"result": [[], []]}'));
  await t.rejects(new HttpRetriever({ url: garbled.url }).searchPassages('q', 1), {
    code: 'RETRIEVER_ERROR',
    message: /one list of documents per query \(1\)/,
  });
  await garbled.close();

  const nobody = await serve(() => {});
  const url = nobody.url;
  await nobody.close();
  await t.rejects(new HttpRetriever({ url, retries: 1, backoffMs: 10 }).searchPassages('q', 1), {
    code: 'RETRIEVER_UNAVAILABLE',
    message: /ECONNREFUSED/,
  });
});

t.test('retrieval.kind: http in a config: the tags protocol searches the server', async (t) => {
  const base0 = { stage: 'ppo', model: { path: 'unused' }, data: { questions: 'q.jsonl' }, protocol: { kind: 'tags', top_k: 3 } };
  const cfg = validateConfig({ ...base0, retrieval: { kind: 'http', url: base } }, 'test');
  const env = await openEnvironment(cfg);
  t.match(env.describe, /retrieval server http:\/\/127\.0\.0\.1:\d+\/retrieve/);
  const q = questions[0].question;
  const ctx = { turn: 1, maxTurns: 4, finishReason: 'stop' as const, maxNewTokens: 64 };
  const reply = await env.protocol.respond({ kind: 'search', query: q, end: 0 } as never, ctx as never);
  t.equal(
    (reply as { text: string }).text,
    formatInformation(await index.searchPassages(q, 3)),
    "the observation equals the local index's",
  );
  await env.close();
  t.throws(() => validateConfig({ ...base0, retrieval: { kind: 'http' } }, 'test'), {
    code: 'CONFIG_INVALID',
    message: /retrieval.url: missing/,
  });
  t.throws(() => validateConfig({ ...base0, protocol: { kind: 'code' }, retrieval: { kind: 'http', url: base } }, 'test'), {
    code: 'CONFIG_INVALID',
    message: /retrieval.kind: http serves passages for the tags protocol/,
  });
});

t.test('slm-train serve-retriever: a real process on loopback, and PORT_IN_USE', async (t) => {
  const dir = t.testdir();
  const corpus = join(dir, 'corpus.jsonl');
  writeFileSync(
    corpus,
    pages
      .slice(0, 30)
      .map((p) => JSON.stringify(p))
      .join('\n') + '\n',
  );
  const p = spawn(
    process.execPath,
    [join(repoRoot, 'bin', 'slm-train.js'), 'serve-retriever', '--corpus', corpus, '--port', '0', '--topk', '2'],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  t.teardown(() => p.kill('SIGKILL'));
  const url = await new Promise<string>((resolve, reject) => {
    let out = '';
    p.stdout.on('data', (c) => {
      out += c;
      const m = /on (http:\/\/\S+\/retrieve)/.exec(out);
      if (m) resolve(m[1]);
    });
    p.on('exit', (code) => reject(new Error(`serve-retriever exited ${code}`)));
  });
  const c = new HttpRetriever({ url });
  const got = await c.searchPassages(pages[3].title, 2);
  t.equal(got.length, 2);
  t.ok(
    got.some((g) => g.page_id === pages[3].id),
    'a page found by its title',
  );
  const port = new URL(url).port;
  const taken = spawn(process.execPath, [join(repoRoot, 'bin', 'slm-train.js'), 'serve-retriever', '--corpus', corpus, '--port', port], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  t.teardown(() => taken.kill('SIGKILL'));
  let err = '';
  taken.stderr.on('data', (c) => (err += c));
  const code = await new Promise<number | null>((r) => taken.on('exit', r));
  t.not(code, 0);
  t.match(err, /PORT_IN_USE/);
  t.notMatch(err, /\n\s+at /, 'no stack trace');
  p.kill('SIGTERM');
  t.equal(await new Promise((r) => p.on('exit', r)), 0, 'SIGTERM closes it cleanly');
});
