/**
 * EpisodeRunner: drives a batch of episodes through a TextGenerator, a protocol (code or tags) and
 * its environment, and returns per episode the token ids, the loss mask, the sampling log-probs, the
 * answer, the turns, every call made and the conversation.
 *
 * One turn for the whole batch:
 *   1. generate: one `generate` call for every still-active episode (per-episode temperatures as an
 *      array). A row whose generation stopped on a stop string inside a block that is not an action
 *      (`</answer>` printed inside `<python>`, `</search>` inside `<think>`) is resumed in a further
 *      call, with the tokens so far as its prompt, until the turn's token budget is spent;
 *   2. parse each row's text; tokens after the action's closing tag are dropped (a prefix of what
 *      was sampled, so the kept log-probs stay exact); the generated tokens are appended as they
 *      came out of the generator, never re-tokenized (mask 1, their log-probs);
 *   3. answer -> the episode ends; last turn -> it ends without an answer; otherwise the
 *      environment replies (programs run concurrently) and only the reply's text is tokenized and
 *      appended (mask 0), chat-template glue included. A reply may carry the answer itself (a
 *      program's final_answer()): the episode then ends with it, nothing appended.
 * With `prefill`, a turn starts with the runner's text (its tokens appended before the generate call,
 * mask 1 or 0 as `prefill.trained` says, log-prob 0, marked in Episode.forced); with `firstTurn`,
 * turn 1 samples every episode at one fixed temperature and top-p (the reference code-search system).
 * How many generations `maxTurns` allows is the protocol's (EpisodeProtocol.turnsCount): `maxTurns`
 * for `generations` (code), `maxTurns + 1` for `searches` (tags: Search-R1's max_turns rounds of
 * generation and reply, then a last generation that gets no reply).
 * Every episode ends with a reason: `answer`, `max_turns`, or `context` (the next tokens would pass
 * `maxTotalTokens`: a generation reaching the limit, or an environment reply that would not fit
 * with room left to generate).
 *
 * This file holds the batch's turn loop (the generate calls, the environment replies run together);
 * one episode's state and steps are in episode-state.ts, the public types in runner-types.ts.
 */
import { SlmError, describe } from '../errors.js';
import type { GenerateResult } from '../engine/types.js';
import { appendReply, commitTurn, finishEpisode, startEpisode, type EpisodeContext, type Live } from './episode-state.js';
import type { ToolAction } from './protocol.js';
import type { BatchResult, BatchStats, EpisodeRequest, EpisodeRunnerOptions } from './runner-types.js';

export type * from './runner-types.js';
export { tokensThrough } from './episode-state.js';

/** Runs started in this process: part of each episode's cache key, so that batches never share one. */
let runs = 0;

export class EpisodeRunner {
  readonly options: Readonly<EpisodeRunnerOptions>;
  /** What the episodes' steps read: these options, the generations an episode may have, the stop texts. */
  readonly #ctx: EpisodeContext;

  constructor(options: EpisodeRunnerOptions) {
    checkOptions(options);
    this.options = { ...options };
    this.#ctx = {
      options: this.options,
      generations: options.maxTurns + (options.protocol.turnsCount === 'searches' ? 1 : 0),
      stopTexts: options.tokenizer.stopTokenIds.map((id) => options.tokenizer.decode([id])).filter((s) => s.length > 0),
    };
  }

  /** Runs every request to its end; episodes come back in request order. */
  async run(requests: readonly EpisodeRequest[]): Promise<BatchResult> {
    const o = this.options;
    const t0 = performance.now();
    const stats: BatchStats = { generateMs: 0, toolMs: 0, totalMs: 0, generateCalls: 0, rowsPerCall: [], cacheReusedTokens: 0 };
    const live = requests.map((r, i) => startEpisode(this.#ctx, r, i));
    const gen = o.generator;
    if (o.cacheReuse !== false && typeof gen.releaseCaches === 'function') {
      const run = `ep${process.pid}.${++runs}`;
      for (const s of live) s.cacheKey = `${run}.${s.index}`;
    }
    /** Frees the caches of the episodes that ended (all of them with `all`). */
    const release = (all: boolean) => {
      const done = live.filter((s) => s.cacheKey !== undefined && (all || s.finish));
      if (!done.length) return;
      const keys = done.map((s) => s.cacheKey as string);
      for (const s of done) s.cacheKey = undefined;
      gen.releaseCaches?.(keys);
    };
    try {
      for (let turn = 1; turn <= this.#ctx.generations; turn++) {
        const active = live.filter((s) => !s.finish);
        if (!active.length) break;
        await this.#generateTurn(active, turn, stats);
        const pending: Array<{ s: Live; action: ToolAction }> = [];
        for (const s of active) {
          if (s.finish) continue; // ended before generating (a prefill that did not fit)
          const action = commitTurn(this.#ctx, s, turn);
          if (action) pending.push({ s, action });
        }
        release(false);
        await this.#respond(pending, turn, stats);
        release(false);
        o.onTurn?.({ turn, active: live.filter((s) => !s.finish).length, finished: live.filter((s) => s.finish).length });
      }
    } finally {
      release(true);
    }
    for (const s of live) s.finish ??= 'max_turns';
    stats.totalMs = performance.now() - t0;
    return { episodes: live.map((s) => finishEpisode(s)), stats };
  }

  /** Generation of one turn for every active episode, with resumes (see the module comment). */
  async #generateTurn(active: Live[], turn: number, stats: BatchStats): Promise<void> {
    const o = this.options;
    // The turn's prefill (options.prefill): its tokens start the turn, the model goes on after them.
    const prefill = turn === 1 ? o.prefill?.first : turn === this.#ctx.generations ? o.prefill?.final : undefined;
    const forced = prefill ? o.tokenizer.encode(prefill) : [];
    for (const s of active) {
      s.turnIds = [...forced];
      s.turnLogprobs = forced.map(() => 0);
      s.turnForced = forced.length;
      s.turnFinish = 'length';
      s.budget = o.maxNewTokens;
      s.resumes = 0;
    }
    // An episode whose prefill leaves no room to generate ends here, as one whose reply would not fit.
    let rows = active.filter((live) => {
      if (live.ids.length + forced.length < o.maxTotalTokens) return true;
      live.turnIds = [];
      live.turnLogprobs = [];
      live.turnForced = 0;
      live.finish = 'context';
      return false;
    });
    // Turn 1 at the options' fixed sampling (options.firstTurn), later turns at the episode's own.
    const first = turn === 1 ? o.firstTurn : undefined;
    for (let round = 0; rows.length; round++) {
      const limits = rows.map((s) => Math.min(s.budget, o.maxTotalTokens - s.ids.length - s.turnIds.length));
      const maxNewTokens = Math.max(...limits);
      // A generate call's seeds, from the runner's (or an episode's) seed, the turn and the round.
      const callSeed = (seed: number) => (seed * 1000003 + turn * 7919 + round * 131) >>> 0;
      const t0 = performance.now();
      const res = await o.generator.generate({
        prompts: rows.map((s) => Int32Array.from(s.turnIds.length ? s.ids.concat(s.turnIds) : s.ids)),
        maxNewTokens,
        temperature: rows.map((s) => first?.temperature ?? s.temperature),
        // per episode where an episode sets its own (GRPO draws it per rollout), else the runner's
        topP: first ? first.topP : rows.some((s) => s.topP !== undefined) ? rows.map((s) => s.topP ?? o.topP ?? 1) : o.topP,
        topK: o.topK,
        seed: callSeed(o.seed ?? 0),
        ...(rows.every((s) => s.seed !== undefined) ? { rowSeeds: rows.map((s) => callSeed(s.seed as number)) } : {}),
        stopTokenIds: o.tokenizer.stopTokenIds,
        stopStrings: [...o.protocol.stopStrings],
        ...(rows.some((s) => s.cacheKey !== undefined) ? { cacheKeys: rows.map((s) => s.cacheKey ?? null) } : {}),
      });
      const ms = performance.now() - t0;
      stats.generateMs += ms;
      stats.generateCalls++;
      stats.rowsPerCall.push(rows.length);
      checkResult(res, rows.length);
      stats.cacheReusedTokens += res.cacheReusedTokens ?? 0;
      const again: Live[] = [];
      rows.forEach((live, i) => {
        live.generateMs += ms;
        let toks = res.tokens[i];
        let lps = res.logprobs[i];
        let finish = res.finishReasons[i];
        if (toks.length > limits[i]) {
          // The row's own limit is below the batch's maxNewTokens: what came after it was never "generated" for this row.
          toks = toks.subarray(0, limits[i]);
          lps = lps.subarray(0, limits[i]);
          finish = 'length';
        }
        for (let k = 0; k < toks.length; k++) {
          live.turnIds.push(toks[k]);
          live.turnLogprobs.push(lps[k]);
        }
        live.budget -= toks.length;
        live.turnFinish = finish;
        const room = o.maxTotalTokens - live.ids.length - live.turnIds.length;
        if (finish !== 'stop_string' || toks.length === 0 || live.budget <= 0 || room <= 0) return;
        const action = o.protocol.parse(o.tokenizer.decode(live.turnIds));
        if (action.kind === 'none' && action.reason === 'unclosed') {
          live.resumes++;
          again.push(live);
        }
      });
      rows = again;
    }
  }

  /** Environment replies for every episode that needs one, run concurrently, then appended. */
  async #respond(pending: Array<{ s: Live; action: ToolAction }>, turn: number, stats: BatchStats): Promise<void> {
    if (!pending.length) return;
    const o = this.options;
    const t0 = performance.now();
    const replies = await Promise.all(
      pending.map(({ s, action }) =>
        o.protocol.respond(action, {
          turn,
          maxTurns: this.#ctx.generations,
          finishReason: s.turnFinish,
          maxNewTokens: o.maxNewTokens,
          question: s.question,
        }),
      ),
    );
    stats.toolMs += performance.now() - t0;
    pending.forEach(({ s }, i) => appendReply(this.#ctx, s, replies[i]));
  }
}

function checkOptions(opts: EpisodeRunnerOptions): void {
  if (!opts || typeof opts !== 'object')
    throw new SlmError('ARGUMENT_INVALID', `Expected EpisodeRunner options, but found ${describe(opts)}.`);
  for (const [k, what] of [
    ['generator', 'a TextGenerator (generate(req))'],
    ['tokenizer', 'a tokenizer (encode, decode, stopTokenIds)'],
    ['formatter', 'a prompt formatter (prompt, continuation), e.g. ChatFormatter.forModel(dir)'],
    ['protocol', 'a protocol from codeProtocol() or tagsProtocol()'],
  ] as const) {
    if (!opts[k] || typeof opts[k] !== 'object')
      throw new SlmError('ARGUMENT_INVALID', `Expected option "${k}" of EpisodeRunner to be ${what}, but found ${describe(opts[k])}.`);
  }
  for (const k of ['maxTurns', 'maxNewTokens', 'maxTotalTokens'] as const) {
    if (!Number.isInteger(opts[k]) || opts[k] < 1)
      throw new SlmError(
        'ARGUMENT_INVALID',
        `Expected option "${k}" of EpisodeRunner to be a positive integer, but found ${describe(opts[k])}.`,
      );
  }
  if (opts.prefill !== undefined) {
    const p = opts.prefill;
    if (!p || typeof p !== 'object')
      throw new SlmError(
        'ARGUMENT_INVALID',
        `Expected option "prefill" of EpisodeRunner to be { first?, final?, trained? }, but found ${describe(p)}.`,
      );
    for (const k of ['first', 'final'] as const)
      if (p[k] !== undefined && !(typeof p[k] === 'string' && p[k] !== ''))
        throw new SlmError(
          'ARGUMENT_INVALID',
          `Expected prefill.${k} of EpisodeRunner to be a non-empty string, but found ${describe(p[k])}.`,
        );
    if (p.trained !== undefined && typeof p.trained !== 'boolean')
      throw new SlmError(
        'ARGUMENT_INVALID',
        `Expected prefill.trained of EpisodeRunner to be a boolean, but found ${describe(p.trained)}.`,
      );
  }
  if (opts.firstTurn !== undefined) {
    const f = opts.firstTurn;
    if (!f || typeof f.temperature !== 'number' || !(f.temperature >= 0) || typeof f.topP !== 'number' || !(f.topP > 0 && f.topP <= 1))
      throw new SlmError(
        'ARGUMENT_INVALID',
        `Expected option "firstTurn" of EpisodeRunner to be { temperature >= 0, topP in (0, 1] }, but found ${describe(f)}.`,
      );
  }
}

function checkResult(res: GenerateResult, rows: number): void {
  const bad = !res || !Array.isArray(res.tokens) || !Array.isArray(res.logprobs) || !Array.isArray(res.finishReasons);
  if (bad || res.tokens.length !== rows || res.logprobs.length !== rows || res.finishReasons.length !== rows) {
    throw new SlmError(
      'PROTOCOL_ERROR',
      `Expected the generator to return tokens, logprobs and finishReasons for each of the ${rows} rows it was sent, but found ${bad ? 'a malformed result' : `${res.tokens.length}/${res.logprobs.length}/${res.finishReasons.length}`}.`,
    );
  }
  res.tokens.forEach((t, i) => {
    if (res.logprobs[i].length !== t.length) {
      throw new SlmError(
        'PROTOCOL_ERROR',
        `Expected one log-prob per generated token, but row ${i} has ${t.length} tokens and ${res.logprobs[i].length} log-probs.`,
      );
    }
  });
}
