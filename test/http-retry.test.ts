// lib/util/http-retry.ts, the timeout-and-retry logic of the rollout client, the judge and the
// retrieval client, against a real loopback HTTP server: a 503 is retried and the next reply
// counts, a 400 is final, a timeout (before the headers or in the body) and a refused connection
// are retryable failures that say so, a 429's Retry-After sets the wait, and when the retries are
// spent the caller's error gets every attempt's message; other errors pass through untouched.
import t, { type Test } from 'tap';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { AttemptError, backoffMs, fetchText, retryAfterMs, retryableStatus, withRetries } from '../lib/util/http-retry.js';
import { recordWaits } from './helpers/waits.js';

type Handler = (req: IncomingMessage, res: ServerResponse, n: number) => void;

/** A loopback server calling `h` with each request's 1-based number; `at` holds the arrival times. */
async function loopback(t: Test, h: Handler): Promise<{ url: string; at: number[] }> {
  const at: number[] = [];
  const s = createServer((req, res) => {
    at.push(performance.now());
    req.resume();
    req.on('end', () => h(req, res, at.length));
  });
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', () => r()));
  t.teardown(() => {
    s.closeAllConnections();
    s.close();
  });
  return { url: `http://127.0.0.1:${(s.address() as AddressInfo).port}/x`, at };
}

/** One attempt as the callers make it: a status that is not ok fails, retryable or not. */
async function get(url: string, timeoutMs = 5000): Promise<string> {
  const { res, text } = await fetchText(url, { method: 'GET' }, timeoutMs);
  if (!res.ok)
    throw new AttemptError(
      `HTTP ${res.status}: ${text}`,
      retryableStatus(res.status),
      res.status === 429 ? retryAfterMs(res.headers.get('retry-after')) : undefined,
    );
  return text;
}

class Failed extends Error {
  constructor(
    readonly last: AttemptError,
    readonly errors: string[],
  ) {
    super(errors.join('; '));
  }
}
const fail = (last: AttemptError, errors: string[]) => new Failed(last, [...errors]);

t.test('retryableStatus and backoffMs', async (t) => {
  t.same([200, 400, 401, 404, 408, 422, 429, 500, 502, 503].map(retryableStatus), [
    false,
    false,
    false,
    false,
    true,
    false,
    true,
    true,
    true,
    true,
  ]);
  t.same(
    [1, 2, 3, 4, 5].map((n) => backoffMs(n, 100, 1000)),
    [100, 200, 400, 800, 1000],
  );
  t.same(
    [1, 2, 3].map((n) => backoffMs(n, 250, Infinity)),
    [250, 500, 1000],
  );
});

t.test('a 503 is retried after the delay, then the reply counts', async (t) => {
  const srv = await loopback(t, (_req, res, n) => (n === 1 ? res.writeHead(503).end('busy') : res.end('ok')));
  const waits = recordWaits(t);
  const attempts: number[] = [];
  const retried: Array<[number, string]> = [];
  const r = await withRetries(
    (i) => {
      attempts.push(i);
      return get(srv.url);
    },
    { retries: 3, delayMs: () => 60, onRetry: (n, err) => retried.push([n, err.message]), fail },
  );
  t.equal(r, 'ok');
  t.equal(srv.at.length, 2, 'one retry');
  t.same(attempts, [0, 1]);
  t.same(retried, [[1, 'HTTP 503: busy']], 'onRetry saw the failure');
  t.same(waits, [60], 'waited the delay once, before the retry');
});

t.test("a 400 is final: no retry, the caller's error", async (t) => {
  const srv = await loopback(t, (_req, res) => res.writeHead(400).end('unknown model'));
  let retries = 0;
  const e = await withRetries(() => get(srv.url), { retries: 3, delayMs: () => 1, onRetry: () => retries++, fail }).catch(
    (e: unknown) => e,
  );
  t.type(e, Failed);
  t.same((e as Failed).errors, ['HTTP 400: unknown model']);
  t.equal((e as Failed).last.retry, false);
  t.equal(srv.at.length, 1, 'one request');
  t.equal(retries, 0);
});

t.test('timeouts and a refused connection are retryable failures that say so', async (t) => {
  const silent = await loopback(t, () => {});
  const e1 = await fetchText(silent.url, {}, 150).catch((e: unknown) => e);
  t.type(e1, AttemptError);
  t.match(e1, { message: 'no reply within 150 ms', retry: true }, 'the abort came from the timeout (the message says which path)');
  t.equal(silent.at.length, 1, 'the request reached the server');

  const stalled = await loopback(t, (_req, res) => {
    res.writeHead(200);
    res.write('{"partial": ');
  });
  const e2 = await fetchText(stalled.url, {}, 150).catch((e: unknown) => e);
  t.type(e2, AttemptError);
  t.match(e2, { message: 'the reply did not finish within 150 ms', retry: true }, 'the timeout covers the body');

  const closed = createServer(); // a port nobody listens on any more
  await new Promise<void>((r) => closed.listen(0, '127.0.0.1', () => r()));
  const freePort = (closed.address() as AddressInfo).port;
  await new Promise<void>((r) => closed.close(() => r()));
  const e3 = await fetchText(`http://127.0.0.1:${freePort}/x`, {}, 2000).catch((e: unknown) => e);
  t.type(e3, AttemptError);
  t.match(e3, { message: /^request failed: .*ECONNREFUSED/, retry: true });
});

t.test("a 429's Retry-After sets the wait", async (t) => {
  const srv = await loopback(t, (_req, res, n) =>
    n === 1 ? res.writeHead(429, { 'retry-after': '0.25' }).end('slow down') : res.end('ok'),
  );
  const slept = recordWaits(t);
  const waits: Array<number | undefined> = [];
  const r = await withRetries(() => get(srv.url), {
    retries: 1,
    delayMs: (_n, err) => {
      waits.push(err.waitMs);
      return err.waitMs ?? 1;
    },
    fail,
  });
  t.equal(r, 'ok');
  t.same(waits, [250], 'the header, in ms');
  t.same(slept, [250], 'and waited it');
  t.equal(srv.at.length, 2);

  t.equal(retryAfterMs('2'), 2000);
  t.equal(retryAfterMs('-3'), 0);
  t.equal(retryAfterMs(null), undefined);
  t.equal(retryAfterMs('soon'), undefined);
  const inFive = retryAfterMs(new Date(Date.now() + 5000).toUTCString());
  t.ok(inFive !== undefined && inFive > 3000 && inFive <= 5000, `an HTTP date 5 s ahead (${inFive} ms)`);
  t.equal(retryAfterMs(new Date(Date.now() - 60_000).toUTCString()), 0, 'a date in the past: no wait');
});

t.test("retries spent: the caller's error gets every attempt's message, first to last", async (t) => {
  const srv = await loopback(t, (_req, res, n) => res.writeHead(503).end(`busy ${n}`));
  const delays: number[] = [];
  const e = await withRetries(() => get(srv.url), {
    retries: 2,
    delayMs: (n) => {
      const d = backoffMs(n, 10, 15);
      delays.push(d);
      return d;
    },
    fail,
  }).catch((e: unknown) => e);
  t.type(e, Failed);
  t.same((e as Failed).errors, ['HTTP 503: busy 1', 'HTTP 503: busy 2', 'HTTP 503: busy 3']);
  t.equal((e as Failed).last.retry, true, 'the last failure was retryable: the retries ran out');
  t.same(delays, [10, 15], 'backoff per retry, capped');
  t.equal(srv.at.length, 3, 'retries + 1 requests');
});

t.test('errors other than AttemptError pass through at once', async (t) => {
  const own = new TypeError('a bug');
  let n = 0;
  let failed = false;
  const e = await withRetries(
    async () => {
      n++;
      throw own;
    },
    {
      retries: 3,
      delayMs: () => 1,
      fail: (last, errors) => {
        failed = true;
        return fail(last, errors);
      },
    },
  ).catch((e: unknown) => e);
  t.equal(e, own);
  t.equal(n, 1);
  t.equal(failed, false);
});
