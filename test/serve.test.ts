// `slm-train serve` (issue 6, item 5): the OpenAI-compatible server over a real loopback connection.
// Greedy replies equal the engine's own greedy decode of the chat-template prompt; concurrent
// requests share batched generate calls without changing anyone's reply; the judge's OpenAI backend
// talks to it; bad requests get 4xx with a message; a port in use is PORT_IN_USE.
import { join } from 'node:path';
import t from 'tap';
import { Model } from '../lib/engine/model.js';
import { ChatFormatter } from '../lib/model/chat.js';
import { initModel } from '../lib/model/init.js';
import { loadTokenizer } from '../lib/model/tokenizer.js';
import { openAIJudgeBackend } from '../lib/rewards/judge-backends.js';
import { History } from '../lib/serve/history.js';
import { OpenAIServer } from '../lib/serve/server.js';
import { runCliAsync } from './helpers/cli.js';

const dir = join(t.testdir(), 'model');
initModel({ preset: 'tiny', out: dir, seed: 6, embedStd: 0.3 });

t.test('chat and text completions, batching, the judge backend, errors', async (t) => {
  const model = await Model.load(dir);
  const tok = loadTokenizer(dir);
  model.setVocab(tok.tokenBytes());
  const formatter = ChatFormatter.forModel(dir);
  const server = new OpenAIServer({ model, tokenizer: tok, formatter, name: 'tiny', port: 0 });
  const port = await server.listen();
  t.teardown(async () => {
    await server.close();
    model.dispose();
  });
  const base = `http://127.0.0.1:${port}/v1`;
  const post = async (path: string, body: unknown) => {
    const r = await fetch(`${base}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });
    return { status: r.status, body: (await r.json()) as Record<string, any> };
  };
  const solo = async (content: string, n: number) => {
    const ids = tok.encode(formatter.prompt([{ role: 'user', content }]));
    const g = await model.generate({ prompts: [Int32Array.from(ids)], maxNewTokens: n, greedy: true, stopTokenIds: tok.stopTokenIds });
    const out = Array.from(g.tokens[0]);
    const stopped = out.length && tok.stopTokenIds.includes(out[out.length - 1]);
    return {
      text: tok.decode(stopped ? out.slice(0, -1) : out, { skipSpecialTokens: true }),
      promptTokens: ids.length,
      tokens: out.length,
    };
  };

  const models = await (await fetch(`${base}/models`)).json();
  t.match(models, { object: 'list', data: [{ id: 'tiny' }] });

  const r = await post('/chat/completions', {
    model: 'tiny',
    messages: [{ role: 'user', content: 'Name a river.' }],
    max_tokens: 12,
    temperature: 0,
  });
  t.equal(r.status, 200);
  const want = await solo('Name a river.', 12);
  t.equal(r.body.choices[0].message.content, want.text, 'greedy reply = the engine greedy decode of the templated prompt');
  t.match(r.body, {
    object: 'chat.completion',
    model: 'tiny',
    usage: { prompt_tokens: want.promptTokens, completion_tokens: want.tokens },
  });
  t.ok(['stop', 'length'].includes(r.body.choices[0].finish_reason));

  // Six at once: they decode together (continuous batching) and each gets its own greedy reply.
  const qs = ['a', 'bb', 'ccc ccc', 'dddd', 'eeeee eeee', 'f'].map((x) => `Say ${x}`);
  await server.idle();
  const s0 = server.sessions.count;
  const all = await Promise.all(
    qs.map((q) => post('/chat/completions', { messages: [{ role: 'user', content: q }], max_tokens: 8, temperature: 0 })),
  );
  await server.idle();
  const most = server.sessions.since(s0).map((x) => x.maxBatch);
  t.ok(Math.max(...most) > 1, `6 requests decoded together (most rows in a decode step, per session: ${most.join(', ')})`);
  for (let i = 0; i < qs.length; i++)
    t.equal(all[i].body.choices[0].message.content, (await solo(qs[i], 8)).text, `batched reply ${i} = its solo reply`);

  // Sampled requests with a seed: batched or alone, a request gets the same reply (its own stream, as
  // vLLM's per-request seed). top_k 4: over this random model's flat 151k-token distribution, float
  // rounding that differs between a padded batch and a lone row could move a full-vocabulary sample.
  const sampled = (q: string) => ({
    messages: [{ role: 'user', content: q }],
    max_tokens: 8,
    temperature: 1,
    top_k: 4,
    seed: 1000 + q.length,
  });
  const s1 = server.sessions.count;
  const together = await Promise.all(qs.map((q) => post('/chat/completions', sampled(q))));
  await server.idle();
  t.ok(
    server.sessions.since(s1).some((x) => x.maxBatch > 1),
    'the sampled requests decoded together',
  );
  for (let i = 0; i < qs.length; i++)
    t.equal(
      together[i].body.choices[0].message.content,
      (await post('/chat/completions', sampled(qs[i]))).body.choices[0].message.content,
      `sampled reply ${i} batched = alone`,
    );

  const c = await post('/completions', { prompt: [1, 2, 3, 4], max_tokens: 5, temperature: 0 });
  t.equal(c.status, 200);
  t.match(c.body, { object: 'text_completion', choices: [{ text: String }], usage: { prompt_tokens: 4 } });
  t.ok(c.body.usage.completion_tokens <= 5);

  // The judge's backend over the same loopback connection.
  const judge = openAIJudgeBackend({ baseUrl: base, model: 'tiny', maxTokens: 6, retries: 0 });
  const reply = await judge.complete([{ role: 'user', content: 'Grade this.' }]);
  t.equal(reply.text, (await solo('Grade this.', 6)).text);

  for (const [body, re] of [
    [{ messages: [] }, /messages must be a non-empty list/],
    [{ messages: [{ role: 'user', content: 'x' }], presence_penalty: 1 }, /presence_penalty is not supported/],
    [{ messages: [{ role: 'user', content: 'x' }], max_tokens: -1 }, /max_tokens must be an integer from 1/],
    [{ messages: [{ role: 'user', content: 'x' }], temperature: 'hot' }, /temperature must be a number/],
  ] as const) {
    const e = await post('/chat/completions', body);
    t.equal(e.status, 400);
    t.match(e.body.error.message, re);
  }
  const bad = await post('/completions', { prompt: [999999999] });
  t.match(bad, { status: 400, body: { error: { message: /outside the vocabulary/ } } });
  const notFound = await fetch(`${base}/nope`, { method: 'POST', body: '{}' });
  t.equal(notFound.status, 404);
  const junk = await fetch(`${base}/chat/completions`, { method: 'POST', body: '{' });
  t.equal(junk.status, 400);

  const other = new OpenAIServer({ model, tokenizer: tok, formatter, name: 'tiny', port });
  await t.rejects(other.listen(), { code: 'PORT_IN_USE', message: /port \d+ is already in use/ });
});

t.test('slm-train serve: a port in use is a clear CLI error', async (t) => {
  const blocker = new (await import('node:http')).Server();
  await new Promise<void>((r) => blocker.listen(0, '127.0.0.1', () => r()));
  t.teardown(() => new Promise<void>((r) => blocker.close(() => r())));
  const port = (blocker.address() as { port: number }).port;
  const r = await runCliAsync(['serve', '--model', dir, '--port', String(port)], { timeout: 60_000 });
  t.equal(r.code, 2);
  t.match(r.stderr, /error PORT_IN_USE: port \d+ is already in use; pick another with --port N/);
});

t.test("the server's call history is bounded: the recent entries and the count of all", async (t) => {
  const h = new History<number>(4);
  for (let i = 0; i < 1000; i++) h.push(i);
  t.equal(h.count, 1000, 'every push counted');
  t.equal(h.last, 999);
  const kept = h.since(0);
  t.ok(kept.length >= 4 && kept.length < 8, `at most 2 x keep retained (${kept.length})`);
  t.same(
    kept,
    Array.from({ length: kept.length }, (_, i) => 1000 - kept.length + i),
    'the newest, in order',
  );
  t.same(h.since(997), [997, 998, 999], 'the entries after the first n');
  t.same(h.since(1000), []);
  t.throws(() => new History(0), RangeError);
});
