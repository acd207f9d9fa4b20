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
 * How many generations `maxTurns` allows is the protocol's (EpisodeProtocol.turnsCount): `maxTurns`
 * for `generations` (code), `maxTurns + 1` for `searches` (tags: Search-R1's max_turns rounds of
 * generation and reply, then a last generation that gets no reply).
 * Every episode ends with a reason: `answer`, `max_turns`, or `context` (the next tokens would pass
 * `maxTotalTokens`: a generation reaching the limit, or an environment reply that would not fit
 * with room left to generate).
 */
import { SlmError, describe } from '../errors.js';
import type { GenerateResult, TextGenerator } from '../engine/types.js';
import type { ChatMessage, Tokenizer } from '../model/tokenizer-types.js';
import type { EnvReply, EpisodeCall, EpisodeProtocol, FinishReason, ProgramSummary, ToolAction, TurnAction } from './protocol.js';

/** What the runner needs to build prompts (lib/model/chat.ts's ChatFormatter has it). */
export interface PromptFormatter {
  /** The prompt for the first assistant turn (generation prompt included). */
  prompt(messages: readonly ChatMessage[]): string;
  /**
   * The exact text to append after the assistant's generated text (`history` ends with it, as
   * decoded, stop token text included) so that the sequence becomes the prompt for the next turn.
   */
  continuation(history: readonly ChatMessage[], next: readonly ChatMessage[], opts?: { strict?: boolean }): string;
}

export type RunnerTokenizer = Pick<Tokenizer, 'encode' | 'decode' | 'stopTokenIds'>;

export interface EpisodeRunnerOptions {
  generator: TextGenerator;
  tokenizer: RunnerTokenizer;
  formatter: PromptFormatter;
  protocol: EpisodeProtocol;
  /**
   * Turns per episode, counted as the protocol says (EpisodeProtocol.turnsCount): assistant turns,
   * the answer turn included (`generations`, the default), or turns that get a reply, the final
   * answer turn not included (`searches`, Search-R1's max_turns). The last turn must answer.
   */
  maxTurns: number;
  /** Tokens one turn may generate. */
  maxNewTokens: number;
  /** Limit on an episode's whole sequence (prompt + every turn + every reply). */
  maxTotalTokens: number;
  /** Default temperature of episodes that do not set one (default 1). */
  temperature?: number;
  topP?: number;
  topK?: number;
  /** Base seed; each generate call gets a seed derived from it, the turn and the round. */
  seed?: number;
  /**
   * Require the chat template to render earlier turns unchanged when a message is added (see
   * ChatFormatter.continuation). Default false: the generated tokens stay as generated and the
   * template's text after the turn is appended, even where the template would re-render history.
   */
  strictTemplate?: boolean;
  /**
   * Multi-turn KV-cache reuse (default true, where the generator keeps caches: releaseCaches): each
   * episode's rows carry a cache key, so a turn computes only the tokens appended since the last
   * (the reply, template text) instead of re-prefilling the conversation; an episode's cache is
   * released when it ends, and every one when the batch ends. Episodes are the same either way.
   */
  cacheReuse?: boolean;
  /** Called after each turn with the number of episodes still active. */
  onTurn?: (info: { turn: number; active: number; finished: number }) => void;
}

export interface EpisodeRequest {
  question: string;
  /** Sampling temperature of this episode (default: the runner's). */
  temperature?: number;
  /** Top-p of this episode (default: the runner's). */
  topP?: number;
  /** Start from these messages instead of the protocol's (e.g. a custom system prompt). */
  messages?: ChatMessage[];
  /**
   * The question row's own chat prompt (Search-R1's processed files carry one): given to the
   * protocol, which starts from it (tags) or builds its own (code, direct).
   */
  prompt?: readonly ChatMessage[];
  /**
   * This episode's own seed. When every request of a batch has one, each generate call gives each
   * row a seed derived from it (and the turn and round), so an episode samples the same tokens
   * whatever else is in its batch: a data-parallel rank's share equals the same episodes of one process.
   */
  seed?: number;
}

export type EpisodeFinish = 'answer' | 'max_turns' | 'context';

/** One turn, as recorded for logs and trajectories. */
export interface TurnRecord {
  turn: number;
  action: TurnAction['kind'];
  /** Why a turn had no action (`no_action`, `unclosed`, `empty_code`, `empty_query`), and the open block. */
  reason?: string;
  open?: string;
  finishReason: FinishReason;
  /** Tokens of the turn kept in the sequence, and tokens sampled after the action and dropped. */
  generatedTokens: number;
  droppedTokens: number;
  /** Extra generate calls after a stop string matched inside a non-action block. */
  resumes: number;
  /** Tokens of the environment's reply appended after the turn (0 when none). */
  envTokens: number;
  program?: ProgramSummary;
}

/** A piece of the sequence, in order: text generated by the model, or appended by the runner. */
export interface Segment {
  source: 'prompt' | 'model' | 'env';
  text: string;
  tokens: number;
}

export interface Episode {
  /** Position in the batch. */
  index: number;
  question: string;
  /** Prompt + every turn + every reply. */
  ids: Int32Array;
  /** 1 exactly on tokens the model generated. */
  lossMask: Uint8Array;
  /** Sampling log-probs aligned with ids (0 where the mask is 0). */
  logprobs: Float32Array;
  promptTokens: number;
  temperature: number;
  /** The answer (possibly empty), or null when the episode ended without one. */
  answer: string | null;
  finish: EpisodeFinish;
  /** Assistant turns generated. */
  turns: number;
  calls: EpisodeCall[];
  /** The conversation as chat messages (stop-token text removed), for trajectories JSONL. */
  messages: ChatMessage[];
  steps: TurnRecord[];
  segments: Segment[];
  timings: {
    /** Wall time of the generate calls this episode took part in (shared with the batch). */
    generateMs: number;
    /** Wall time of its environment replies (programs, searches). */
    toolMs: number;
  };
  /** What a trainer writes to trajectories.jsonl (lib/train's TrainEpisode.record). */
  record: { finish: EpisodeFinish; messages: ChatMessage[]; calls: EpisodeCall[]; steps: TurnRecord[] };
}

export interface BatchStats {
  generateMs: number;
  toolMs: number;
  totalMs: number;
  generateCalls: number;
  /** Rows sent per generate call, in order (shows only active episodes were sent). */
  rowsPerCall: number[];
  /** Prompt tokens the generator took from episode caches instead of computing (0 without reuse). */
  cacheReusedTokens: number;
}

export interface BatchResult {
  episodes: Episode[];
  stats: BatchStats;
}

/** State of one episode while the batch runs. */
interface Live {
  index: number;
  /** The key of its KV cache in the generator (cache reuse), until released. */
  cacheKey?: string;
  seed?: number;
  question: string;
  temperature: number;
  topP?: number;
  ids: number[];
  mask: number[];
  logprobs: number[];
  promptTokens: number;
  messages: ChatMessage[];
  /** inline protocols: the assistant text so far (all turns and replies). */
  inlineText: string;
  segments: Segment[];
  calls: EpisodeCall[];
  steps: TurnRecord[];
  turns: number;
  answer: string | null;
  finish?: EpisodeFinish;
  generateMs: number;
  toolMs: number;
  // the turn being generated
  turnIds: number[];
  turnLogprobs: number[];
  turnFinish: FinishReason;
  budget: number;
  resumes: number;
}

/** Runs started in this process: part of each episode's cache key, so that batches never share one. */
let runs = 0;

export class EpisodeRunner {
  readonly options: Readonly<EpisodeRunnerOptions>;
  readonly #stopTexts: string[];
  /** Generations an episode may have, the last one (which gets no reply) included. */
  readonly #generations: number;

  constructor(options: EpisodeRunnerOptions) {
    checkOptions(options);
    this.options = { ...options };
    this.#generations = options.maxTurns + (options.protocol.turnsCount === 'searches' ? 1 : 0);
    this.#stopTexts = options.tokenizer.stopTokenIds.map((id) => options.tokenizer.decode([id])).filter((s) => s.length > 0);
  }

  /** Runs every request to its end; episodes come back in request order. */
  async run(requests: readonly EpisodeRequest[]): Promise<BatchResult> {
    const o = this.options;
    const t0 = performance.now();
    const stats: BatchStats = { generateMs: 0, toolMs: 0, totalMs: 0, generateCalls: 0, rowsPerCall: [], cacheReusedTokens: 0 };
    const live = requests.map((r, i) => this.#start(r, i));
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
      for (let turn = 1; turn <= this.#generations; turn++) {
        const active = live.filter((s) => !s.finish);
        if (!active.length) break;
        await this.#generateTurn(active, turn, stats);
        const pending: Array<{ s: Live; action: ToolAction }> = [];
        for (const s of active) {
          const action = this.#commitTurn(s, turn);
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
    return { episodes: live.map((s) => this.#finish(s)), stats };
  }

  #start(r: EpisodeRequest, index: number): Live {
    const o = this.options;
    if (!r || typeof r.question !== 'string') throw new SlmError('ARGUMENT_INVALID', `Expected episode request ${index} to have a string "question", but found ${describe(r?.question)}.`);
    const temperature = r.temperature ?? o.temperature ?? 1;
    if (!(typeof temperature === 'number' && temperature >= 0)) {
      throw new SlmError('ARGUMENT_INVALID', `Expected the temperature of episode request ${index} to be a number >= 0, but found ${describe(temperature)}.`);
    }
    if (r.topP !== undefined && !(typeof r.topP === 'number' && r.topP > 0 && r.topP <= 1)) {
      throw new SlmError('ARGUMENT_INVALID', `Expected the topP of episode request ${index} to be a number in (0, 1], but found ${describe(r.topP)}.`);
    }
    if (r.prompt !== undefined && !(Array.isArray(r.prompt) && r.prompt.every((m) => m && typeof m.role === 'string' && typeof m.content === 'string'))) {
      throw new SlmError('ARGUMENT_INVALID', `Expected the prompt of episode request ${index} to be a list of chat messages {role, content}, but found ${describe(r.prompt)}.`);
    }
    const messages = r.messages ? r.messages.map((m) => ({ ...m })) : o.protocol.initialMessages(r.question, this.#generations, r.prompt);
    const text = o.formatter.prompt(messages);
    const ids = o.tokenizer.encode(text);
    const s: Live = {
      index,
      seed: r.seed,
      question: r.question,
      temperature,
      ...(r.topP !== undefined ? { topP: r.topP } : {}),
      ids: [...ids],
      mask: new Array(ids.length).fill(0),
      logprobs: new Array(ids.length).fill(0),
      promptTokens: ids.length,
      messages,
      inlineText: '',
      segments: [{ source: 'prompt', text, tokens: ids.length }],
      calls: [],
      steps: [],
      turns: 0,
      answer: null,
      generateMs: 0,
      toolMs: 0,
      turnIds: [],
      turnLogprobs: [],
      turnFinish: 'length',
      budget: 0,
      resumes: 0,
    };
    if (ids.length === 0) throw new SlmError('ARGUMENT_INVALID', `Expected the prompt of episode request ${index} to encode to at least one token, but it is empty.`);
    if (ids.length >= o.maxTotalTokens) s.finish = 'context';
    return s;
  }

  /** Generation of one turn for every active episode, with resumes (see the module comment). */
  async #generateTurn(active: Live[], turn: number, stats: BatchStats): Promise<void> {
    const o = this.options;
    for (const s of active) {
      s.turnIds = [];
      s.turnLogprobs = [];
      s.turnFinish = 'length';
      s.budget = o.maxNewTokens;
      s.resumes = 0;
    }
    let rows = active;
    for (let round = 0; rows.length; round++) {
      const limits = rows.map((s) => Math.min(s.budget, o.maxTotalTokens - s.ids.length - s.turnIds.length));
      const maxNewTokens = Math.max(...limits);
      // A generate call's seeds, from the runner's (or an episode's) seed, the turn and the round.
      const callSeed = (seed: number) => (seed * 1000003 + turn * 7919 + round * 131) >>> 0;
      const t0 = performance.now();
      const res = await o.generator.generate({
        prompts: rows.map((s) => Int32Array.from(s.turnIds.length ? s.ids.concat(s.turnIds) : s.ids)),
        maxNewTokens,
        temperature: rows.map((s) => s.temperature),
        // per episode where an episode sets its own (GRPO draws it per rollout), else the runner's
        topP: rows.some((s) => s.topP !== undefined) ? rows.map((s) => s.topP ?? o.topP ?? 1) : o.topP,
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
      rows.forEach((s, i) => {
        s.generateMs += ms;
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
          s.turnIds.push(toks[k]);
          s.turnLogprobs.push(lps[k]);
        }
        s.budget -= toks.length;
        s.turnFinish = finish;
        const room = o.maxTotalTokens - s.ids.length - s.turnIds.length;
        if (finish !== 'stop_string' || toks.length === 0 || s.budget <= 0 || room <= 0) return;
        const action = o.protocol.parse(o.tokenizer.decode(s.turnIds));
        if (action.kind === 'none' && action.reason === 'unclosed') {
          s.resumes++;
          again.push(s);
        }
      });
      rows = again;
    }
  }

  /** Parses the generated turn, appends its tokens; returns the action the environment must answer, if any. */
  #commitTurn(s: Live, turn: number): ToolAction | undefined {
    const o = this.options;
    let text = o.tokenizer.decode(s.turnIds);
    const action = o.protocol.parse(text);
    let dropped = 0;
    if (action.kind !== 'none') {
      const keep = tokensThrough(o.tokenizer, s.turnIds, text, action.end);
      if (keep < s.turnIds.length) {
        dropped = s.turnIds.length - keep;
        s.turnIds.length = keep;
        s.turnLogprobs.length = keep;
        text = o.tokenizer.decode(s.turnIds);
        if (s.turnFinish !== 'stop_string') s.turnFinish = 'stop_string';
      }
    }
    for (let k = 0; k < s.turnIds.length; k++) {
      s.ids.push(s.turnIds[k]);
      s.mask.push(1);
      s.logprobs.push(s.turnLogprobs[k]);
    }
    s.turns = turn;
    s.segments.push({ source: 'model', text, tokens: s.turnIds.length });
    this.#addAssistantText(s, text);
    s.steps.push({
      turn,
      action: action.kind,
      ...(action.kind === 'none' ? { reason: action.reason, ...(action.open ? { open: action.open } : {}) } : {}),
      finishReason: s.turnFinish,
      generatedTokens: s.turnIds.length,
      droppedTokens: dropped,
      resumes: s.resumes,
      envTokens: 0,
    });
    if (action.kind === 'answer') {
      s.answer = action.answer;
      s.finish = 'answer';
      return undefined;
    }
    if (s.ids.length >= o.maxTotalTokens) {
      s.finish = 'context';
      return undefined;
    }
    if (turn >= this.#generations) {
      s.finish = 'max_turns';
      return undefined;
    }
    return action;
  }

  /** Environment replies for every episode that needs one, run concurrently, then appended. */
  async #respond(pending: Array<{ s: Live; action: ToolAction }>, turn: number, stats: BatchStats): Promise<void> {
    if (!pending.length) return;
    const o = this.options;
    const t0 = performance.now();
    const replies = await Promise.all(
      pending.map(({ s, action }) =>
        o.protocol.respond(action, { turn, maxTurns: this.#generations, finishReason: s.turnFinish, maxNewTokens: o.maxNewTokens, question: s.question }),
      ),
    );
    stats.toolMs += performance.now() - t0;
    pending.forEach(({ s }, i) => this.#appendReply(s, replies[i]));
  }

  #appendReply(s: Live, reply: EnvReply): void {
    const o = this.options;
    const step = s.steps[s.steps.length - 1];
    s.calls.push(...reply.calls);
    s.toolMs += reply.toolMs;
    if (reply.program) step.program = reply.program;
    if (reply.answer !== undefined) {
      s.answer = reply.answer;
      s.finish = 'answer';
      return;
    }
    const next = reply.messages ?? [];
    let text: string;
    if (o.protocol.injection === 'inline') {
      text = reply.text ?? '';
    } else {
      if (!next.length) throw new SlmError('PROTOCOL_ERROR', `Expected the ${o.protocol.name} protocol to reply with at least one message after turn ${step.turn}, but it gave none.`);
      // The turn as decoded (stop-token text included) so that the formatter does not repeat `<|im_end|>`.
      const generated = s.segments[s.segments.length - 1].text;
      const history: ChatMessage[] = [...s.messages.slice(0, -1), { role: 'assistant', content: generated }];
      text = o.formatter.continuation(history, next, { strict: o.strictTemplate ?? false });
    }
    const ids = text ? o.tokenizer.encode(text) : [];
    // The reply must fit with room for at least one generated token after it.
    if (s.ids.length + ids.length >= o.maxTotalTokens) {
      s.finish = 'context';
      return;
    }
    for (const id of ids) {
      s.ids.push(id);
      s.mask.push(0);
      s.logprobs.push(0);
    }
    step.envTokens = ids.length;
    s.segments.push({ source: 'env', text, tokens: ids.length });
    if (o.protocol.injection === 'inline') s.inlineText += text;
    else s.messages.push(...next);
  }

  #addAssistantText(s: Live, text: string): void {
    if (this.options.protocol.injection === 'inline') {
      s.inlineText += text;
      const clean = stripStopText(s.inlineText, this.#stopTexts);
      const last = s.messages[s.messages.length - 1];
      if (last?.role === 'assistant') last.content = clean;
      else s.messages.push({ role: 'assistant', content: clean });
    } else {
      s.messages.push({ role: 'assistant', content: stripStopText(text, this.#stopTexts) });
    }
  }

  #finish(s: Live): Episode {
    const finish = s.finish ?? 'max_turns';
    return {
      index: s.index,
      question: s.question,
      ids: Int32Array.from(s.ids),
      lossMask: Uint8Array.from(s.mask),
      logprobs: Float32Array.from(s.logprobs),
      promptTokens: s.promptTokens,
      temperature: s.temperature,
      answer: s.answer,
      finish,
      turns: s.turns,
      calls: s.calls,
      messages: s.messages,
      steps: s.steps,
      segments: s.segments,
      timings: { generateMs: s.generateMs, toolMs: s.toolMs },
      record: { finish, messages: s.messages, calls: s.calls, steps: s.steps },
    };
  }
}

/**
 * How many of `ids` (whose decoding is `text`) are needed to cover `text[0, end)`: the smallest k
 * whose decoded prefix starts with `text.slice(0, end)`. Binary search over prefixes.
 */
export function tokensThrough(tokenizer: Pick<Tokenizer, 'decode'>, ids: readonly number[], text: string, end: number): number {
  if (end >= text.length) return ids.length;
  const want = text.slice(0, end);
  let lo = 0;
  let hi = ids.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (tokenizer.decode(ids.slice(0, mid)).startsWith(want)) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

/** `text` without one trailing stop-token text (`<|im_end|>`), for the messages of a trajectory. */
function stripStopText(text: string, stopTexts: readonly string[]): string {
  for (const s of stopTexts) if (text.endsWith(s)) return text.slice(0, -s.length);
  return text;
}

function checkOptions(o: EpisodeRunnerOptions): void {
  if (!o || typeof o !== 'object') throw new SlmError('ARGUMENT_INVALID', `Expected EpisodeRunner options, but found ${describe(o)}.`);
  for (const [k, what] of [
    ['generator', 'a TextGenerator (generate(req))'],
    ['tokenizer', 'a tokenizer (encode, decode, stopTokenIds)'],
    ['formatter', 'a prompt formatter (prompt, continuation), e.g. ChatFormatter.forModel(dir)'],
    ['protocol', 'a protocol from codeProtocol() or tagsProtocol()'],
  ] as const) {
    if (!o[k] || typeof o[k] !== 'object') throw new SlmError('ARGUMENT_INVALID', `Expected option "${k}" of EpisodeRunner to be ${what}, but found ${describe(o[k])}.`);
  }
  for (const k of ['maxTurns', 'maxNewTokens', 'maxTotalTokens'] as const) {
    if (!Number.isInteger(o[k]) || o[k] < 1) throw new SlmError('ARGUMENT_INVALID', `Expected option "${k}" of EpisodeRunner to be a positive integer, but found ${describe(o[k])}.`);
  }
}

function checkResult(res: GenerateResult, rows: number): void {
  const bad = !res || !Array.isArray(res.tokens) || !Array.isArray(res.logprobs) || !Array.isArray(res.finishReasons);
  if (bad || res.tokens.length !== rows || res.logprobs.length !== rows || res.finishReasons.length !== rows) {
    throw new SlmError('PROTOCOL_ERROR', `Expected the generator to return tokens, logprobs and finishReasons for each of the ${rows} rows it was sent, but found ${bad ? 'a malformed result' : `${res.tokens.length}/${res.logprobs.length}/${res.finishReasons.length}`}.`);
  }
  res.tokens.forEach((t, i) => {
    if (res.logprobs[i].length !== t.length) {
      throw new SlmError('PROTOCOL_ERROR', `Expected one log-prob per generated token, but row ${i} has ${t.length} tokens and ${res.logprobs[i].length} log-probs.`);
    }
  });
}
