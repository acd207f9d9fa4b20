// The server's batching queue (continuous batching) with a stand-in model whose decode sessions end
// when the test says: rows that agree with a running session join it at once (no wait for it to
// end), rows with other settings start a session beside it (at most maxConcurrentCalls), a session
// with another adapter waits until none runs, a session that has ended takes no rows (a new one
// starts), a row whose client left is never submitted, each row gets the top log-probs it asked for,
// and the prefill chunk and maxBatch reach the session.
import t from 'tap';
import type { Model } from '../lib/engine/model.js';
import type { SessionOptions, SessionRow } from '../lib/engine/session.js';
import { Batcher } from '../lib/serve/batcher.js';
import { Job } from '../lib/serve/job.js';
import type { ServeOptions } from '../lib/serve/options.js';

interface Session {
  opts: SessionOptions;
  rows: SessionRow[];
  /** Ends every row (finish 'length') and the session. */
  end: () => void;
}

function stand(o: Partial<ServeOptions>) {
  const sessions: Session[] = [];
  const adapters: string[] = [];
  let running = 0;
  let most = 0;
  const model = {
    decodeSession: (opts: SessionOptions) => {
      const rows: SessionRow[] = [];
      let ended = false;
      let resolve!: (v: unknown) => void;
      const done = new Promise((r) => (resolve = r));
      const s: Session = {
        opts,
        rows,
        end: () => {
          ended = true;
          running--;
          for (const r of rows) r.onEnd?.('length');
          resolve({
            steps: 1,
            rows: rows.length,
            joined: 0,
            maxBatch: rows.length,
            prefillTokens: 1,
            rebuilds: 0,
            prefillSeconds: 0,
            decodeSeconds: 0,
          });
        },
      };
      sessions.push(s);
      return {
        done,
        get rows() {
          return ended ? 0 : rows.length;
        },
        submitAll: (add: SessionRow[]) => {
          if (ended) return [];
          if (!rows.length) most = Math.max(most, ++running);
          return add.map((row) => rows.push(row) - 1);
        },
      };
    },
    loadAdapter: async (dir: string) => void adapters.push(dir),
    detachLora: () => void adapters.push('none'),
  } as unknown as Model;
  const b = new Batcher({ model, ...o } as ServeOptions, new Map([['other', '/adapters/other']]));
  return { b, sessions, adapters, most: () => most };
}
const job = (adapter: string | null = null, promptTokens = 2, topK = 0, topN = 0) =>
  new Job(
    new Int32Array(promptTokens).fill(1),
    { topK, stop: [], stopTokenIds: [], adapter, maxTokens: 4, temperature: 0, topP: 1, topN, keepStop: false } as never,
    1,
    () => '',
  );
const until = async (ok: () => boolean) => {
  for (let i = 0; i < 2000 && !ok(); i++) await new Promise((r) => setTimeout(r, 5));
  if (!ok()) throw new Error('timed out');
};
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

t.test('rows that agree with the running session join it at once; prefillChunk and maxBatch reach it', async (t) => {
  const { b, sessions } = stand({ prefillChunk: 64, maxBatch: 8 });
  const first = job();
  b.enqueue([first]);
  t.equal(sessions.length, 1, 'a session starts at once');
  t.match(sessions[0].opts, { prefillChunk: 64, maxRows: 8, topLogprobs: 0 }, 'prefillChunk and maxBatch reach the session');
  b.enqueue([job(), job()]);
  t.equal(sessions.length, 1, 'no second session');
  t.equal(sessions[0].rows.length, 3, 'the later rows joined the running session without waiting for it to end');
  t.same(b.batches.since(0), [1, 2], 'two submissions: 1 row, then 2');
  t.equal(sessions[0].rows[0].prompt, first.prompt, "the row's prompt reaches the session");
  sessions[0].end();
  await b.idle();
  t.same(await first.result, { text: '', finish: 'length' }, 'a row ends when the session says so');
  t.same(
    b.calls.since(0).map((c) => c.rows),
    [1, 2],
    'each submission recorded once its rows ended',
  );
  t.equal(b.sessionStats.count, 1, "the session's counters recorded");
});

t.test('rows with other settings start a session beside it, up to maxConcurrentCalls; another adapter waits for none to run', async (t) => {
  const { b, sessions, adapters, most } = stand({});
  b.enqueue([job()]);
  b.enqueue([job(null, 2, 5)]);
  t.equal(sessions.length, 2, 'top-k 5: a session of its own beside the first');
  t.equal(sessions[1].opts.topK, 5);
  b.enqueue([job(null, 2, 7)]);
  b.enqueue([job('other')]);
  await sleep(50);
  t.equal(sessions.length, 2, 'a third setting waits: two sessions run (maxConcurrentCalls default 2)');
  b.enqueue([job()]);
  t.equal(sessions[0].rows.length, 2, 'a row that agrees still joins at once');
  sessions[0].end();
  await until(() => sessions.length === 3);
  t.equal(sessions[2].opts.topK, 7, 'the waiting setting starts when a session ends');
  t.same(adapters, [], 'no adapter switched while sessions ran');
  sessions[1].end();
  sessions[2].end();
  await until(() => sessions.length === 4);
  t.same(adapters, ['/adapters/other'], 'switched once none ran');
  sessions[3].end();
  await b.idle();
  t.equal(most(), 2);
});

t.test('a session that has ended takes no rows: a new one starts; maxConcurrentCalls 1', async (t) => {
  const { b, sessions, most } = stand({ maxConcurrentCalls: 1 });
  b.enqueue([job()]);
  sessions[0].end(); // ended: its done has not been seen by the batcher yet
  b.enqueue([job()]);
  t.equal(sessions.length, 2, 'the row went to a new session');
  t.equal(sessions[1].rows.length, 1);
  b.enqueue([job(null, 2, 3)]);
  await sleep(50);
  t.equal(sessions.length, 2, 'maxConcurrentCalls 1: another setting waits');
  sessions[1].end();
  await until(() => sessions.length === 3);
  sessions[2].end();
  await b.idle();
  t.equal(most(), 1);
});

t.test("a queued row whose client left is never submitted; a row's top log-probs are the ones it asked for", async (t) => {
  const { b, sessions } = stand({ maxConcurrentCalls: 1 });
  b.enqueue([job()]);
  const gone = job(null, 2, 9);
  b.enqueue([gone]);
  gone.abort.abort();
  t.same(await gone.result, { text: '', finish: 'cancelled' });
  sessions[0].end();
  await b.idle();
  t.equal(sessions.length, 1, 'no session for the row that left');
  const { b: b2, sessions: s2 } = stand({});
  const j = job(null, 2, 0, 3);
  b2.enqueue([j]);
  t.equal(s2[0].opts.topLogprobs, 20, 'a session with log-probs computes the most a row may ask');
  const ids = Int32Array.from({ length: 20 }, (_, i) => i);
  s2[0].rows[0].onToken?.({ row: 0, token: 5, logprob: -1, top: { ids, logprobs: new Float32Array(20) } });
  t.same(Array.from(j.top[0]!.ids), [0, 1, 2], 'the row keeps its 3');
  s2[0].end();
  await b2.idle();
});
