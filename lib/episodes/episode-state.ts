/**
 * One episode while its batch runs: its state (Live), and the steps that move it along: started
 * from its request, a generated turn committed (parsed, its tokens appended, maybe ended), an
 * environment reply appended, and at the end the Episode it becomes.
 */
import { SlmError, describe } from '../errors.js';
import type { ChatMessage, Tokenizer } from '../model/tokenizer-types.js';
import type { EnvReply, EpisodeCall, FinishReason, ToolAction } from './protocol.js';
import type { Episode, EpisodeFinish, EpisodeRequest, EpisodeRunnerOptions, Segment, TurnRecord } from './runner-types.js';

/** State of one episode while the batch runs. */
export interface Live {
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
  /** 1 on prefilled tokens (EpisodeRunnerOptions.prefill). */
  forced: number[];
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
  /** How many of turnIds (their start) the runner prefilled. */
  turnForced: number;
  /** The last committed turn's text, prefill included (what the chat template continues from). */
  turnText: string;
  turnFinish: FinishReason;
  budget: number;
  resumes: number;
}

/** What an episode's steps read from its runner. */
export interface EpisodeContext {
  readonly options: Readonly<EpisodeRunnerOptions>;
  /** Generations an episode may have, the last one (which gets no reply) included. */
  readonly generations: number;
  /** The texts of the stop tokens, taken off the end of the trajectory's messages. */
  readonly stopTexts: readonly string[];
}

/** The episode of request `r` at `index`: its prompt encoded (already over the limit: ended with `context`). */
export function startEpisode(ctx: EpisodeContext, episodeRequest: EpisodeRequest, index: number): Live {
  const o = ctx.options;
  if (!episodeRequest || typeof episodeRequest.question !== 'string')
    throw new SlmError(
      'ARGUMENT_INVALID',
      `Expected episode request ${index} to have a string "question", but found ${describe(episodeRequest?.question)}.`,
    );
  const temperature = episodeRequest.temperature ?? o.temperature ?? 1;
  if (!(typeof temperature === 'number' && temperature >= 0)) {
    throw new SlmError(
      'ARGUMENT_INVALID',
      `Expected the temperature of episode request ${index} to be a number >= 0, but found ${describe(temperature)}.`,
    );
  }
  if (
    episodeRequest.topP !== undefined &&
    !(typeof episodeRequest.topP === 'number' && episodeRequest.topP > 0 && episodeRequest.topP <= 1)
  ) {
    throw new SlmError(
      'ARGUMENT_INVALID',
      `Expected the topP of episode request ${index} to be a number in (0, 1], but found ${describe(episodeRequest.topP)}.`,
    );
  }
  if (
    episodeRequest.prompt !== undefined &&
    !(
      Array.isArray(episodeRequest.prompt) &&
      episodeRequest.prompt.every((m) => m && typeof m.role === 'string' && typeof m.content === 'string')
    )
  ) {
    throw new SlmError(
      'ARGUMENT_INVALID',
      `Expected the prompt of episode request ${index} to be a list of chat messages {role, content}, but found ${describe(episodeRequest.prompt)}.`,
    );
  }
  const messages = episodeRequest.messages
    ? episodeRequest.messages.map((m) => ({ ...m }))
    : o.protocol.initialMessages(episodeRequest.question, ctx.generations, episodeRequest.prompt);
  const thinking = o.enableThinking !== undefined ? { enableThinking: o.enableThinking } : {};
  const text = o.formatter.prompt(messages, thinking);
  const ids = encodeRendered(o.tokenizer, text, messages, (ms) => o.formatter.prompt(ms, thinking));
  const s: Live = {
    index,
    seed: episodeRequest.seed,
    question: episodeRequest.question,
    temperature,
    ...(episodeRequest.topP !== undefined ? { topP: episodeRequest.topP } : {}),
    ids: [...ids],
    mask: new Array(ids.length).fill(0),
    logprobs: new Array(ids.length).fill(0),
    forced: new Array(ids.length).fill(0),
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
    turnForced: 0,
    turnText: '',
    turnFinish: 'length',
    budget: 0,
    resumes: 0,
  };
  if (ids.length === 0)
    throw new SlmError(
      'ARGUMENT_INVALID',
      `Expected the prompt of episode request ${index} to encode to at least one token, but it is empty.`,
    );
  if (ids.length >= o.maxTotalTokens) s.finish = 'context';
  return s;
}

/** Parses the generated turn, appends its tokens; returns the action the environment must answer, if any. */
export function commitTurn(ctx: EpisodeContext, live: Live, turn: number): ToolAction | undefined {
  const o = ctx.options;
  let text = o.tokenizer.decode(live.turnIds);
  const action = o.protocol.parse(text);
  let dropped = 0;
  if (action.kind !== 'none') {
    const keep = Math.max(live.turnForced, tokensThrough(o.tokenizer, live.turnIds, text, action.end));
    if (keep < live.turnIds.length) {
      dropped = live.turnIds.length - keep;
      live.turnIds.length = keep;
      live.turnLogprobs.length = keep;
      text = o.tokenizer.decode(live.turnIds);
      if (live.turnFinish !== 'stop_string') live.turnFinish = 'stop_string';
    }
  }
  // Prefilled tokens: trained or not as the options say; the sampler gave them no log-prob.
  const forced = live.turnForced;
  const trainForced = o.prefill?.trained === true ? 1 : 0;
  for (let k = 0; k < live.turnIds.length; k++) {
    live.ids.push(live.turnIds[k]);
    live.mask.push(k < forced ? trainForced : 1);
    live.logprobs.push(k < forced ? 0 : live.turnLogprobs[k]);
    live.forced.push(k < forced ? 1 : 0);
  }
  live.turns = turn;
  if (forced > 0) live.segments.push({ source: 'prefill', text: o.tokenizer.decode(live.turnIds.slice(0, forced)), tokens: forced });
  live.segments.push({
    source: 'model',
    text: forced > 0 ? o.tokenizer.decode(live.turnIds.slice(forced)) : text,
    tokens: live.turnIds.length - forced,
  });
  live.turnText = text;
  addAssistantText(ctx, live, text);
  live.steps.push({
    turn,
    action: action.kind,
    ...(action.kind === 'none' ? { reason: action.reason, ...(action.open ? { open: action.open } : {}) } : {}),
    finishReason: live.turnFinish,
    generatedTokens: live.turnIds.length - forced,
    ...(forced > 0 ? { prefillTokens: forced } : {}),
    droppedTokens: dropped,
    resumes: live.resumes,
    envTokens: 0,
  });
  if (action.kind === 'answer') {
    live.answer = action.answer;
    live.finish = 'answer';
    return undefined;
  }
  if (live.ids.length >= o.maxTotalTokens) {
    live.finish = 'context';
    return undefined;
  }
  if (turn >= ctx.generations) {
    live.finish = 'max_turns';
    return undefined;
  }
  return action;
}

/** Appends the environment's reply to the turn just committed (or ends the episode: an answer, or no room). */
export function appendReply(ctx: EpisodeContext, live: Live, reply: EnvReply): void {
  const o = ctx.options;
  const step = live.steps[live.steps.length - 1];
  live.calls.push(...reply.calls);
  live.toolMs += reply.toolMs;
  if (reply.program) step.program = reply.program;
  if (reply.answer !== undefined) {
    live.answer = reply.answer;
    live.finish = 'answer';
    return;
  }
  const next = reply.messages ?? [];
  let text: string;
  let ids: number[];
  if (o.protocol.injection === 'inline') {
    // All of it is the environment's: special tokens in it are plain text.
    text = reply.text ?? '';
    ids = o.tokenizer.encode(text, { splitSpecialTokens: true });
    // protocol.max_observation_tokens: the reply's first tokens, as Search-R1 cuts max_obs_length.
    if (o.maxObservationTokens !== undefined && ids.length > o.maxObservationTokens) {
      ids = ids.slice(0, o.maxObservationTokens);
      text = o.tokenizer.decode(ids);
    }
  } else {
    if (!next.length)
      throw new SlmError(
        'PROTOCOL_ERROR',
        `Expected the ${o.protocol.name} protocol to reply with at least one message after turn ${step.turn}, but it gave none.`,
      );
    // The turn as decoded (stop-token text included) so that the formatter does not repeat `<|im_end|>`.
    const generated = live.turnText;
    const history: ChatMessage[] = [...live.messages.slice(0, -1), { role: 'assistant', content: generated }];
    const continuation = (ms: ChatMessage[]) =>
      o.formatter.continuation(history, ms, {
        strict: o.strictTemplate ?? false,
        ...(o.enableThinking !== undefined ? { enableThinking: o.enableThinking } : {}),
      });
    text = continuation(next);
    ids = encodeRendered(o.tokenizer, text, next, continuation);
  }
  // The reply must fit with room for at least one generated token after it.
  if (live.ids.length + ids.length >= o.maxTotalTokens) {
    live.finish = 'context';
    return;
  }
  for (const id of ids) {
    live.ids.push(id);
    live.mask.push(0);
    live.logprobs.push(0);
    live.forced.push(0);
  }
  step.envTokens = ids.length;
  live.segments.push({ source: 'env', text, tokens: ids.length });
  if (o.protocol.injection === 'inline') live.inlineText += text;
  else live.messages.push(...next);
}

/** Marks a message's content in a render: `MARK` index `MARK`. */
const MARK = 'slm-train:content:7d41b0:';
const MARKS = new RegExp(`${MARK}(\\d+)${MARK}`);

/**
 * The ids of `text`, which `render` made from `messages` with the chat template. The template's own
 * special tokens are special; a special token written in a message's content (a tool's output, a
 * question: nothing the template or the model wrote) is plain text, so an observation cannot forge
 * a turn boundary. Contents without special-token text: `text` encoded whole, as it always was.
 * Otherwise the messages are rendered again with a mark for each content, and the template's text
 * between the contents is encoded with its special tokens, each content without; a template that
 * changes a content on its way into the text (the marks do not give `text` back) gets the whole text
 * encoded as plain text: its own special tokens are then lost too, but nothing is forged.
 */
export function encodeRendered(
  tokenizer: Pick<Tokenizer, 'encode' | 'specialTokens'>,
  text: string,
  messages: readonly ChatMessage[],
  render: (messages: ChatMessage[]) => string,
): number[] {
  const risky = (c: string) => tokenizer.specialTokens.some((s) => c.includes(s));
  if (!messages.some((m) => risky(m.content))) return text ? tokenizer.encode(text) : [];
  const pieces = render(messages.map((m, i) => ({ ...m, content: `${MARK}${i}${MARK}` }))).split(MARKS);
  // pieces: template text, content index, template text, ...
  const rebuilt = pieces.map((p, k) => (k % 2 ? messages[Number(p)].content : p)).join('');
  if (rebuilt !== text) return tokenizer.encode(text, { splitSpecialTokens: true });
  return pieces.flatMap((p, k) =>
    k % 2 ? tokenizer.encode(messages[Number(p)].content, { splitSpecialTokens: true }) : p ? tokenizer.encode(p) : [],
  );
}

/** Adds the turn's text to the conversation (inline protocols: to the one assistant message). */
function addAssistantText(ctx: EpisodeContext, live: Live, text: string): void {
  if (ctx.options.protocol.injection === 'inline') {
    live.inlineText += text;
    const clean = stripStopText(live.inlineText, ctx.stopTexts);
    const last = live.messages[live.messages.length - 1];
    if (last?.role === 'assistant') last.content = clean;
    else live.messages.push({ role: 'assistant', content: clean });
  } else {
    live.messages.push({ role: 'assistant', content: stripStopText(text, ctx.stopTexts) });
  }
}

/** The Episode the runner returns for this state. */
export function finishEpisode(live: Live): Episode {
  const finish = live.finish ?? 'max_turns';
  return {
    index: live.index,
    question: live.question,
    ids: Int32Array.from(live.ids),
    lossMask: Uint8Array.from(live.mask),
    logprobs: Float32Array.from(live.logprobs),
    ...(live.forced.some((x) => x === 1) ? { forced: Uint8Array.from(live.forced) } : {}),
    promptTokens: live.promptTokens,
    temperature: live.temperature,
    answer: live.answer,
    finish,
    turns: live.turns,
    calls: live.calls,
    messages: live.messages,
    steps: live.steps,
    segments: live.segments,
    timings: { generateMs: live.generateMs, toolMs: live.toolMs },
    record: { finish, messages: live.messages, calls: live.calls, steps: live.steps },
  };
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
