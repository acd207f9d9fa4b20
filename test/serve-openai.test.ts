// `slm-train serve` as clients use it (issue 21, item 1), through the official `openai` npm client over
// loopback, on a tiny model with an SFT-like adapter loaded at run time:
// - SSE streaming (chat and completions): a role delta, content deltas sent while the call still runs,
//   one finish_reason per choice, stream_options.include_usage, [DONE]; the streamed text equals the
//   non-streamed text for the same seed (and the engine's own decode), base model and adapter alike;
// - stop strings that span several tokens never reach the stream in part, and text held back for a
//   stop string that never completes is sent;
// - n > 1: sampled choices of one batched call, choice 0 = the n = 1 reply for the same seed;
// - logprobs / top_logprobs (chat) and logprobs: N (completions) equal the engine's log-probs, and
//   the top alternatives equal log_softmax of the model's logits;
// - an unknown model is a 404 listing the served ids; unsupported parameters are 400s naming them;
// - a client that disconnects (streaming or not) cancels its row: the generate call ends early.
import { join } from 'node:path';
import OpenAI from 'openai';
import t from 'tap';
import { Model } from '../lib/engine/model.js';
import { ChatFormatter } from '../lib/model/chat.js';
import { initModel } from '../lib/model/init.js';
import { loadTokenizer } from '../lib/model/tokenizer.js';
import { OpenAIServer } from '../lib/serve/server.js';
import { failure } from './helpers/failure.js';

const root = t.testdir();
const dir = join(root, 'model');
initModel({ preset: 'tiny', out: dir, seed: 6, embedStd: 0.3 });
const lora = { r: 4, alpha: 8, dropout: 0, rslora: false, targets: ['q_proj', 'v_proj', 'down_proj'] };

// Parameters outside the client's types (vLLM's extras) go in the body as they are.
const extra = <T>(body: T & Record<string, unknown>) => body as T;

t.test('the openai client against slm-train serve', async (t) => {
  const model = await Model.load(dir);
  const tok = loadTokenizer(dir);
  model.setVocab(tok.tokenBytes());
  const formatter = ChatFormatter.forModel(dir);
  const server = new OpenAIServer({ model, tokenizer: tok, formatter, name: 'tiny', port: 0, maxBatch: 8 });
  const port = await server.listen();
  t.teardown(async () => {
    await server.close();
    model.dispose();
  });
  // An SFT-like adapter (lora_B far from 0, so it changes the replies), loaded at run time.
  const trainer = await Model.load(dir);
  trainer.attachLora(lora as never, 3);
  for (const [k, v] of Object.entries(trainer.trainable()))
    if (k.includes('lora_B'))
      trainer.setTrainable(
        k,
        v.map((_, i) => 4 * Math.sin(i + k.length)),
      );
  const adapterDir = join(root, 'sft');
  await trainer.saveAdapter(adapterDir);
  trainer.dispose();
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120_000 });
  const messages = (content: string) => [{ role: 'user' as const, content }];
  const promptIds = (content: string) => Int32Array.from(tok.encode(formatter.prompt(messages(content))));
  /** What the engine itself generates for a chat prompt (one row, the request's seed). */
  const engine = (content: string, o: { maxTokens: number; temperature: number; seed?: number; topK?: number; stops?: boolean }) =>
    model.generate({
      prompts: [promptIds(content)],
      maxNewTokens: o.maxTokens,
      temperature: o.temperature,
      ...(o.seed !== undefined ? { rowSeeds: [o.seed] } : {}),
      topK: o.topK,
      stopTokenIds: o.stops === false ? [] : tok.stopTokenIds,
    });
  const textOf = (ids: ArrayLike<number>) => {
    const a = Array.from(ids);
    return tok.decode(a.length && tok.stopTokenIds.includes(a[a.length - 1]) ? a.slice(0, -1) : a, { skipSpecialTokens: true });
  };
  const until = async (cond: () => boolean) => {
    for (let i = 0; i < 600 && !cond(); i++) await new Promise((r) => setTimeout(r, 50));
  };
  // A reply goes out when its row finishes, a moment before its call is recorded: wait for that.
  const settled = () => until(() => server.calls.count === server.batches.count);
  async function collect<T>(stream: AsyncIterable<T>): Promise<T[]> {
    const out: T[] = [];
    for await (const c of stream) out.push(c);
    return out;
  }

  await t.test('models, and a 404 with the served ids for an unknown model', async (t) => {
    // Before the adapter is loaded: the engine's own decode of the same seed (the server's model is the base).
    const want = await engine('Tell me about rivers.', { maxTokens: 30, temperature: 0.9, seed: 5 });
    const r = await client.chat.completions.create({
      model: 'tiny',
      messages: messages('Tell me about rivers.'),
      max_tokens: 30,
      temperature: 0.9,
      seed: 5,
    });
    t.equal(r.choices[0].message.content, textOf(want.tokens[0]), 'a seeded chat reply = the engine decode with that seed');

    const load = await fetch(`http://127.0.0.1:${port}/v1/load_lora_adapter`, {
      method: 'POST',
      body: JSON.stringify({ lora_name: 'sft', lora_path: adapterDir }),
    });
    t.equal(load.status, 200);
    t.same(
      (await client.models.list()).data.map((m) => m.id),
      ['tiny', 'sft'],
    );
    const e = await failure(client.chat.completions.create({ model: 'gpt-4o', messages: messages('hi'), max_tokens: 2 }));
    t.ok(e instanceof OpenAI.NotFoundError, `404 NotFoundError (${e.constructor.name})`);
    t.equal(e.status, 404);
    t.match(e.message, /The model `gpt-4o` does not exist\. This server serves: tiny, sft\./);
    t.equal(e.code, 'model_not_found');
    t.equal(e.param, 'model');
    const ec = await failure(client.completions.create({ model: 'sft-old', prompt: 'x', max_tokens: 2 }));
    t.equal(ec.status, 404, 'completions too');
  });

  await t.test('chat streaming = non-streaming for the same seed (base model and adapter)', async (t) => {
    const texts: string[] = [];
    for (const name of ['tiny', 'sft']) {
      const body = { model: name, messages: messages('Tell me about rivers.'), max_tokens: 40, temperature: 0.9, seed: 5 };
      const whole = await client.chat.completions.create(body);
      const chunks = await collect(
        await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } }),
      );
      t.same(chunks[0].choices[0].delta, { role: 'assistant', content: '' }, 'the first chunk is the role delta');
      const text = chunks.map((c) => c.choices[0]?.delta.content ?? '').join('');
      t.equal(text, whole.choices[0].message.content, `${name}: streamed text = non-streamed text`);
      t.ok(text.length > 0);
      t.ok(
        chunks.filter((c) => c.choices[0]?.delta.content).length >= 10,
        `${name}: the text came in many deltas (${chunks.length} chunks)`,
      );
      t.same(
        chunks.flatMap((c) => c.choices.filter((x) => x.finish_reason).map((x) => x.finish_reason)),
        [whole.choices[0].finish_reason],
        'one finish_reason',
      );
      const last = chunks[chunks.length - 1];
      t.same(last.choices, [], 'include_usage: a last chunk with no choices');
      t.same(last.usage, whole.usage, 'and the usage of the non-streamed reply');
      t.ok(
        chunks.slice(0, -1).every((c) => c.usage === null),
        'usage: null on the other chunks',
      );
      t.ok(chunks.every((c) => c.object === 'chat.completion.chunk' && c.model === name && c.id === chunks[0].id));
      texts.push(text);
    }
    t.not(texts[0], texts[1], 'the adapter changes the reply');
  });

  await t.test('tokens are streamed while the generate call runs', async (t) => {
    await settled();
    const before = server.calls.count;
    let during = -1;
    const stream = await client.chat.completions.create(
      extra({ model: 'tiny', messages: messages('Go on.'), max_tokens: 400, temperature: 0, stream: true as const, ignore_eos: true }),
    );
    let text = '';
    for await (const c of stream) {
      const d = c.choices[0]?.delta.content;
      if (d && during < 0) during = server.calls.count - before;
      text += d ?? '';
    }
    t.equal(during, 0, 'the first content delta arrived before the call ended');
    // The call is recorded when the native call returns, which may come after the stream's last chunk.
    await settled();
    t.equal(server.calls.count - before, 1);
    t.equal(server.calls.last?.steps, 400, 'ignore_eos: all 400 tokens');
    t.ok(text.length > 100);
  });

  await t.test('stop strings: never streamed in part; held-back text that is no stop is sent', async (t) => {
    const base = extra({
      model: 'tiny',
      messages: messages('Count the towns.'),
      max_tokens: 40,
      temperature: 0,
      ignore_eos: true,
      logprobs: true,
      return_tokens_as_token_ids: true,
    });
    const full = await client.chat.completions.create(base);
    const text = full.choices[0].message.content!;
    const ids = full.choices[0].logprobs!.content!.map((c) => Number(c.token.slice(9)));
    // A stop string made of three whole tokens from the middle (the first of them non-empty), so that
    // without a holdback the first of its tokens would be sent before the stop string completes.
    let stop = '';
    for (let k = 12; k < ids.length - 3 && !stop; k++) {
      const a = tok.decode(ids.slice(0, k), { skipSpecialTokens: true });
      const b = tok.decode(ids.slice(0, k + 1), { skipSpecialTokens: true });
      const c = tok.decode(ids.slice(0, k + 3), { skipSpecialTokens: true });
      const s = c.slice(a.length);
      if (c.startsWith(b) && b.startsWith(a) && b.length > a.length && c.length > b.length + 1 && !s.includes('\uFFFD')) stop = s;
    }
    t.ok(stop.length > 1, `a stop string spanning three tokens: ${JSON.stringify(stop)}`);
    const at = text.indexOf(stop);
    t.ok(at >= 0);
    for (const keep of [false, true]) {
      const body = { ...base, logprobs: false, stop: [stop], ...(keep ? { include_stop_str_in_output: true } : {}) };
      const want = keep ? text.slice(0, at + stop.length) : text.slice(0, at);
      const whole = await client.chat.completions.create(body);
      t.equal(whole.choices[0].message.content, want, `non-streamed: cut at the stop string${keep ? ', kept' : ''}`);
      t.equal(whole.choices[0].finish_reason, 'stop');
      const chunks = await collect(await client.chat.completions.create({ ...body, stream: true }));
      const pieces = chunks.map((c) => c.choices[0]?.delta.content ?? '');
      t.equal(pieces.join(''), want, `streamed: the same text, no part of the stop string leaked${keep ? ' (kept)' : ''}`);
      t.equal(chunks[chunks.length - 1].choices[0].finish_reason, 'stop');
    }
    // A stop string whose beginning occurs but never completes: the held-back text is sent after all.
    const never = stop + '\u0007never';
    const chunks = await collect(await client.chat.completions.create({ ...base, logprobs: false, stop: never, stream: true }));
    t.equal(chunks.map((c) => c.choices[0]?.delta.content ?? '').join(''), text, 'a stop string that never completes cuts nothing');
    t.equal(chunks[chunks.length - 1].choices[0].finish_reason, 'length');
  });

  await t.test('n > 1: sampled choices of one batched call, seeded per choice', async (t) => {
    const body = extra({
      model: 'tiny',
      messages: messages('Name a fair.'),
      max_tokens: 16,
      temperature: 1,
      seed: 11,
      n: 3,
      ignore_eos: true,
    });
    const calls = server.batches.count;
    const three = await client.chat.completions.create(body);
    t.same(server.batches.since(calls), [3], 'the three choices were submitted together, three rows');
    t.same(
      three.choices.map((c) => c.index),
      [0, 1, 2],
    );
    const texts = three.choices.map((c) => c.message.content);
    t.equal(new Set(texts).size, 3, 'three different samples');
    const one = await client.chat.completions.create({ ...body, n: 1 });
    t.equal(one.choices[0].message.content, texts[0], 'choice 0 = the n = 1 reply with the same seed');
    const again = await client.chat.completions.create(body);
    t.same(
      again.choices.map((c) => c.message.content),
      texts,
      'the same seed gives the same choices',
    );
    t.equal(three.usage!.completion_tokens, 3 * one.usage!.completion_tokens, 'usage counts every choice (16 tokens each)');
    t.equal(three.usage!.prompt_tokens, one.usage!.prompt_tokens, 'the prompt counted once');
    const chunks = await collect(await client.chat.completions.create({ ...body, stream: true }));
    for (let i = 0; i < 3; i++) {
      const mine = chunks.flatMap((c) => c.choices.filter((x) => x.index === i));
      t.same(mine[0].delta, { role: 'assistant', content: '' });
      t.equal(mine.map((x) => x.delta.content ?? '').join(''), texts[i], `streamed choice ${i} = non-streamed choice ${i}`);
      t.equal(mine.filter((x) => x.finish_reason).length, 1);
    }
    // (A raw prompt makes this tiny model repeat its last token; the chat template's text does not.)
    const c2 = await client.completions.create(
      extra({
        model: 'tiny',
        prompt: formatter.prompt(messages('Name a fair.')),
        max_tokens: 16,
        temperature: 1,
        seed: 4,
        n: 2,
        ignore_eos: true,
      }),
    );
    t.same(
      c2.choices.map((c) => c.index),
      [0, 1],
    );
    t.not(c2.choices[0].text, c2.choices[1].text);
  });

  await t.test("log-probs equal the engine's", async (t) => {
    // The server's model is the base model here (the last requests named 'tiny', which detaches the adapter).
    const q = 'Which river?';
    // Greedy: the engine's tokens and log-probs; the top alternatives from the model's logits.
    const g = await engine(q, { maxTokens: 10, temperature: 0 });
    const r = await client.chat.completions.create({
      model: 'tiny',
      messages: messages(q),
      max_tokens: 10,
      temperature: 0,
      logprobs: true,
      top_logprobs: 2,
    });
    const content = r.choices[0].logprobs!.content!;
    const ids = Array.from(g.tokens[0]);
    t.same(
      content.map((c) => c.logprob),
      Array.from(g.logprobs[0]),
      "logprob = the engine's, token by token",
    );
    t.same(
      content.map((c) => c.token),
      ids.map((id) => tok.decode([id])),
    );
    t.same(content[0].bytes, Array.from(tok.tokenBytes()[ids[0]]));
    for (const c of content) {
      t.equal(c.top_logprobs.length, 2);
      t.equal(c.top_logprobs[0].logprob, c.logprob, 'greedy: the best alternative is the token itself');
      t.ok(c.top_logprobs[0].logprob >= c.top_logprobs[1].logprob);
    }
    const ctx = [...promptIds(q)];
    const { data, vocab } = await model.logits([ctx]);
    const last = Array.from(data.subarray((ctx.length - 1) * vocab, ctx.length * vocab));
    const max = last.reduce((a, x) => Math.max(a, x), -Infinity);
    const lse = max + Math.log(last.reduce((a, x) => a + Math.exp(x - max), 0));
    const order = last.map((_, i) => i).sort((a, b) => last[b] - last[a]);
    t.equal(content[0].top_logprobs[1].token, tok.decode([order[1]]), 'the second alternative is the second most likely token');
    t.ok(Math.abs(content[0].top_logprobs[1].logprob - (last[order[1]] - lse)) < 1e-4, 'with its log-prob from the logits');

    // Sampled: the log-probs under the request's temperature, equal to the engine's with the same seed.
    const s = await engine(q, { maxTokens: 12, temperature: 0.7, seed: 3 });
    const rs = await client.chat.completions.create({
      model: 'tiny',
      messages: messages(q),
      max_tokens: 12,
      temperature: 0.7,
      seed: 3,
      logprobs: true,
    });
    t.same(
      rs.choices[0].logprobs!.content!.map((c) => c.logprob),
      Array.from(s.logprobs[0]),
    );
    t.same(
      rs.choices[0].logprobs!.content!.map((c) => c.top_logprobs),
      rs.choices[0].logprobs!.content!.map(() => []),
      'no top_logprobs asked: empty lists',
    );
    // Streamed: the chunks' log-probs add up to the non-streamed ones.
    const body = { model: 'tiny', messages: messages(q), max_tokens: 12, temperature: 0.7, seed: 3, logprobs: true, top_logprobs: 3 };
    const whole = await client.chat.completions.create(body);
    const chunks = await collect(await client.chat.completions.create({ ...body, stream: true }));
    t.same(
      chunks.flatMap((c) => c.choices[0]?.logprobs?.content ?? []),
      whole.choices[0].logprobs!.content,
      'streamed log-probs = non-streamed',
    );

    // Completions: logprobs: N with token ids, as the rollout client reads them.
    const prompt = [5, 9, 33, 2];
    const gc = await model.generate({ prompts: [Int32Array.from(prompt)], maxNewTokens: 8, greedy: true, stopTokenIds: tok.stopTokenIds });
    const cr = await client.completions.create(
      extra({ model: 'tiny', prompt, max_tokens: 8, temperature: 0, logprobs: 3, return_tokens_as_token_ids: true }),
    );
    const lp = cr.choices[0].logprobs!;
    t.same(
      lp.tokens,
      Array.from(gc.tokens[0], (id) => `token_id:${id}`),
    );
    t.same(lp.token_logprobs, Array.from(gc.logprobs[0]));
    t.equal(lp.top_logprobs!.length, gc.tokens[0].length);
    t.ok(
      lp.top_logprobs!.every((d, k) => Object.keys(d).length === 3 && d[`token_id:${gc.tokens[0][k]}`] === gc.logprobs[0][k]),
      'three alternatives, the greedy token among them',
    );
    t.same(lp.text_offset!.slice(0, 2), [0, tok.decode([gc.tokens[0][0]]).length]);
    const streamed = await collect(
      await client.completions.create(
        extra({
          model: 'tiny',
          prompt,
          max_tokens: 8,
          temperature: 0,
          logprobs: 3,
          return_tokens_as_token_ids: true,
          stream: true as const,
        }),
      ),
    );
    t.same(
      streamed.flatMap((c) => c.choices[0]?.logprobs?.tokens ?? []),
      lp.tokens,
    );
    t.same(
      streamed.flatMap((c) => c.choices[0]?.logprobs?.text_offset ?? []),
      lp.text_offset,
    );
    t.equal(streamed.map((c) => c.choices[0]?.text ?? '').join(''), cr.choices[0].text);
  });

  await t.test('completions streaming, and concurrent streams share a call', async (t) => {
    const body = { model: 'sft', prompt: formatter.prompt(messages('The river')), max_tokens: 20, temperature: 0.8, seed: 9 };
    const whole = await client.completions.create(body);
    const chunks = await collect(await client.completions.create({ ...body, stream: true, stream_options: { include_usage: true } }));
    t.equal(chunks.map((c) => c.choices[0]?.text ?? '').join(''), whole.choices[0].text);
    t.same(chunks[chunks.length - 1].usage, whole.usage);
    t.ok(chunks.every((c) => c.object === 'text_completion'));

    const qs = ['Say a', 'Say bb', 'Say ccc ccc'];
    const alone = [];
    for (const q of qs)
      alone.push(
        (await client.chat.completions.create({ model: 'tiny', messages: messages(q), max_tokens: 12, temperature: 0 })).choices[0].message
          .content,
      );
    await server.idle();
    const s0 = server.sessions.count;
    const together = await Promise.all(
      qs.map(async (q) =>
        (
          await collect(
            await client.chat.completions.create({ model: 'tiny', messages: messages(q), max_tokens: 12, temperature: 0, stream: true }),
          )
        )
          .map((c) => c.choices[0]?.delta.content ?? '')
          .join(''),
      ),
    );
    await server.idle();
    const most = server.sessions.since(s0).map((x) => x.maxBatch);
    t.ok(Math.max(...most) > 1, `3 streams decoded together (most rows in a decode step, per session: ${most.join(', ')})`);
    t.same(together, alone, 'each stream = its reply alone');
  });

  await t.test('unsupported parameters are 400s that name them', async (t) => {
    const chat = { model: 'tiny', messages: messages('x'), max_tokens: 2 };
    const bad: Array<[Record<string, unknown>, string, RegExp]> = [
      [{ presence_penalty: 0.5 }, 'presence_penalty', /presence_penalty is not supported: this server accepts it only as 0/],
      [{ frequency_penalty: 1 }, 'frequency_penalty', /frequency_penalty/],
      [{ logit_bias: { '5': 10 } }, 'logit_bias', /logit_bias/],
      [
        { tools: [{ type: 'function', function: { name: 'f', parameters: {} } }], tool_choice: 'required' },
        'tool_choice',
        /tool_choice "required" is not supported/,
      ],
      [{ response_format: { type: 'json_object' } }, 'response_format', /response_format/],
      [{ foo: 1 }, 'foo', /Unrecognized request argument supplied: foo/],
      [{ top_logprobs: 2 }, 'top_logprobs', /top_logprobs needs logprobs: true/],
      [{ stream_options: { include_usage: true } }, 'stream_options', /stream_options needs stream: true/],
      [{ n: 9 }, 'n', /n must be an integer from 1 to 8/],
      [{ logprobs: true, top_logprobs: 21 }, 'top_logprobs', /top_logprobs must be an integer from 0 to 20/],
      [{ top_p: 0 }, 'top_p', /top_p must be a number from 0 \(excluded\) to 1/],
    ];
    for (const [params, name, re] of bad) {
      const e = await failure(client.chat.completions.create({ ...chat, ...params } as never));
      t.equal(e.status, 400, `${name}: 400`);
      t.equal(e.param, name);
      t.match(e.message, re);
    }
    for (const [params, name] of [
      [{ echo: true }, 'echo'],
      [{ suffix: 'end' }, 'suffix'],
      [{ best_of: 3 }, 'best_of'],
      [{ logprobs: 21 }, 'logprobs'],
      [{ max_completion_tokens: 3 }, 'max_completion_tokens'],
    ] as const) {
      const e = await failure(client.completions.create({ model: 'tiny', prompt: 'x', max_tokens: 2, ...params } as never));
      t.equal(e.status, 400, `completions ${name}: 400`);
      t.match(e.message, new RegExp(name));
    }
    // At their defaults they are accepted (and change nothing).
    const ok = await client.chat.completions.create({
      ...chat,
      temperature: 0,
      presence_penalty: 0,
      frequency_penalty: 0,
      logit_bias: {},
      user: 'u1',
      response_format: { type: 'text' },
      n: 1,
    });
    const plain = await client.chat.completions.create({ ...chat, temperature: 0 });
    t.equal(ok.choices[0].message.content, plain.choices[0].message.content);
  });

  await t.test('a client that disconnects frees its row', async (t) => {
    const long = extra({ model: 'tiny', messages: messages('Keep going.'), max_tokens: 3000, temperature: 0, ignore_eos: true });
    await settled();
    const before = server.calls.count;
    const stream = await client.chat.completions.create({ ...long, stream: true as const });
    let n = 0;
    for await (const c of stream) if (c.choices[0]?.delta.content && ++n === 3) break; // breaking aborts the request
    await until(() => server.calls.count > before);
    const call = server.calls.since(before)[0];
    t.same(call?.finish, ['cancelled'], 'the streamed row was cancelled');
    t.ok(call && call.steps < 1500, `the call ended after ${call?.steps} of 3000 steps`);

    // Not streaming: the client gives up before the reply.
    const ac = new AbortController();
    await settled();
    const before2 = server.calls.count;
    const p = client.chat.completions.create(long, { signal: ac.signal });
    setTimeout(() => ac.abort(), 300);
    await t.rejects(p);
    await until(() => server.calls.count > before2);
    const call2 = server.calls.since(before2)[0];
    t.same(call2?.finish, ['cancelled']);
    t.ok(call2.steps < 1500, `the call ended after ${call2.steps} of 3000 steps`);

    // The server goes on serving.
    const r = await client.chat.completions.create({ model: 'tiny', messages: messages('Still there?'), max_tokens: 4, temperature: 0 });
    t.equal(r.choices.length, 1);
  });
});
