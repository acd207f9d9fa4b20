/**
 * A record of a long-running server's recent events that does not grow without bound: the last
 * `keep` entries (at least), and the count of every entry ever pushed. A server answering for days
 * makes millions of generate calls; an array of them all was a slow leak.
 */
export class History<T> {
  private items: T[] = [];
  private dropped = 0;

  constructor(private readonly keep = 1024) {
    if (!Number.isInteger(keep) || keep < 1) throw new RangeError(`History keeps at least one entry, found ${keep}`);
  }

  push(x: T): void {
    this.items.push(x);
    // Drop the older half at 2 x keep: amortised O(1) per push, at least `keep` retained.
    if (this.items.length >= 2 * this.keep) {
      this.dropped += this.items.length - this.keep;
      this.items = this.items.slice(-this.keep);
    }
  }

  /** Every entry ever pushed, retained or not. */
  get count(): number {
    return this.dropped + this.items.length;
  }

  /** The retained entries pushed after the first `n` (those still kept: the newest at least `keep`). */
  since(n: number): T[] {
    return this.items.slice(Math.max(0, n - this.dropped));
  }

  /** The newest entry. */
  get last(): T | undefined {
    return this.items[this.items.length - 1];
  }
}
