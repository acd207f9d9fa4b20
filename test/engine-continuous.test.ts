// Continuous batching (Model.decodeSession, native/core/continuous.h; issue 30 item 6): rows that
// join a running decode get the tokens generate gives them alone, the rows already decoding are not
// disturbed, a long prompt is prefilled a chunk at a time while the others keep producing tokens,
// cancelled rows end, the session's stops / row limits / maxRows hold, and a session that has ended
// refuses rows.
import { join } from 'node:path';
import t from 'tap';
import { Model } from '../lib/engine/model.js';
import type { DecodeSession, RowFinish, SessionRow } from '../lib/engine/session.js';
import type { TokenEvent } from '../lib/engine/types.js';
import { initModel } from '../lib/model/init.js';

const dir = join(t.testdir(), 'model');
initModel({ preset: 'tiny', out: dir, seed: 30, embedStd: 0.3 });
const seq = (n: number, k: number) => Int32Array.from({ length: n }, (_, i) => 3 + ((i * 11 + k * 5) % 300));

interface Got {
  tokens: number[];
  logprobs: number[];
  finish?: RowFinish;
  error?: unknown;
  ended: Promise<void>;
  /** How many tokens other rows had produced (in this session) when this row's first came. */
  firstAt?: number;
}

/** A row that collects its tokens; `clock` counts every token of the session. */
function collect(row: Omit<SessionRow, 'onToken' | 'onEnd'>, clock: { n: number }, onToken?: (ev: TokenEvent) => void) {
  let done!: () => void;
  const got: Got = { tokens: [], logprobs: [], ended: new Promise((r) => (done = r)) };
  const full: SessionRow = {
    ...row,
    onToken: (ev) => {
      if (!got.tokens.length) got.firstAt = clock.n;
      clock.n++;
      got.tokens.push(ev.token);
      got.logprobs.push(ev.logprob);
      onToken?.(ev);
    },
    onEnd: (f, e) => {
      got.finish = f;
      got.error = e;
      done();
    },
  };
  return { got, row: full };
}

/** Submits one row (collect's). */
function submit(s: DecodeSession, row: Omit<SessionRow, 'onToken' | 'onEnd'>, clock: { n: number }, onToken?: (ev: TokenEvent) => void) {
  const c = collect(row, clock, onToken);
  return { id: s.submit(c.row), got: c.got };
}

const alone = async (model: Model, prompt: Int32Array, maxNewTokens: number, temperature: number, seed: number) => {
  const r = await model.generateStream({ prompts: [prompt], maxNewTokens, temperature, rowSeeds: [seed] });
  return { tokens: Array.from(r.tokens[0]), logprobs: Array.from(r.logprobs[0]), finish: r.finishReasons[0] };
};

const maxDiff = (a: number[], b: number[]) => Math.max(0, ...a.map((x, i) => Math.abs(x - b[i])));

t.test('rows submitted together and rows joining later get the tokens generate gives them alone', async (t) => {
  const model = await Model.load(dir);
  t.teardown(() => model.dispose());
  // Row 0 runs until the late rows have ended (then its client leaves), so the loop is still decoding
  // when they are submitted however late this thread sees its tokens.
  const stop0 = new AbortController();
  const head = { prompt: seq(40, 1), maxNewTokens: 600, temperature: 0, seed: 0 };
  const rows = [
    { prompt: seq(9, 2), maxNewTokens: 12, temperature: 1, seed: 7 },
    { prompt: seq(9, 2), maxNewTokens: 20, temperature: 0.8, seed: 8 }, // the same prompt, another stream
  ];
  const late = [
    { prompt: seq(25, 3), maxNewTokens: 15, temperature: 0, seed: 0 },
    { prompt: seq(70, 4), maxNewTokens: 10, temperature: 1.2, seed: 99 },
  ];
  const s = model.decodeSession({ prefillChunk: 16 });
  const clock = { n: 0 };
  let lateGot: Got[] = [];
  // The late rows join once row 0 has produced 5 tokens (the loop is decoding then).
  const first = submit(s, { ...head, signal: stop0.signal }, clock, () => {
    if (first.got.tokens.length !== 5) return;
    lateGot = late.map((r) => submit(s, r, clock).got);
    void Promise.all(lateGot.map((g) => g.ended)).then(() => stop0.abort());
  });
  const others = rows.map((r) => submit(s, r, clock).got);
  const stats = await s.done;
  await Promise.all([first.got, ...others, ...lateGot].map((g) => g.ended));
  const check = async (name: string, g: Got, r: (typeof rows)[number]) => {
    const a = await alone(model, r.prompt, r.maxNewTokens, r.temperature, r.seed);
    t.same(g.tokens, a.tokens, `${name}: the tokens it gets alone`);
    const d = maxDiff(g.logprobs, a.logprobs);
    t.ok(d < 1e-4, `${name}: log-probs within ${d.toExponential(1)} of alone`);
    t.equal(g.finish, a.finish, `${name}: finish ${a.finish}`);
  };
  for (let i = 0; i < rows.length; i++) await check(`row ${i + 1}`, others[i], rows[i]);
  for (let i = 0; i < late.length; i++) await check(`late row ${i}`, lateGot[i], late[i]);
  const a0 = await alone(model, head.prompt, head.maxNewTokens, 0, 0);
  t.equal(first.got.finish, 'cancelled', 'row 0 ended when its client left');
  t.ok(first.got.tokens.length > 5, `row 0 decoded on while the late rows ran (${first.got.tokens.length} tokens)`);
  t.same(first.got.tokens, a0.tokens.slice(0, first.got.tokens.length), 'row 0: the tokens it gets alone, undisturbed by the joins');
  t.ok(stats.joined >= 2, `the late rows joined a running batch (joined ${stats.joined})`);
  t.equal(stats.rows, 5);
  t.ok(lateGot[0].firstAt! > 5, 'the late rows started after the first rows had decoded');
  t.equal(s.submit({ prompt: seq(5, 1), maxNewTokens: 2 }), -1, 'a session that has ended refuses rows');
  t.same(
    s.submitAll([
      { prompt: seq(5, 1), maxNewTokens: 2 },
      { prompt: seq(6, 1), maxNewTokens: 2 },
    ]),
    [],
    'all of them',
  );
});

t.test('a long prompt is prefilled a chunk at a time while the running rows keep decoding', async (t) => {
  const model = await Model.load(dir);
  t.teardown(() => model.dispose());
  const s = model.decodeSession({ prefillChunk: 32 });
  const clock = { n: 0 };
  const stopA = new AbortController();
  let b: ReturnType<typeof submit> | undefined;
  let atSubmit = 0;
  // Row a runs until b has ended; b (320 positions, chunks of 32) is submitted at a's 3rd token.
  const a = submit(s, { prompt: seq(10, 1), maxNewTokens: 2000, temperature: 0, signal: stopA.signal }, clock, () => {
    if (a.got.tokens.length !== 3) return;
    atSubmit = clock.n;
    b = submit(s, { prompt: seq(320, 5), maxNewTokens: 5, temperature: 0 }, clock);
    void b.got.ended.then(() => stopA.abort());
  });
  await s.done;
  await a.got.ended;
  const bAlone = await alone(model, seq(320, 5), 5, 0, 0);
  t.same(b!.got.tokens, bAlone.tokens, 'the long prompt: its tokens alone');
  // 320 positions in chunks of 32: 10 prefill iterations, each followed by a decode step of row a.
  const during = (b!.got.firstAt ?? 0) - atSubmit;
  t.ok(during >= 9, `row a produced ${during} tokens while row b's prompt was prefilled (10 chunks)`);
  const aAlone = await alone(model, seq(10, 1), 2000, 0, 0);
  t.same(a.got.tokens, aAlone.tokens.slice(0, a.got.tokens.length), 'row a undisturbed by the join');
});

t.test('cancelled rows end, stops and maxRows hold, a throwing onToken ends only its row', async (t) => {
  const model = await Model.load(dir);
  t.teardown(() => model.dispose());
  const free = await alone(model, seq(12, 6), 12, 0, 0);
  const stopId = free.tokens[4];
  const s = model.decodeSession({ maxRows: 2, stopTokenIds: [stopId] });
  const clock = { n: 0 };
  const ab = new AbortController();
  let mine = 0;
  // Submitted together (all or none): however soon the first row ends, the others are in its loop.
  const rows = [
    collect({ prompt: seq(12, 6), maxNewTokens: 12, temperature: 0 }, clock),
    collect({ prompt: seq(15, 7), maxNewTokens: 400, temperature: 1, seed: 3, signal: ab.signal }, clock, () => {
      if (++mine === 5) ab.abort();
    }),
    collect({ prompt: seq(8, 8), maxNewTokens: 6, temperature: 1, seed: 4 }, clock, () => {
      throw new Error('client gone');
    }),
    collect({ prompt: seq(11, 9), maxNewTokens: 3, temperature: 0 }, clock),
  ];
  t.same(s.submitAll(rows.map((r) => r.row)), [0, 1, 2, 3], 'four rows, ids in order');
  const stats = await s.done;
  await Promise.all(rows.map((r) => r.got.ended));
  t.equal(rows[0].got.finish, 'stop_token', 'the stop token ends the row');
  t.equal(rows[0].got.tokens.length, free.tokens.indexOf(stopId) + 1, 'at its first occurrence');
  t.equal(rows[1].got.finish, 'cancelled', 'an aborted signal ends the row');
  t.ok(rows[1].got.tokens.length < 400, 'before its limit');
  t.equal(rows[2].got.finish, 'cancelled');
  t.match(String(rows[2].got.error), /client gone/, 'the row that threw ends with its error');
  t.equal(rows[2].got.tokens.length, 1, 'after its first token');
  t.equal(rows[3].got.finish, 'length');
  t.equal(rows[3].got.tokens.length, 3);
  t.ok(stats.maxBatch <= 2, `maxRows 2: at most 2 rows decoded at once (${stats.maxBatch})`);
});

t.test('a row cancelled before it starts ends without a token; bad rows are refused at submit', async (t) => {
  const model = await Model.load(dir);
  t.teardown(() => model.dispose());
  const s = model.decodeSession({ maxRows: 1 });
  const clock = { n: 0 };
  const ab = new AbortController();
  const first = collect({ prompt: seq(10, 1), maxNewTokens: 20, temperature: 0 }, clock);
  const waiting = collect({ prompt: seq(10, 2), maxNewTokens: 20, temperature: 0, signal: ab.signal }, clock);
  s.submitAll([first.row, waiting.row]); // maxRows 1: the second waits for the first
  ab.abort();
  t.throws(() => s.submit({ prompt: new Int32Array(0), maxNewTokens: 2 }), { code: 'ARGUMENT_INVALID' });
  t.throws(() => s.submit({ prompt: Int32Array.from([1, 1e6]), maxNewTokens: 2 }), { code: 'TOKEN_OUT_OF_RANGE' });
  t.throws(() => s.submit({ prompt: seq(3, 1), maxNewTokens: 0 }), { code: 'ARGUMENT_INVALID', message: /maxNewTokens/ });
  t.throws(() => s.submit({ prompt: seq(3, 1), maxNewTokens: 2, topP: 0 }), { code: 'ARGUMENT_INVALID', message: /topP/ });
  await s.done;
  await waiting.got.ended;
  t.equal(waiting.got.finish, 'cancelled');
  t.same(waiting.got.tokens, [], 'no token');
  t.equal(first.got.tokens.length, 20);
  t.throws(() => model.decodeSession({ maxRows: 0 }), { code: 'ARGUMENT_INVALID', message: /maxRows/ });
});
