/**
 * Text of a generated row as the OpenAI-compatible server returns it, streamed or not: incremental
 * detokenization (vLLM's prefix/read-offset scheme, holding back text that ends in an incomplete
 * UTF-8 character) and stop strings (the text ends where the earliest stop string starts, or after
 * it with `include_stop_str_in_output`). While streaming, text that could be the start of a stop
 * string is held back until the following tokens show it is not, so a stop string never reaches the
 * client in part. The streamed pieces add up to the non-streamed text: both end with `finish()`,
 * which decodes the whole row once.
 */

/** Where the text ends for these stop strings (the earliest match at or after `from`; -1: none). */
function stopCut(text: string, stops: readonly string[], keepStop: boolean, from = 0): number {
  let best = -1;
  let end = -1;
  for (const s of stops) {
    if (!s) continue;
    const at = text.indexOf(s, from);
    if (at >= 0 && (best < 0 || at < best)) {
      best = at;
      end = keepStop ? at + s.length : at;
    }
  }
  return end;
}

/** Length of the longest end of `text` that is the beginning (not the whole) of a stop string. */
function stopPrefixLength(text: string, stops: readonly string[]): number {
  let hold = 0;
  for (const s of stops) {
    for (let n = Math.min(s.length - 1, text.length); n > hold; n--) {
      if (text.endsWith(s.slice(0, n))) {
        hold = n;
        break;
      }
    }
  }
  return hold;
}

export class IncrementalText {
  private ids: number[] = [];
  private prefixOffset = 0;
  private readOffset = 0;
  /** The decoded text so far (complete characters only). */
  private text = '';
  /** How much of `text` has been handed out. */
  private sent = 0;
  private stopped = false;
  /** No stop string starts before this offset of `text` (it was searched). */
  private searched = 0;
  private readonly longestStop: number;
  /** The streamed pieces did not add up to the final text (a decoder that is not prefix-stable). */
  mismatch = false;

  constructor(
    private readonly decode: (ids: number[]) => string,
    private readonly stops: readonly string[],
    private readonly keepStop: boolean,
  ) {
    this.longestStop = Math.max(0, ...stops.map((x) => x.length));
  }

  /** Adds a token of the text. */
  push(id: number): void {
    this.ids.push(id);
    const prefix = this.decode(this.ids.slice(this.prefixOffset, this.readOffset));
    const next = this.decode(this.ids.slice(this.prefixOffset));
    if (next.length > prefix.length && !next.endsWith('\uFFFD')) {
      this.text += next.slice(prefix.length);
      this.prefixOffset = this.readOffset;
      this.readOffset = this.ids.length;
    }
  }

  /** The text that can be sent now: never retracted, never part of a stop string. */
  take(): string {
    if (this.stopped) return '';
    if (stopCut(this.text, this.stops, this.keepStop, this.searched) >= 0) {
      // The row ends on this token (the engine stops on stop strings); the final decode decides.
      this.stopped = true;
      return '';
    }
    // A stop string found later has to end in text added later.
    this.searched = Math.max(0, this.text.length - this.longestStop + 1);
    const end = this.text.length - stopPrefixLength(this.text, this.stops);
    if (end <= this.sent) return '';
    const piece = this.text.slice(this.sent, end);
    this.sent = end;
    return piece;
  }

  /**
   * The row's whole text (the ids of the text decoded at once, cut at the stop string), what of it
   * was not sent yet, and whether a stop string cut it.
   */
  finish(ids: number[]): { text: string; rest: string; cut: boolean } {
    const full = this.decode(ids);
    const at = stopCut(full, this.stops, this.keepStop);
    const text = at >= 0 ? full.slice(0, at) : full;
    const sent = this.text.slice(0, this.sent);
    if (!text.startsWith(sent)) this.mismatch = true;
    this.sent = this.text.length;
    this.stopped = true;
    return { text, rest: text.slice(Math.min(sent.length, text.length)), cut: at >= 0 };
  }
}
