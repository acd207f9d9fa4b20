// The LLM judge: reply parsing (binary JSON, the default, and graded 0-10), the scoring of both
// formats against hand-computed values of the reference project's formula, the match and no-answer
// shortcuts (no request made), the prompt it sends, the OpenAI-compatible backend against a real
// loopback HTTP server (parsing, retry after a 500, Retry-After on 429, no retry on 400, a timeout
// that becomes a recorded failure in bounded time, connection refused, unparseable replies, the
// concurrency limit) and the engine backend with a scripted TextGenerator and the real Qwen3
// tokenizer and chat template (batching, greedy request, decoding, truncation, generator errors).
import { recordWaits } from './helpers/waits.js';
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
  matchesGold,
  openAIJudgeBackend,
  parseBinaryReply,
  parseJudgeReply,
  renderTrajectory,
  type JudgeBackend,
  type JudgeOptions,
  type RewardContext,
} from '../lib/rewards/index.js';
import { Limiter } from '../lib/util/limiter.js';
import { backoffMs } from '../lib/util/http-retry.js';

// The backend tests below were written for the graded 0-10 format and an answer that equals a gold;
// since the binary format and the match shortcut became the defaults (the reference's), they ask for
// the graded format and turn the shortcut off explicitly, so that every request still goes out.
const graded = (o: JudgeOptions) => judgeReward({ format: 'graded', matchShortcut: false, ...o });

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

t.test('parseJudgeReply (graded) reads the last grades after any thinking', async (t) => {
  const p = (s: string, approach = true) => parseJudgeReply(s, approach, 'graded');
  t.same(p('Fine.\nCorrectness: 7\nApproach: 10'), { correctness: 0.7, approach: 1 });
  t.same(p('<think>Correctness: 2 maybe</think>\n**Correctness:** 9/10\n**Approach**: 4'), { correctness: 0.9, approach: 0.4 });
  t.same(
    p('Correctness: 2\nApproach: 1\nOn reflection:\nCorrectness: 8\nApproach: 5.5'),
    { correctness: 0.8, approach: 0.55 },
    'the last occurrence wins',
  );
  t.same(p('{"correctness": 6, "approach": 0}'), { correctness: 0.6, approach: 0 });
  t.same(p('correctness = 10', false), { correctness: 1, approach: null });
  t.throws(() => p('Correctness: 8'), { code: 'JUDGE_FAILED', message: /Approach: <0-10>/ });
  t.throws(() => p('The answer is right.'), { code: 'JUDGE_FAILED', message: /Correctness: <0-10>.*The answer is right/ });
  t.throws(() => p('Correctness: 11\nApproach: 3'), { code: 'JUDGE_FAILED', message: /from 0 to 10, but found 11/ });
  t.throws(() => p('Correctness: -1\nApproach: 3'), { code: 'JUDGE_FAILED' });
});

t.test('parseJudgeReply (binary, the default): category and approach_score from a JSON object', async (t) => {
  // the brief's example: a thinking block first, then the object
  t.same(
    parseJudgeReply(
      '<think>The agent said "unknown". {"category": "correct"} would be wrong.</think>{"category": "gave_up", "approach_score": 30}',
    ),
    { correctness: 0, approach: 0.3, category: 'gave_up' },
  );
  t.same(parseJudgeReply('{"category": "correct", "approach_score": 85}'), { correctness: 1, approach: 0.85, category: 'correct' });
  t.same(
    parseBinaryReply(
      'The answer names the wrong city.\n```json\n{\n  "category": "incorrect",\n  "approach_score": 40\n}\n```\nThat is my verdict.',
    ),
    { correctness: 0, approach: 0.4, category: 'incorrect' },
    'markdown fences and text around',
  );
  t.same(
    parseJudgeReply(
      'First guess {"category": "incorrect", "approach_score": 10}; on reflection {"category": "Correct", "approach_score": "70"}',
    ),
    { correctness: 1, approach: 0.7, category: 'correct' },
    'the last object wins; case and a numeric string are accepted',
  );
  t.same(
    parseJudgeReply('{"category": "gave up", "approach_score": 0, "notes": {"why": "said N/A"}}'),
    { correctness: 0, approach: 0, category: 'gave_up' },
    'nested objects and "gave up"',
  );
  t.same(
    parseJudgeReply("{category: 'incorrect', approach_score: 55}"),
    { correctness: 0, approach: 0.55, category: 'incorrect' },
    'loose, not-quite-JSON text',
  );
  t.same(
    parseJudgeReply('{"category": "correct", "approach_score": 130}'),
    { correctness: 1, approach: 1, category: 'correct' },
    'clamped to 100 as the reference does',
  );
  t.same(
    parseJudgeReply('{"correct": false, "approach_score": 20}'),
    { correctness: 0, approach: 0.2, category: 'incorrect' },
    "the reference's old boolean field",
  );
  t.same(
    parseJudgeReply('{"category": "incorrect"}', false),
    { correctness: 0, approach: null, category: 'incorrect' },
    'without approach',
  );
  t.throws(() => parseJudgeReply('The answer is right, 90 out of 100.'), {
    code: 'JUDGE_FAILED',
    message:
      /Expected the judge's reply to end with a JSON object \{"category": "correct" \| "incorrect" \| "gave_up", "approach_score": <0-100>\}, but found none in "The answer is right/,
  });
  t.throws(() => parseJudgeReply('{"category": "partly", "approach_score": 50}'), {
    code: 'JUDGE_FAILED',
    message: /category to be one of correct, incorrect, gave_up, but found "partly"/,
  });
  t.throws(() => parseJudgeReply('{"category": "correct"}'), {
    code: 'JUDGE_FAILED',
    message: /approach_score to be a number from 0 to 100 beside the category, but found nothing/,
  });
  t.throws(() => parseJudgeReply('{"category": "correct", "approach_score": "high"}'), {
    code: 'JUDGE_FAILED',
    message: /but found "high"/,
  });
  t.throws(
    () => parseJudgeReply('<think>{"category": "correct", "approach_score": 90}</think>I cannot decide.'),
    { code: 'JUDGE_FAILED' },
    'an object inside the thinking does not count',
  );
  t.throws(
    () => parseJudgeReply('Reply with {"category": "correct" | "incorrect" | "gave_up"}', false),
    { code: 'JUDGE_FAILED' },
    'an echo of the prompt is no verdict',
  );
});

t.test('combineGrades: 0.75 / 0.25, or the reference sign_magnitude', async (t) => {
  t.equal(combineGrades({ correctness: 0.8, approach: 0.4 }), 0.75 * 0.8 + 0.25 * 0.4);
  t.ok(Math.abs(combineGrades({ correctness: 0.8, approach: 0.4 }, 'weighted', [0.5, 0.5]) - 0.6) < 1e-12);
  // sign_magnitude changed deliberately (it was (c >= t ? +1 : -1) * a, a wrong answer -approach):
  // now the reference's correct -> +approach, wrong -> -(1 - approach). Hand-computed values:
  t.equal(combineGrades({ correctness: 1, approach: 0.9 }, 'sign_magnitude'), 0.9, 'correct, approach 90: +0.9');
  t.ok(Math.abs(combineGrades({ correctness: 0, approach: 0.9 }, 'sign_magnitude') - -0.1) < 1e-12, 'wrong, approach 90: -0.1');
  t.equal(combineGrades({ correctness: 1, approach: 0.1 }, 'sign_magnitude'), 0.1, 'correct, approach 10: +0.1');
  t.equal(combineGrades({ correctness: 0, approach: 0.1 }, 'sign_magnitude'), -0.9, 'wrong, approach 10: -0.9');
  t.equal(combineGrades({ correctness: 0.8, approach: 0.4 }, 'sign_magnitude'), 0.4);
  t.equal(combineGrades({ correctness: 0.6, approach: 0.4 }, 'sign_magnitude'), -0.6, 'below the 0.7 threshold: -(1 - 0.4)');
  t.equal(combineGrades({ correctness: 0.6, approach: 0.4 }, 'sign_magnitude', undefined, 0.5), 0.4);
  t.equal(combineGrades({ correctness: 0, approach: 0 }, 'sign_magnitude'), -1, 'no answer (0, 0): -1');
  t.ok(
    Object.is(combineGrades({ correctness: 0, approach: 1 }, 'sign_magnitude'), 0),
    'wrong with a perfect approach: 0, no -0 in the logs',
  );
  t.equal(
    combineGrades({ correctness: 0, approach: 0.3, category: 'gave_up' }, 'sign_magnitude'),
    -0.7,
    'gave_up without gaveUpReward: as wrong',
  );
  t.equal(
    combineGrades({ correctness: 0, approach: 0.3, category: 'gave_up' }, 'sign_magnitude', undefined, undefined, -1.5),
    -1.5,
    'gave_up with -1.5',
  );
  t.equal(
    combineGrades({ correctness: 0, approach: 0.3, category: 'incorrect' }, 'sign_magnitude', undefined, undefined, -1.5),
    -0.7,
    'gaveUpReward leaves incorrect alone',
  );
  t.equal(combineGrades({ correctness: 0.3, approach: null }), 0.3, 'without approach: correctness');
});

t.test('matchesGold: the reference deterministic match (lowercased, trimmed, equal or containing)', async (t) => {
  t.ok(matchesGold('  Jørn UTZON ', ['Jørn Utzon']));
  t.ok(matchesGold('The architect was Jørn Utzon.', ['Jørn Utzon']), 'contains');
  t.ok(matchesGold('2012', ['12']), 'literal containment, as the reference');
  t.notOk(matchesGold('Utzon', ['Jørn Utzon']), 'the gold must be inside the answer, not the reverse');
  t.notOk(matchesGold('J. Utzon', ['Jørn Utzon']));
  t.notOk(matchesGold('anything', ['', '  ']), 'an empty gold matches nothing');
  t.notOk(matchesGold(null, ['x']));
  t.ok(matchesGold('Rome', ['Paris', 'rome']), 'any gold');
});

t.test('the judge prompt: rubric, question, golds, answer, trajectory without system and question', async (t) => {
  t.match(judgeSystemPrompt(), /"category"[\s\S]*"gave_up"[\s\S]*"approach_score": an integer from 0 to 100/, 'binary by default');
  t.match(judgeSystemPrompt(), /\{"category": "correct" \| "incorrect" \| "gave_up", "approach_score": <0-100>\}$/);
  t.match(judgeSystemPrompt(false), /\{"category": "correct" \| "incorrect" \| "gave_up"\}$/);
  t.notMatch(judgeSystemPrompt(false), /approach/i);
  t.match(judgeSystemPrompt(true, 'graded'), /Correctness: <0-10>\nApproach: <0-10>$/);
  t.notMatch(judgeSystemPrompt(false, 'graded'), /Approach/);
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

/** A judge backend that replies with the given texts in turn (an Error is thrown) and counts its calls. */
function fakeJudge(...replies: Array<string | Error>): JudgeBackend & { calls: number; seen: string[][] } {
  const b = {
    description: 'fake judge',
    calls: 0,
    seen: [] as string[][],
    async complete(messages: readonly { content: string }[]) {
      const r = replies[Math.min(b.calls++, replies.length - 1)];
      b.seen.push(messages.map((m) => m.content));
      if (r instanceof Error) throw r;
      return { text: r };
    },
  };
  return b;
}

const near = (a: number | null | undefined, b: number) => typeof a === 'number' && Math.abs(a - b) < 1e-12;
const wrong = { ...ctx, answer: 'Frank Gehry' };

t.test('binary judge (default) with sign_magnitude: the reference values, computed by hand', async (t) => {
  const cases: Array<[string, number, boolean]> = [
    ['{"category": "correct", "approach_score": 90}', 0.9, true],
    ['{"category": "incorrect", "approach_score": 90}', -0.1, false], // -(1 - 0.9)
    ['{"category": "correct", "approach_score": 10}', 0.1, true],
    ['{"category": "incorrect", "approach_score": 10}', -0.9, false], // -(1 - 0.1)
    ['<think>no real answer</think>{"category": "gave_up", "approach_score": 30}', -0.7, false], // gave_up as wrong: -(1 - 0.3)
  ];
  for (const [reply, value, correct] of cases) {
    const backend = fakeJudge(reply);
    const r = await judgeReward({ backend, combine: 'sign_magnitude' })(wrong);
    t.equal(backend.calls, 1, reply);
    t.ok(near(r.parts.judge, value), `${reply}: ${r.parts.judge} = ${value}`);
    t.equal(r.correct, correct, reply);
    t.equal(r.parts.judge_correctness, correct ? 1 : 0, 'binary correctness is 1 or 0');
    t.equal(r.parts.judge_gave_up, reply.includes('gave_up') ? 1 : 0);
    t.equal(r.parts.judge_matched, 0);
  }
  const b = fakeJudge('{"category": "correct", "approach_score": 80}');
  await judgeReward({ backend: b })(wrong);
  t.match(b.seen[0][0], /"approach_score": <0-100>\}$/, 'the default system prompt asks for the JSON object');
  t.match(b.seen[0][1], /Final answer: Frank Gehry/);
});

t.test('binary judge: weighted parts, and gave_up with gaveUpReward -1.5', async (t) => {
  const r = await judgeReward({ backend: fakeJudge('{"category": "correct", "approach_score": 60}') })(wrong);
  t.same(r.parts, {
    judge_correctness: 1,
    judge_approach: 0.6,
    judge: 0.75 * 1 + 0.25 * 0.6,
    judge_error: 0,
    judge_skipped: 0,
    judge_matched: 0,
    judge_gave_up: 0,
  });
  const g = await judgeReward({
    backend: fakeJudge('{"category": "gave_up", "approach_score": 30}'),
    combine: 'sign_magnitude',
    gaveUpReward: -1.5,
  })(wrong);
  t.equal(g.parts.judge, -1.5);
  t.equal(g.parts.judge_gave_up, 1);
  t.equal(g.correct, false);
  const noApproach = await judgeReward({ backend: fakeJudge('{"category": "correct"}'), approach: false })(wrong);
  t.same(noApproach.parts, { judge_correctness: 1, judge: 1, judge_error: 0, judge_skipped: 0, judge_matched: 0, judge_gave_up: 0 });
  t.throws(() => judgeReward({ backend: fakeJudge(''), format: 'fuzzy' as never }), {
    code: 'ARGUMENT_INVALID',
    message: /binary, graded/,
  });
});

t.test('no answer: -1 under sign_magnitude, judge_skipped 1, and no request', async (t) => {
  const backend = fakeJudge('{"category": "correct", "approach_score": 100}');
  const r = await judgeReward({ backend, combine: 'sign_magnitude' })({ ...ctx, answer: null });
  t.equal(backend.calls, 0, 'no request');
  t.same(r.parts, {
    judge_correctness: 0,
    judge_approach: 0,
    judge: -1,
    judge_error: 0,
    judge_skipped: 1,
    judge_matched: 0,
    judge_gave_up: 0,
  });
  t.equal(r.correct, false);
  const asked = await judgeReward({ backend, combine: 'sign_magnitude', skipWithoutAnswer: false })({ ...ctx, answer: null });
  t.equal(backend.calls, 1, 'skipWithoutAnswer: false sends it');
  // A "correct" verdict on no answer does not count (the reference: `result.correct and final_answer
  // is not None`): correctness 0, so -(1 - 1) = 0.
  t.equal(asked.parts.judge, 0);
  t.equal(asked.parts.judge_correctness, 0);
  t.equal(asked.correct, false);
  t.match(backend.seen[0][1], /Final answer: \(none: the assistant ended without an answer\)/);
});

t.test('match shortcut: an answer equal to or containing a gold is correct without a request', async (t) => {
  const backend = fakeJudge('{"category": "incorrect", "approach_score": 0}');
  for (const answer of ['Jørn Utzon', '  jørn utzon', 'It was designed by Jørn Utzon in 1957.']) {
    const r = await judgeReward({ backend, combine: 'sign_magnitude' })({ ...ctx, answer });
    t.same(
      r.parts,
      { judge_correctness: 1, judge_approach: 1, judge: 1, judge_error: 0, judge_skipped: 0, judge_matched: 1, judge_gave_up: 0 },
      answer,
    );
    t.equal(r.correct, true);
  }
  const w = await judgeReward({ backend })(ctx);
  t.equal(w.parts.judge, 1, 'weighted: 0.75 + 0.25');
  const gr = await judgeReward({ backend, format: 'graded' })(ctx);
  t.same(gr.parts, { judge_correctness: 1, judge_approach: 1, judge: 1, judge_error: 0, judge_skipped: 0, judge_matched: 1 }, 'graded too');
  t.equal(backend.calls, 0, 'no request made');
  const off = await judgeReward({ backend, combine: 'sign_magnitude', matchShortcut: false })(ctx);
  t.equal(backend.calls, 1, 'matchShortcut: false asks the judge');
  t.equal(off.parts.judge, -1, '-(1 - 0) from the judge reply');
  t.equal(off.parts.judge_matched, 0);
});

t.test('a failed judge (thrown error, unparseable reply) is recorded with null parts', async (t) => {
  const thrown = await judgeReward({ backend: fakeJudge(new Error('socket hang up')), combine: 'sign_magnitude' })(wrong);
  t.same(thrown.parts, {
    judge_correctness: null,
    judge_approach: null,
    judge: null,
    judge_error: 1,
    judge_skipped: 0,
    judge_matched: 0,
    judge_gave_up: null,
  });
  t.equal(thrown.correct, undefined);
  t.equal(thrown.errors?.judge, 'fake judge: socket hang up');
  const garbled = await judgeReward({ backend: fakeJudge('I would say it is mostly right.') })(wrong);
  t.equal(garbled.parts.judge_error, 1);
  t.match(
    garbled.errors?.judge,
    /^fake judge: Expected the judge's reply to end with a JSON object .*but found none in "I would say it is mostly right\."/,
  );
});

t.test('helpers: backoff doubles up to its cap; the limiter holds the line', async (t) => {
  t.same(
    [1, 2, 3, 4, 5].map((a) => backoffMs(a, 100, 1000)),
    [100, 200, 400, 800, 1000],
  );
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

const completion = (content: unknown, finish = 'stop') =>
  JSON.stringify({
    id: 'x',
    object: 'chat.completion',
    choices: [{ index: 0, message: { role: 'assistant', content }, finish_reason: finish }],
  });
const send = (res: ServerResponse, status: number, body: string, headers: Record<string, string> = {}) => {
  res.writeHead(status, { 'content-type': 'application/json', ...headers });
  res.end(body);
};

t.test('http judge: the request, the parsed grades and the parts', async (t) => {
  const srv = await loopback(t, (_req, _body, res) =>
    send(res, 200, completion('The answer names the architect.\nCorrectness: 10\nApproach: 5')),
  );
  const backend = openAIJudgeBackend({
    baseUrl: srv.baseUrl + '/',
    model: 'judge-7b',
    apiKeyEnv: 'JUDGE_KEY',
    env: { JUDGE_KEY: 'sk-test' },
    maxTokens: 300,
    extraBody: { chat_template_kwargs: { enable_thinking: false } },
  });
  const r = await graded({ backend })(ctx);
  t.same(r.parts, { judge_correctness: 1, judge_approach: 0.5, judge: 0.75 + 0.125, judge_error: 0, judge_skipped: 0, judge_matched: 0 });
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
  t.same(
    body.messages.map((m: { role: string }) => m.role),
    ['system', 'user'],
  );
  t.match(body.messages[1].content, /Final answer: Jørn Utzon/);
});

t.test('http judge (binary, the default): the JSON verdict through a real server', async (t) => {
  const srv = await loopback(t, (_req, _body, res) =>
    send(
      res,
      200,
      completion('<think>They searched well but named Gehry.</think>\n```json\n{"category": "incorrect", "approach_score": 70}\n```'),
    ),
  );
  const r = await judgeReward({ backend: openAIJudgeBackend({ baseUrl: srv.baseUrl, model: 'm' }), combine: 'sign_magnitude' })(wrong);
  t.equal(srv.requests.length, 1);
  t.match(
    JSON.parse(srv.requests[0].body).messages[0].content,
    /"category": "correct" \| "incorrect" \| "gave_up", "approach_score": <0-100>/,
  );
  t.ok(near(r.parts.judge, -0.3), `-(1 - 0.7) = -0.3, got ${r.parts.judge}`);
  t.equal(r.parts.judge_approach, 0.7);
  t.equal(r.correct, false);
  const hit = await judgeReward({ backend: openAIJudgeBackend({ baseUrl: srv.baseUrl, model: 'm' }) })(ctx);
  t.equal(srv.requests.length, 1, 'the gold answer itself needs no request');
  t.equal(hit.parts.judge_matched, 1);
});

t.test('http judge: a 500 is retried, then the reply counts', async (t) => {
  const srv = await loopback(t, (_req, _body, res, n) =>
    n === 1 ? send(res, 500, '{"error":"overloaded"}') : send(res, 200, completion('Correctness: 4\nApproach: 8')),
  );
  const backend = openAIJudgeBackend({ baseUrl: srv.baseUrl, model: 'm', retries: 2, backoffMs: 50 });
  const r = await graded({ backend })(ctx);
  t.equal(srv.requests.length, 2);
  t.ok(srv.requests[1].at - srv.requests[0].at >= 45, 'waited the backoff before retrying');
  t.same(r.parts, {
    judge_correctness: 0.4,
    judge_approach: 0.8,
    judge: 0.75 * 0.4 + 0.25 * 0.8,
    judge_error: 0,
    judge_skipped: 0,
    judge_matched: 0,
  });
  t.equal(r.correct, false);
  t.equal(r.errors, undefined);
});

t.test('http judge: a 429 waits Retry-After; a 400 is not retried', async (t) => {
  const srv = await loopback(t, (_req, _body, res, n) =>
    n === 1 ? send(res, 429, '{}', { 'retry-after': '0.2' }) : send(res, 200, completion('Correctness: 9\nApproach: 9')),
  );
  const backend = openAIJudgeBackend({ baseUrl: srv.baseUrl, model: 'm', retries: 1, backoffMs: 1 });
  const waits = recordWaits(t);
  const r = await graded({ backend })(ctx);
  t.equal(r.parts.judge_correctness, 0.9);
  t.same(waits, [200], 'Retry-After honoured (200 ms, not the 1 ms backoff)');
  t.equal(srv.requests.length, 2);

  const bad = await loopback(t, (_req, _body, res) => send(res, 400, '{"error":"unknown model m"}'));
  const r2 = await graded({ backend: openAIJudgeBackend({ baseUrl: bad.baseUrl, model: 'm', retries: 3, backoffMs: 1 }) })(ctx);
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
  const waits = recordWaits(t);
  const r = await graded({ backend })(ctx);
  t.same(waits, [20], 'one backoff of 20 ms between the two attempts');
  t.equal(srv.requests.length, 2, 'the timed-out attempt was retried once');
  t.same(r.parts, { judge_correctness: null, judge_approach: null, judge: null, judge_error: 1, judge_skipped: 0, judge_matched: 0 });
  t.equal(r.correct, undefined, 'no verdict from a failed judge');
  t.match(r.errors?.judge, /attempt 1: no reply within 200 ms; attempt 2: no reply within 200 ms/);
  t.match(r.errors?.judge, /Raise timeout_s or retries/);
});

t.test('http judge: a body that stalls after the headers also times out', async (t) => {
  const srv = await loopback(t, (_req, _body, res) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.write('{"choices": [');
  });
  const r = await graded({ backend: openAIJudgeBackend({ baseUrl: srv.baseUrl, model: 'm', timeoutMs: 150, retries: 0 }) })(ctx);
  t.equal(r.parts.judge_error, 1);
  t.match(r.errors?.judge, /did not finish within 150 ms/);
});

t.test('http judge: connection refused is retried, then recorded', async (t) => {
  const srv = await loopback(t, (_req, _body, res) => send(res, 200, '{}'));
  const closedUrl = srv.baseUrl.replace(/:\d+\//, ':1/'); // port 1: nothing listens there
  const r = await graded({ backend: openAIJudgeBackend({ baseUrl: closedUrl, model: 'm', retries: 2, backoffMs: 1 }) })(ctx);
  t.equal(r.parts.judge_error, 1);
  t.match(r.errors?.judge, /attempt 3: request failed/);
});

t.test('http judge: unparseable replies are recorded failures', async (t) => {
  const replies = [completion('I think the answer is fine.'), completion(null), 'not json', completion('Correctness: 3', 'length')];
  const srv = await loopback(t, (_req, _body, res, n) => send(res, 200, replies[n - 1]));
  const judge = graded({ backend: openAIJudgeBackend({ baseUrl: srv.baseUrl, model: 'm', retries: 3, backoffMs: 1 }) });
  const expected = [
    /Correctness: <0-10>.*I think the answer is fine/,
    /choices\[0\]\.message\.content as a string, but found content null/,
    /Expected a JSON body, but found "not json"/,
    /Approach: <0-10>.*cut at the token limit/,
  ];
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
  const judge = graded({ backend: openAIJudgeBackend({ baseUrl: srv.baseUrl, model: 'm', concurrency: 2 }) });
  const rs = await Promise.all(Array.from({ length: 5 }, () => judge(ctx)));
  t.equal(srv.requests.length, 5);
  t.equal(srv.peak(), 2, 'never more than 2 requests in flight');
  t.ok(rs.every((r) => r.parts.judge === 1));
  const none = await judge({ ...ctx, answer: null });
  t.equal(srv.requests.length, 5, 'no request');
  t.same(none.parts, { judge_correctness: 0, judge_approach: 0, judge: 0, judge_error: 0, judge_skipped: 1, judge_matched: 0 });
  t.equal(none.correct, false);
});

t.test('http judge: bad options are refused up front', async (t) => {
  t.throws(() => openAIJudgeBackend({ baseUrl: '127.0.0.1:8000', model: 'm' }), { code: 'ARGUMENT_INVALID', message: /http:\/\// });
  t.throws(() => openAIJudgeBackend({ baseUrl: 'http://x/v1', model: '' }), { code: 'ARGUMENT_INVALID' });
  t.throws(() => openAIJudgeBackend({ baseUrl: 'http://x/v1', model: 'm', concurrency: 0 }), { code: 'ARGUMENT_INVALID' });
  t.throws(() => openAIJudgeBackend({ baseUrl: 'http://x/v1', model: 'm', apiKeyEnv: 'NOPE', env: {} }), {
    code: 'CONFIG_INVALID',
    message: /NOPE/,
  });
  t.throws(() => graded({ backend: undefined as never }), { code: 'ARGUMENT_INVALID' });
  t.throws(
    () => graded({ backend: { description: 'x', complete: async () => ({ text: '' }) }, approach: false, combine: 'sign_magnitude' }),
    { code: 'ARGUMENT_INVALID' },
  );
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
  const gen = new ScriptedGenerator((prompt) =>
    prompt.includes('Final answer: Jørn Utzon') ? 'Correctness: 9\nApproach: 3<|im_end|>' : 'Correctness: 1\nApproach: 2<|im_end|>',
  );
  const judge = graded({
    backend: engineJudgeBackend({ generator: gen, tokenizer: tok, formatter, maxNewTokens: 64, enableThinking: false }),
  });
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
  t.same(a.parts, {
    judge_correctness: 0.9,
    judge_approach: 0.3,
    judge: 0.75 * 0.9 + 0.25 * 0.3,
    judge_error: 0,
    judge_skipped: 0,
    judge_matched: 0,
  });
  t.same(b.parts.judge_correctness, 0.1);
  t.equal(b.correct, false);
  t.same(c.parts, a.parts);
});

t.test('engine judge (binary): the JSON verdict decodes and parses; a cut reply is a failure', async (t) => {
  const gen = new ScriptedGenerator(() => '{"category": "correct", "approach_score": 40}<|im_end|>');
  const r = await judgeReward({
    backend: engineJudgeBackend({ generator: gen, tokenizer: tok, formatter, enableThinking: false }),
    combine: 'sign_magnitude',
  })(wrong);
  t.equal(gen.requests.length, 1);
  t.match(tok.decode(gen.requests[0].prompts[0]), /"approach_score": <0-100>\}<\|im_end\|>/);
  t.equal(r.parts.judge, 0.4);
  t.equal(r.correct, true);
  const cut = await judgeReward({
    backend: engineJudgeBackend({ generator: new ScriptedGenerator(() => '{"category": "corr', 'length'), tokenizer: tok, formatter }),
  })(wrong);
  t.equal(cut.parts.judge_error, 1);
  t.match(cut.errors?.judge, /JSON object.*cut at the token limit/);
});

t.test('engine judge: batch size splits calls; truncation and generator errors are recorded', async (t) => {
  const gen = new ScriptedGenerator(() => 'Correctness: 5\nApproach: 5');
  const judge = graded({ backend: engineJudgeBackend({ generator: gen, tokenizer: tok, formatter, batchSize: 2 }) });
  await Promise.all([judge(ctx), judge(ctx), judge(ctx)]);
  t.same(
    gen.requests.map((r) => r.prompts.length),
    [2, 1],
  );

  const cut = graded({
    backend: engineJudgeBackend({
      generator: new ScriptedGenerator(() => 'Let me think about the correct', 'length'),
      tokenizer: tok,
      formatter,
    }),
  });
  const r = await cut(ctx);
  t.equal(r.parts.judge_error, 1);
  t.match(r.errors?.judge, /^engine judge: .*cut at the token limit/);

  const failing: TextGenerator = {
    generate: async () => {
      throw new Error('CUDA out of memory');
    },
  };
  const broken = graded({ backend: engineJudgeBackend({ generator: failing, tokenizer: tok, formatter, description: 'judge Qwen3-8B' }) });
  const rs = await Promise.all([broken(ctx), broken(ctx)]);
  for (const x of rs) {
    t.equal(x.parts.judge, null);
    t.match(x.errors?.judge, /judge Qwen3-8B failed to generate: CUDA out of memory/);
  }
});
