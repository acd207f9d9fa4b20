/**
 * HTTP requests with a per-attempt timeout, retried with exponential backoff: what the rollout
 * client (engine/openai-rollout.ts), the judge (rewards/judge-backends.ts) and the retrieval client
 * (retrieval/http.ts) share. An attempt that fails throws AttemptError, whose `retry` says whether
 * another attempt may succeed (connection errors, timeouts, 408, 429, 5xx); withRetries runs
 * attempts until one succeeds or a failure is final, then throws the caller's own error, built from
 * every attempt's message (each caller has its error codes and hints).
 */

/** A failure of one attempt; `retry`: another attempt may succeed; `waitMs`: the wait the server asked for. */
export class AttemptError extends Error {
  constructor(
    message: string,
    readonly retry: boolean,
    readonly waitMs?: number,
  ) {
    super(message);
  }
}

/** Statuses worth another attempt: request timeout, too many requests, server errors. */
export function retryableStatus(status: number): boolean {
  return status === 408 || status === 429 || status >= 500;
}

/** `Retry-After` in milliseconds (seconds or an HTTP date), or undefined. */
export function retryAfterMs(h: string | null): number | undefined {
  if (!h) return undefined;
  const s = Number(h);
  if (Number.isFinite(s)) return Math.max(0, s * 1000);
  const t = Date.parse(h);
  return Number.isFinite(t) ? Math.max(0, t - Date.now()) : undefined;
}

/** Backoff before retry `attempt` (1-based): base · 2^(attempt-1), at most `max`. */
export function backoffMs(attempt: number, base: number, max: number): number {
  return Math.min(max, base * 2 ** (attempt - 1));
}

/** What a fetch failure says: undici puts the socket's error ("connect ECONNREFUSED ...") in `cause`. */
function reason(e: unknown): string {
  const err = e as Error & { cause?: { message?: string; code?: string } };
  return err.cause?.message || err.cause?.code || err.message;
}

/**
 * One request (init without a signal) whose timeout covers the headers and the body. Any status
 * resolves; a connection error or a timeout throws a retryable AttemptError saying which.
 */
export async function fetchText(url: string, init: RequestInit, timeoutMs: number): Promise<{ res: Response; text: string }> {
  const ac = new AbortController();
  const timer = setTimeout(() => ac.abort(), timeoutMs);
  const ms = Math.round(timeoutMs); // 1.1 s · 1000 is 1100.0000000000002
  try {
    let res: Response;
    try {
      res = await fetch(url, { ...init, signal: ac.signal });
    } catch (e) {
      throw new AttemptError(ac.signal.aborted ? `no reply within ${ms} ms` : `request failed: ${reason(e)}`, true);
    }
    try {
      return { res, text: await res.text() };
    } catch (e) {
      throw new AttemptError(
        ac.signal.aborted ? `the reply did not finish within ${ms} ms` : `reading the reply failed: ${reason(e)}`,
        true,
      );
    }
  } finally {
    clearTimeout(timer);
  }
}

/**
 * How every retry loop here waits between attempts. Tests replace `sleep` to record the waits and
 * count attempts instead of measuring wall-clock time; nothing else should touch it.
 */
export const retryClock = { sleep: (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms)) };

export interface RetryOptions {
  /** Retries after the first attempt. */
  retries: number;
  /** The wait before retry `n` (1-based) after the failure `err`. */
  delayMs: (n: number, err: AttemptError) => number;
  /** Called before each retry's wait (counters). */
  onRetry?: (n: number, err: AttemptError) => void;
  /** The error to throw once a failure is final (not retryable, or no retries left): from the last failure and every attempt's message, first to last. */
  fail: (last: AttemptError, errors: string[]) => Error;
}

/**
 * Runs `attempt(i)` (i = 0, 1, ...) until it resolves or throws a final AttemptError, waiting
 * `delayMs` between attempts. Other errors (the caller's own SlmError, a bug) pass through at once.
 */
export async function withRetries<T>(attempt: (i: number) => Promise<T>, opts: RetryOptions): Promise<T> {
  const errors: string[] = [];
  for (let i = 0; ; i++) {
    try {
      return await attempt(i);
    } catch (e) {
      if (!(e instanceof AttemptError)) throw e;
      errors.push(e.message);
      if (!e.retry || i >= opts.retries) throw opts.fail(e, errors);
      opts.onRetry?.(i + 1, e);
      await retryClock.sleep(opts.delayMs(i + 1, e));
    }
  }
}
