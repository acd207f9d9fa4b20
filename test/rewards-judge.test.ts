// The LLM judge: reply parsing, the prompt it sends, the OpenAI-compatible backend against a real
// loopback HTTP server (parsing, retry after a 500, Retry-After on 429, no retry on 400, a timeout
// that becomes a recorded failure in bounded time, connection refused, unparseable replies, the
// concurrency limit) and the engine backend with a scripted TextGenerator and the real Qwen3
// tokenizer and chat template (batching, greedy request, decoding, truncation, generator errors).
import t, { type Test } from 'tap';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { GenerateRequest, GenerateResult, TextGenerator } from '../lib/engine/types.js';
import { ChatFormatter } from '../lib/model/chat.js';
import { packagedQwen3Config, qwen3Tokenizer } from '../lib/model/tokenizer.js';
import {
  combineGrades,
  engineJudgeBackend,
  judgeReward,
  judgeSystemPrompt,
  judgeUserMessage,
  openAIJudgeBackend,
  parseJudgeReply,
  renderTrajectory,
  type RewardContext,
} from '../lib/rewards/index.js';
import { Limiter } from '../lib/util/limiter.js';
import { backoffMs } from '../lib/util/http-retry.js';

const ctx: RewardContext = {
  question: 'Who designed the Sydney Opera House?',
  golds: ['Jørn Utzon', 'Jorn Utzon'],
  answer: 'Jørn Utzon',
  episode: {
    messages: [
      { role: 'system', content: 'SYSTEM PROMPT' },
      { role: 'user', content: 'Question: Who designed the Sydney Opera House?' },
      { role: 'assistant', content: '<python>print(search_pages("Sydney Opera House"))</python>' },
      { role: 'user', content: '<python_output>designed by the Danish architect Jørn Utzon</python_output>' },
      { role: 'assistant', content: '<answer>Jørn Utzon</answer>' },
    ],
  },
};

t.test('parseJudgeReply reads the last grades after any thinking', async (t) => {
  t.same(parseJudgeReply('Fine.\nCorrectness: 7\nApproach: 10'), { correctness: 0.7, approach: 1 });
  t.same(parseJudgeReply('<think>Correctness: 2 maybe</think>\n**Correctness:** 9/10\n**Approach**: 4'), { correctness: 0.9, approach: 0.4 });
  t.same(parseJudgeReply('Correctness: 2\nApproach: 1\nOn reflection:\nCorrectness: 8\nApproach: 5.5'), { correctness: 0.8, approach: 0.55 }, 'the last occurrence wins');
  t.same(parseJudgeReply('{"correctness": 6, "approach": 0}'), { correctness: 0.6, approach: 0 });
  t.same(parseJudgeReply('correctness = 10', false), { correctness: 1, approach: null });
  t.throws(() => parseJudgeReply('Correctness: 8'), { code: 'JUDGE_FAILED', message: /Approach: <0-10>/ });
  t.throws(() => parseJudgeReply('The answer is right.'), { code: 'JUDGE_FAILED', message: /Correctness: <0-10>.*The answer is right/ });
  t.throws(() => parseJudgeReply('Correctness: 11\nApproach: 3'), { code: 'JUDGE_FAILED', message: /from 0 to 10, but found 11/ });
  t.throws(() => parseJudgeReply('Correctness: -1\nApproach: 3'), { code: 'JUDGE_FAILED' });
});

t.test('combineGrades: 0.75 / 0.25, or sign times magnitude', async (t) => {
  t.equal(combineGrades({ correctness: 0.8, approach: 0.4 }), 0.75 * 0.8 + 0.25 * 0.4);
  t.ok(Math.abs(combineGrades({ correctness: 0.8, approach: 0.4 }, 'weighted', [0.5, 0.5]) - 0.6) < 1e-12);
  t.equal(combineGrades({ correctness: 0.8, approach: 0.4 }, 'sign_magnitude'), 0.4);
  t.equal(combineGrades({ correctness: 0.6, approach: 0.4 }, 'sign_magnitude'), -0.4, 'below the 0.7 threshold');
  t.equal(combineGrades({ correctness: 0.6, approach: 0.4 }, 'sign_magnitude', undefined, 0.5), 0.4);
  t.ok(Object.is(combineGrades({ correctness: 0, approach: 0 }, 'sign_magnitude'), 0), 'no -0 in the logs');
  t.equal(combineGrades({ correctness: 0.3, approach: null }), 0.3, 'without approach: correctness');
});

t.test('the judge prompt: rubric, question, golds, answer, trajectory without system and question', async (t) => {
  t.match(judgeSystemPrompt(), /Correctness: <0-10>\nApproach: <0-10>$/);
  t.notMatch(judgeSystemPrompt(false), /Approach/);
  const u = judgeUserMessage(ctx);
  t.match(u, /^Question: Who designed the Sydney Opera House\?/);
  t.match(u, /Reference answer\(s\):\n- Jørn Utzon\n- Jorn Utzon/);
  t.match(u, /Final answer: Jørn Utzon/);
  t.match(u, /\[assistant\]\n<python>print/);
  t.match(u, /\[user\]\n<python_output>designed by/);
  t.notMatch(u, /SYSTEM PROMPT/);
  t.notMatch(u, /\[user\]\nQuestion:/, 'the question message is not repeated');
  t.match(judgeUserMessage({ ...ctx, answer: null }), /Final answer: \(none: the assistant ended without an answer\)/);
  t.notMatch(judgeUserMessage(ctx, false), /Trajectory/);
  const long = renderTrajectory([{ role: 'assistant', content: 'A'.repeat(500) + 'B'.repeat(500) }], 200);
  t.ok(long.startsWith('[assistant]\nAAAA') && long.endsWith('BBBB'), 'head and tail kept');
  t.match(long, /\[\.\.\. \d+ characters left out \.\.\.\]/);
  t.ok(long.length < 300);
  t.equal(renderTrajectory(undefined), '(not available)');
});

t.test('helpers: backoff doubles up to its cap; the limiter holds the line', async (t) => {
  t.same([1, 2, 3, 4, 5].map((a) => backoffMs(a, 100, 1000)), [100, 200, 400, 800, 1000]);
  const lim = new Limiter(2);
  let active = 0;
  let peak = 0;
  const order: number[] = [];
  await Promise.all(
    [0, 1, 2, 3, 4].map((i) =>
      lim.run(async () => {
        peak = Math.max(peak, ++active);
        await new Promise((r) => setTimeout(r, 10));
        order.push(i);
        active--;
      }),
    ),
  );
  t.equal(peak, 2);
  t.equal(order.length, 5);
});

// ---------------------------------------------------------------------------------------------
// OpenAI-compatible backend against a loopback server

type Handler = (req: IncomingMessage, body: string, res: ServerResponse, n: number) => void;

/** A server on 127.0.0.1 (port 0) that runs `handler` per request and records the requests. */
async function loopback(t: Test, handler: Handler) {
  const requests: Array<{ url: string; headers: IncomingMessage['headers']; body: string; at: number }> = [];
  let active = 0;
  let peak = 0;
  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      requests.push({ url: req.url ?? '', headers: req.headers, body, at: Date.now() });
      peak = Math.max(peak, ++active);
      res.on('close', () => active--);
      handler(req, body, res, requests.length);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(
    () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  );
  const port = (server.address() as AddressInfo).port;
  return { baseUrl: `http://127.0.0.1:${port}/v1`, requests, peak: () => peak };
}

const completion = (content: unknown, finish = 'stop') => JSON.stringify({ id: 'x', object: 'chat.completion', choices: [{ index: 0, message: { role: 'assistant', content }, finish_reason: finish }] });
const send = (res: ServerResponse, status: number, body: string, headers: Record<string, string> = {}) => {
  res.writeHead(status, { 'content-type': 'application/json', ...headers });
  res.end(body);
};

t.test('http judge: the request, the parsed grades and the parts', async (t) => {
  const srv = await loopback(t, (_req, _body, res) => send(res, 200, completion('The answer names the architect.\nCorrectness: 10\nApproach: 5')));
  const backend = openAIJudgeBackend({ baseUrl: srv.baseUrl + '/', model: 'judge-7b', apiKeyEnv: 'JUDGE_KEY', env: { JUDGE_KEY: 'sk-test' }, maxTokens: 300, extraBody: { chat_template_kwargs: { enable_thinking: false } } });
  const r = await judgeReward({ backend })(ctx);
  t.same(r.parts, { judge_correctness: 1, judge_approach: 0.5, judge: 0.75 + 0.125, judge_error: 0, judge_skipped: 0 });
  t.equal(r.correct, true);
  t.equal(srv.requests.length, 1);
  const req = srv.requests[0];
  t.equal(req.url, '/v1/chat/completions', 'base URL with a trailing slash still gives one path');
  t.equal(req.headers.authorization, 'Bearer sk-test');
  const body = JSON.parse(req.body);
  t.equal(body.model, 'judge-7b');
  t.equal(body.temperature, 0);
  t.equal(body.max_tokens, 300);
  t.same(body.chat_template_kwargs, { enable_thinking: false });
  t.same(body.messages.map((m: { role: string }) => m.role), ['system', 'user']);
  t.match(body.messages[1].content, /Final answer: Jørn Utzon/);
});

t.test('http judge: a 500 is retried, then the reply counts', async (t) => {
  const srv = await loopback(t, (_req, _body, res, n) => (n === 1 ? send(res, 500, '{"error":"overloaded"}') : send(res, 200, completion('Correctness: 4\nApproach: 8'))));
  const backend = openAIJudgeBackend({ baseUrl: srv.baseUrl, model: 'm', retries: 2, backoffMs: 50 });
  const r = await judgeReward({ backend })(ctx);
  t.equal(srv.requests.length, 2);
  t.ok(srv.requests[1].at - srv.requests[0].at >= 45, 'waited the backoff before retrying');
  t.same(r.parts, { judge_correctness: 0.4, judge_approach: 0.8, judge: 0.75 * 0.4 + 0.25 * 0.8, judge_error: 0, judge_skipped: 0 });
  t.equal(r.correct, false);
  t.equal(r.errors, undefined);
});

t.test('http judge: a 429 waits Retry-After; a 400 is not retried', async (t) => {
  const srv = await loopback(t, (_req, _body, res, n) => (n === 1 ? send(res, 429, '{}', { 'retry-after': '0.2' }) : send(res, 200, completion('Correctness: 9\nApproach: 9'))));
  const backend = openAIJudgeBackend({ baseUrl: srv.baseUrl, model: 'm', retries: 1, backoffMs: 1 });
  const r = await judgeReward({ backend })(ctx);
  t.equal(r.parts.judge_correctness, 0.9);
  t.ok(srv.requests[1].at - srv.requests[0].at >= 180, `Retry-After honoured (${srv.requests[1].at - srv.requests[0].at} ms)`);

  const bad = await loopback(t, (_req, _body, res) => send(res, 400, '{"error":"unknown model m"}'));
  const r2 = await judgeReward({ backend: openAIJudgeBackend({ baseUrl: bad.baseUrl, model: 'm', retries: 3, backoffMs: 1 }) })(ctx);
  t.equal(bad.requests.length, 1, 'a client error is final');
  t.equal(r2.parts.judge_error, 1);
  t.equal(r2.parts.judge, null);
  t.match(r2.errors?.judge, /HTTP 400: \{"error":"unknown model m"\}/);
});

t.test('http judge: a server that never answers gives a recorded failure in bounded time', async (t) => {
  const srv = await loopback(t, () => {
    /* never answer */
  });
  const backend = openAIJudgeBackend({ baseUrl: srv.baseUrl, model: 'm', timeoutMs: 200, retries: 1, backoffMs: 20 });
  const t0 = Date.now();
  const r = await judgeReward({ backend })(ctx);
  const ms = Date.now() - t0;
  t.ok(ms >= 400 && ms < 2000, `two attempts of 200 ms plus a 20 ms backoff (took ${ms} ms)`);
  t.equal(srv.requests.length, 2, 'the timed-out attempt was retried once');
  t.same(r.parts, { judge_correctness: null, judge_approach: null, judge: null, judge_error: 1, judge_skipped: 0 });
  t.equal(r.correct, undefined, 'no verdict from a failed judge');
  t.match(r.errors?.judge, /attempt 1: no reply within 200 ms; attempt 2: no reply within 200 ms/);
  t.match(r.errors?.judge, /Raise timeout_s or retries/);
});

t.test('http judge: a body that stalls after the headers also times out', async (t) => {
  const srv = await loopback(t, (_req, _body, res) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.write('{"choices": [');
  });
  const r = await judgeReward({ backend: openAIJudgeBackend({ baseUrl: srv.baseUrl, model: 'm', timeoutMs: 150, retries: 0 }) })(ctx);
  t.equal(r.parts.judge_error, 1);
  t.match(r.errors?.judge, /did not finish within 150 ms/);
});

t.test('http judge: connection refused is retried, then recorded', async (t) => {
  const srv = await loopback(t, (_req, _body, res) => send(res, 200, '{}'));
  const closedUrl = srv.baseUrl.replace(/:\d+\//, ':1/'); // port 1: nothing listens there
  const r = await judgeReward({ backend: openAIJudgeBackend({ baseUrl: closedUrl, model: 'm', retries: 2, backoffMs: 1 }) })(ctx);
  t.equal(r.parts.judge_error, 1);
  t.match(r.errors?.judge, /attempt 3: request failed/);
});

t.test('http judge: unparseable replies are recorded failures', async (t) => {
  const replies = [completion('I think the answer is fine.'), completion(null), 'not json', completion('Correctness: 3', 'length')];
  const srv = await loopback(t, (_req, _body, res, n) => send(res, 200, replies[n - 1]));
  const judge = judgeReward({ backend: openAIJudgeBackend({ baseUrl: srv.baseUrl, model: 'm', retries: 3, backoffMs: 1 }) });
  const expected = [/Correctness: <0-10>.*I think the answer is fine/, /choices\[0\]\.message\.content as a string, but found content null/, /Expected a JSON body, but found "not json"/, /Approach: <0-10>.*cut at the token limit/];
  for (const re of expected) {
    const r = await judge(ctx);
    t.equal(r.parts.judge_error, 1);
    t.equal(r.parts.judge_correctness, null);
    t.match(r.errors?.judge, re);
  }
  t.equal(srv.requests.length, 4, 'a malformed reply is not retried');
});

t.test('http judge: concurrency limit and no request for a missing answer', async (t) => {
  const srv = await loopback(t, (_req, _body, res) => setTimeout(() => send(res, 200, completion('Correctness: 10\nApproach: 10')), 60));
  const judge = judgeReward({ backend: openAIJudgeBackend({ baseUrl: srv.baseUrl, model: 'm', concurrency: 2 }) });
  const rs = await Promise.all(Array.from({ length: 5 }, () => judge(ctx)));
  t.equal(srv.requests.length, 5);
  t.equal(srv.peak(), 2, 'never more than 2 requests in flight');
  t.ok(rs.every((r) => r.parts.judge === 1));
  const none = await judge({ ...ctx, answer: null });
  t.equal(srv.requests.length, 5, 'no request');
  t.same(none.parts, { judge_correctness: 0, judge_approach: 0, judge: 0, judge_error: 0, judge_skipped: 1 });
  t.equal(none.correct, false);
});

t.test('http judge: bad options are refused up front', async (t) => {
  t.throws(() => openAIJudgeBackend({ baseUrl: '127.0.0.1:8000', model: 'm' }), { code: 'ARGUMENT_INVALID', message: /http:\/\// });
  t.throws(() => openAIJudgeBackend({ baseUrl: 'http://x/v1', model: '' }), { code: 'ARGUMENT_INVALID' });
  t.throws(() => openAIJudgeBackend({ baseUrl: 'http://x/v1', model: 'm', concurrency: 0 }), { code: 'ARGUMENT_INVALID' });
  t.throws(() => openAIJudgeBackend({ baseUrl: 'http://x/v1', model: 'm', apiKeyEnv: 'NOPE', env: {} }), { code: 'CONFIG_INVALID', message: /NOPE/ });
  t.throws(() => judgeReward({ backend: undefined as never }), { code: 'ARGUMENT_INVALID' });
  t.throws(() => judgeReward({ backend: { description: 'x', complete: async () => ({ text: '' }) }, approach: false, combine: 'sign_magnitude' }), { code: 'ARGUMENT_INVALID' });
});

// ---------------------------------------------------------------------------------------------
// Engine backend with a scripted generator

const tok = qwen3Tokenizer();
const formatter = new ChatFormatter(packagedQwen3Config().chat_template as string, { eosToken: '<|im_end|>' });

/** A TextGenerator that answers every prompt with the token ids of a scripted reply. */
class ScriptedGenerator implements TextGenerator {
  requests: GenerateRequest[] = [];
  constructor(
    readonly reply: (prompt: string, i: number) => string,
    readonly finish: 'stop_token' | 'length' = 'stop_token',
  ) {}
  async generate(req: GenerateRequest): Promise<GenerateResult> {
    this.requests.push(req);
    const tokens = req.prompts.map((p, i) => Int32Array.from(tok.encode(this.reply(tok.decode(p), i))));
    return { tokens, logprobs: tokens.map((x) => new Float32Array(x.length)), finishReasons: tokens.map(() => this.finish) };
  }
}

t.test('engine judge: requests made together go in one greedy batch; replies decode and parse', async (t) => {
  const gen = new ScriptedGenerator((prompt) => (prompt.includes('Final answer: Jørn Utzon') ? 'Correctness: 9\nApproach: 3<|im_end|>' : 'Correctness: 1\nApproach: 2<|im_end|>'));
  const judge = judgeReward({ backend: engineJudgeBackend({ generator: gen, tokenizer: tok, formatter, maxNewTokens: 64, enableThinking: false }) });
  const [a, b, c] = await Promise.all([judge(ctx), judge({ ...ctx, answer: 'Frank Gehry' }), judge(ctx)]);
  t.equal(gen.requests.length, 1, 'one generate call');
  const req = gen.requests[0];
  t.equal(req.prompts.length, 3);
  t.equal(req.greedy, true);
  t.equal(req.temperature, 0);
  t.equal(req.maxNewTokens, 64);
  t.same(req.stopTokenIds, tok.stopTokenIds);
  const prompt = tok.decode(req.prompts[0]);
  t.match(prompt, /^<\|im_start\|>system\nYou grade the work/);
  t.ok(prompt.endsWith('<|im_start|>assistant\n<think>\n\n</think>\n\n'), 'generation prompt with thinking off');
  t.same(a.parts, { judge_correctness: 0.9, judge_approach: 0.3, judge: 0.75 * 0.9 + 0.25 * 0.3, judge_error: 0, judge_skipped: 0 });
  t.same(b.parts.judge_correctness, 0.1);
  t.equal(b.correct, false);
  t.same(c.parts, a.parts);
});

t.test('engine judge: batch size splits calls; truncation and generator errors are recorded', async (t) => {
  const gen = new ScriptedGenerator(() => 'Correctness: 5\nApproach: 5');
  const judge = judgeReward({ backend: engineJudgeBackend({ generator: gen, tokenizer: tok, formatter, batchSize: 2 }) });
  await Promise.all([judge(ctx), judge(ctx), judge(ctx)]);
  t.same(gen.requests.map((r) => r.prompts.length), [2, 1]);

  const cut = judgeReward({ backend: engineJudgeBackend({ generator: new ScriptedGenerator(() => 'Let me think about the correct', 'length'), tokenizer: tok, formatter }) });
  const r = await cut(ctx);
  t.equal(r.parts.judge_error, 1);
  t.match(r.errors?.judge, /^engine judge: .*cut at the token limit/);

  const failing: TextGenerator = {
    generate: async () => {
      throw new Error('CUDA out of memory');
    },
  };
  const broken = judgeReward({ backend: engineJudgeBackend({ generator: failing, tokenizer: tok, formatter, description: 'judge Qwen3-8B' }) });
  const rs = await Promise.all([broken(ctx), broken(ctx)]);
  for (const x of rs) {
    t.equal(x.parts.judge, null);
    t.match(x.errors?.judge, /judge Qwen3-8B failed to generate: CUDA out of memory/);
  }
});
