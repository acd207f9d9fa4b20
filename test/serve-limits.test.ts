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
const model = { vocabSize: tokenizer.vocabSize, config: { num_hidden_layers: 2, max_position_embeddings: 40960 } } as unknown as Model;

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
      const r = await fetch(`${base}${chat ? '/chat/completions' : '/completions'}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: `{${head},"${name}":1}`,
      });
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
    t.match(await r.json(), {
      error: {
        message: /the request body is over this server's limit of 33554432 bytes \(32\.0 MiB\): Content-Length is 52428800/,
        type: 'invalid_request_error',
      },
    });
    const c = await postChunked(s.url, 50 << 20);
    t.equal(c.status, 413, `${s.name}: 50 MB chunked`);
    t.match(JSON.parse(c.body), {
      error: { message: /over this server's limit of 33554432 bytes \(32\.0 MiB\): \d+ bytes received so far/ },
    });
    t.equal((await fetch(s.health)).status, 200, `${s.name} still answers`);
  }

  // The limit is an option.
  const small = await start(t, { maxBodyBytes: 1000 });
  const pad = (n: number) => JSON.stringify({ messages: [{ role: 'user', content: 'x'.repeat(n) }], nope: 1 });
  const over = await fetch(`${small}/chat/completions`, { method: 'POST', body: pad(2000) });
  t.match(
    { status: over.status, body: await over.json() },
    { status: 413, body: { error: { code: 'request_too_large', message: /limit of 1000 bytes/ } } },
  );
  const under = await fetch(`${small}/chat/completions`, { method: 'POST', body: pad(500) });
  t.match(
    { status: under.status, body: await under.json() },
    { status: 400, body: { error: { message: /Unrecognized request argument supplied: nope/ } } },
    'a body under it is read',
  );
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
  t.match(r, {
    status: 422,
    body: {
      error: {
        code: 'query_too_long',
        message: /^queries\[1\] has 12000000 characters, over this server's limit of 8192; send a shorter query/,
      },
    },
  });
  t.same(searched, [], 'nothing was searched, not even the short query');
  t.equal((await post({ queries: ['y'.repeat(8192)] })).status, 200, 'a query at the limit is searched');
  t.equal(searched.length, 1);

  const strict = new RetrieverServer({ index: search, port: 0, maxQueryChars: 10 });
  const surl = `http://127.0.0.1:${await strict.listen()}/retrieve`;
  t.teardown(() => strict.close());
  const s = await fetch(surl, { method: 'POST', body: JSON.stringify({ queries: ['eleven char'] }) });
  t.match(
    { status: s.status, body: await s.json() },
    { status: 422, body: { error: { code: 'query_too_long', message: /limit of 10;/ } } },
  );
});

// Issue 33 row 1: a 100,000-token prompt to the tiny model (context 40,960) was accepted and grew the
// server until the kernel killed it. Prompt + max_tokens over the context is a 400 with vLLM's words,
// before the batcher allocates anything (the stand-in model would fail if a request got that far).
t.test('a prompt and completion longer than the context are a 400 before anything is allocated', async (t) => {
  const base = await start(t);
  const post = async (path: string, body: unknown) => {
    const r = await fetch(`${base}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });
    return { status: r.status, body: (await r.json()) as { error: { message: string; param: string } } };
  };
  const ids = Array.from({ length: 100_000 }, (_, i) => 100 + (i % 1000));
  const long = await post('/completions', { prompt: ids, max_tokens: 16 });
  t.equal(long.status, 400, '100,000 prompt tokens: 400');
  t.match(long.body.error, {
    param: 'prompt',
    message:
      /^This model's maximum context length is 40960 tokens\. However, you requested 100016 tokens \(100000 in the prompt, 16 in the completion\)/,
  });
  const edge = await post('/completions', { prompt: ids.slice(0, 40_950), max_tokens: 11 });
  t.equal(edge.status, 400, 'one token over (40,950 + 11): 400');
  const chat = await post('/chat/completions', { messages: [{ role: 'user', content: 'word '.repeat(50_000) }], max_tokens: 8 });
  t.equal(chat.status, 400, 'a 50,000-word chat message: 400');
  t.match(chat.body.error, { param: 'messages', message: /in the messages/ });

  const small = await start(t, { maxModelLen: 64 });
  const over = await fetch(`${small}/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: ids.slice(0, 60), max_tokens: 5 }),
  });
  t.equal(over.status, 400, 'maxModelLen 64: 60 + 5 is a 400');
  t.match(((await over.json()) as { error: { message: string } }).error.message, /maximum context length is 64 tokens/);
});

t.test('serve --max-model-len is checked against the model', async (t) => {
  for (const v of ['1', '50000', '2.5']) {
    const r = runCli(['serve', '--model', dir, '--port', '0', '--max-model-len', v]);
    t.equal(r.code, 2, `--max-model-len ${v}: exit 2`);
    t.match(r.stderr, /ARGUMENT_INVALID.*--max-model-len must be an integer from 2 to the model's max_position_embeddings \(40960\)/);
  }
});
