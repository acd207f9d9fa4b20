/**
 * Bounding concurrency: the judge and the rollout client run at most `limit` requests at once per
 * endpoint; the rest wait their turn in order.
 */
/** A counting semaphore: `run(fn)` waits until fewer than `limit` runs are in flight. */
export class Limiter {
  #active = 0;
  readonly #waiting: Array<() => void> = [];
  constructor(readonly limit: number) {}

  async run<T>(fn: () => Promise<T>): Promise<T> {
    if (this.#active >= this.limit) await new Promise<void>((resolve) => this.#waiting.push(resolve));
    else this.#active++;
    try {
      return await fn();
    } finally {
      const next = this.#waiting.shift();
      if (next)
        next(); // the slot passes to the next waiter
      else this.#active--;
    }
  }
}
