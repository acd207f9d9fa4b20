// `slm-train serve` and `serve-retriever` against hostile requests (issue 33): parameter names that
// Object.prototype also has are unknown parameters like any other (a 400, not a 500); a body over
// the size limit is a 413 with an error body, not a reset connection. The model is a stand-in: every
// request here is refused before anything is generated, so no native engine is needed.
import { request } from 'node:http';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import type { Model } from '../lib/engine/model.js';
import { ChatFormatter } from '../lib/model/chat.js';
import { initModel } from '../lib/model/init.js';
import { loadTokenizer } from '../lib/model/tokenizer.js';
import { RetrieverServer } from '../lib/retrieval/server.js';
import { OpenAIServer, type ServeOptions } from '../lib/serve/server.js';
import { runCli } from './helpers/cli.js';

const dir = join(t.testdir(), 'model');
initModel({ preset: 'tiny', out: dir, seed: 6 });
const tokenizer = loadTokenizer(dir);
const formatter = ChatFormatter.forModel(dir);
/** The little of a Model that request checks read; generating would fail, and no test here does. */
const model = { vocabSize: tokenizer.vocabSize, config: { num_hidden_layers: 2 } } as unknown as Model;

async function start(t: Test, extra: Partial<ServeOptions> = {}): Promise<string> {
  const server = new OpenAIServer({ model, tokenizer, formatter, name: 'tiny', port: 0, ...extra });
  const port = await server.listen();
  t.teardown(() => server.close());
  return `http://127.0.0.1:${port}/v1`;
}

t.test('parameters named like Object.prototype members are unknown parameters (400)', async (t) => {
  const base = await start(t);
  for (const chat of [true, false]) {
    const head = chat ? '"messages":[{"role":"user","content":"hi"}]' : '"prompt":"hi"';
    // Raw JSON: a `__proto__` key in an object literal would set the prototype instead.
    for (const name of ['toString', 'constructor', '__proto__', 'hasOwnProperty', 'valueOf']) {
      const r = await fetch(`${base}${chat ? '/chat/completions' : '/completions'}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: `{${head},"${name}":1}` });
      const body = (await r.json()) as { error: { message: string; param: string } };
      t.equal(r.status, 400, `${chat ? 'chat' : 'completions'}: ${name} is a 400`);
      t.match(body.error, { param: name, message: new RegExp(`^Unrecognized request argument supplied: ${name}\\.`) });
    }
  }
});

/** POSTs `size` bytes in 64 KiB chunks without a Content-Length (chunked), as a stream would. */
function postChunked(url: string, size: number): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request(url, { method: 'POST', headers: { 'content-type': 'application/json' } }, (res) => {
      let body = '';
      res.on('data', (c) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on('error', reject);
    const chunk = Buffer.alloc(64 << 10, 0x20);
    let sent = 0;
    const more = () => {
      while (sent < size) {
        sent += chunk.length;
        if (!req.write(chunk)) return void req.once('drain', more);
      }
      req.end();
    };
    more();
  });
}

t.test('a body over the limit is a 413 with an error body, on both servers', async (t) => {
  const search = { searchPassages: async () => [] };
  const retriever = new RetrieverServer({ index: search, port: 0 });
  const rport = await retriever.listen();
  t.teardown(() => retriever.close());
  const servers = [
    { name: 'serve', url: `${await start(t)}/chat/completions`, health: (await start(t)).replace(/\/v1$/, '/health') },
    { name: 'serve-retriever', url: `http://127.0.0.1:${rport}/retrieve`, health: `http://127.0.0.1:${rport}/health` },
  ];
  const big = Buffer.alloc(50 << 20, 0x20); // 50 MB of spaces: valid JSON padding, were it read
  for (const s of servers) {
    const r = await fetch(s.url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: big });
    t.equal(r.status, 413, `${s.name}: 50 MB with a Content-Length`);
    t.match(await r.json(), { error: { message: /the request body is over this server's limit of 33554432 bytes \(32\.0 MiB\): Content-Length is 52428800/, type: 'invalid_request_error' } });
    const c = await postChunked(s.url, 50 << 20);
    t.equal(c.status, 413, `${s.name}: 50 MB chunked`);
    t.match(JSON.parse(c.body), { error: { message: /over this server's limit of 33554432 bytes \(32\.0 MiB\): \d+ bytes received so far/ } });
    t.equal((await fetch(s.health)).status, 200, `${s.name} still answers`);
  }

  // The limit is an option.
  const small = await start(t, { maxBodyBytes: 1000 });
  const pad = (n: number) => JSON.stringify({ messages: [{ role: 'user', content: 'x'.repeat(n) }], nope: 1 });
  const over = await fetch(`${small}/chat/completions`, { method: 'POST', body: pad(2000) });
  t.match({ status: over.status, body: await over.json() }, { status: 413, body: { error: { code: 'request_too_large', message: /limit of 1000 bytes/ } } });
  const under = await fetch(`${small}/chat/completions`, { method: 'POST', body: pad(500) });
  t.match({ status: under.status, body: await under.json() }, { status: 400, body: { error: { message: /Unrecognized request argument supplied: nope/ } } }, 'a body under it is read');
  const cli = runCli(['serve-retriever', '--corpus', join(dir, 'none.jsonl'), '--max-body-mb', '0']);
  t.equal(cli.code, 2);
  t.match(cli.stderr, /error ARGUMENT_INVALID: --max-body-mb expects a number of MiB above 0 and at most 4096, found 0 \(number\)/);
});

t.test('serve-retriever: a query over the length limit is refused before any search', async (t) => {
  const searched: string[] = [];
  const search = { searchPassages: async (q: string) => (searched.push(q), []) };
  const server = new RetrieverServer({ index: search, port: 0 });
  const url = `http://127.0.0.1:${await server.listen()}/retrieve`;
  t.teardown(() => server.close());
  const post = async (body: unknown) => {
    const r = await fetch(url, { method: 'POST', body: JSON.stringify(body) });
    return { status: r.status, body: (await r.json()) as Record<string, any> };
  };
  // Row 9: one 12 MB query held the server for 6.7 s.
  const r = await post({ queries: ['fine', 'x'.repeat(12e6)] });
  t.match(r, { status: 422, body: { error: { code: 'query_too_long', message: /^queries\[1\] has 12000000 characters, over this server's limit of 8192; send a shorter query/ } } });
  t.same(searched, [], 'nothing was searched, not even the short query');
  t.equal((await post({ queries: ['y'.repeat(8192)] })).status, 200, 'a query at the limit is searched');
  t.equal(searched.length, 1);

  const strict = new RetrieverServer({ index: search, port: 0, maxQueryChars: 10 });
  const surl = `http://127.0.0.1:${await strict.listen()}/retrieve`;
  t.teardown(() => strict.close());
  const s = await fetch(surl, { method: 'POST', body: JSON.stringify({ queries: ['eleven char'] }) });
  t.match({ status: s.status, body: await s.json() }, { status: 422, body: { error: { code: 'query_too_long', message: /limit of 10;/ } } });
});
