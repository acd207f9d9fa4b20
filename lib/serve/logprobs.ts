/**
 * OpenAI log-prob objects of a row's tokens [from, to), as the server returns them: chat's
 * `{content: [...]}` and completions' legacy `{tokens, token_logprobs, top_logprobs, text_offset}`
 * (token strings, or "token_id:N" with `return_tokens_as_token_ids`).
 */
import type { HfTokenizer } from '../model/tokenizer.js';
import type { Job } from './job.js';
import type { Parsed } from './request.js';

export class LogprobFormat {
  private bytes: Uint8Array[] | null = null;

  constructor(private readonly tokenizer: HfTokenizer) {}

  private tokenBytes(id: number): number[] {
    this.bytes ??= this.tokenizer.tokenBytes();
    return Array.from(this.bytes[id] ?? []);
  }

  private tokenString(id: number, asIds: boolean): string {
    if (asIds) return `token_id:${id}`;
    return id < this.tokenizer.vocabSize ? this.tokenizer.decode([id]) : '';
  }

  /** Chat log-probs of tokens [from, to): {content: [{token, logprob, bytes, top_logprobs}]}. */
  chat(job: Job, from: number, to: number, parsed: Parsed) {
    const entry = (id: number, lp: number) => ({
      token: this.tokenString(id, parsed.asIds),
      logprob: Math.max(lp, -9999),
      bytes: this.tokenBytes(id),
    });
    const content = [];
    for (let t = from; t < to; t++) {
      const top = job.top[t];
      const alts = [];
      for (let k = 0; k < parsed.s.topN && top; k++) alts.push(entry(top.ids[k], top.logprobs[k]));
      content.push({ ...entry(job.ids[t], job.logprobs[t]), top_logprobs: alts });
    }
    return { content };
  }

  /**
   * Completions log-probs of tokens [from, to): {tokens, token_logprobs, top_logprobs (the N best
   * and the sampled token, as OpenAI's legacy API), text_offset}, and the text offset of token `to`.
   */
  text(job: Job, from: number, to: number, offset: number, parsed: Parsed) {
    const tokens: string[] = [];
    const tokenLogprobs: number[] = [];
    const tops: Array<Record<string, number>> = [];
    const offsets: number[] = [];
    for (let t = from; t < to; t++) {
      const id = job.ids[t];
      const s = this.tokenString(id, parsed.asIds);
      tokens.push(s);
      tokenLogprobs.push(Math.max(job.logprobs[t], -9999));
      const dict: Record<string, number> = {};
      const top = job.top[t];
      for (let k = 0; k < parsed.s.topN && top; k++) {
        const key = this.tokenString(top.ids[k], parsed.asIds);
        if (!(key in dict)) dict[key] = Math.max(top.logprobs[k], -9999);
      }
      if (!(s in dict)) dict[s] = Math.max(job.logprobs[t], -9999);
      tops.push(dict);
      offsets.push(offset);
      offset += parsed.asIds ? this.tokenString(id, false).length : s.length;
    }
    return { logprobs: { tokens, token_logprobs: tokenLogprobs, top_logprobs: tops, text_offset: offsets }, next: offset };
  }
}
