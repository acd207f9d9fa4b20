/**
 * A protocol bound to its environment: what the EpisodeRunner needs to run `code` or `tags`
 * episodes. The parsing and formatting are the pure functions of code.ts and tags.ts; this file
 * only calls the environment (a sandbox, a passage search) and says how its reply is joined to the
 * token stream:
 * - `chat`: the reply is one or more chat messages, joined by the model's chat template (the
 *   reference's `code` episodes: `<python_output>` comes back as a user message);
 * - `inline`: the reply text is appended to the assistant's own text as is (Search-R1).
 */
import { isSlmError, SlmError } from '../errors.js';
import type { ChatMessage } from '../model/tokenizer-types.js';
import { IDENTIFIER } from '../sandbox/tools.js';
import type { ToolCall } from '../sandbox/types.js';
import {
  CODE_TAGS,
  codeFeedback,
  finalTurnNotice,
  formatCodeObservation,
  parseCodeTurn,
  DEFAULT_OBSERVATION_CHARS,
  type CodeAction,
  type CodeTags,
  type ProgramOutput,
} from './code.js';
import {
  codeQuestionMessage,
  codeSystemPrompt,
  fillInstruction,
  QUESTION_PLACEHOLDER,
  SEARCH_R1_INSTRUCTION,
  type CodeLanguage,
} from './prompts.js';
import { formatInformation, parseTagsTurn, tagsFeedback, type PassageLike, type TagsAction } from './tags.js';

export type FinishReason = 'stop_token' | 'stop_string' | 'length';

export type TurnAction = CodeAction | TagsAction;
export type ToolAction = Exclude<TurnAction, { kind: 'answer' }>;

/** What running one program gives (lib/sandbox's SandboxResult satisfies it). */
export interface ProgramResult extends ProgramOutput {
  calls?: ToolCall[];
  truncated?: boolean;
  duration_ms?: number;
  /** The text the program passed to final_answer(), when it called it. */
  final_answer?: string;
}

/** Runs model-written programs; lib/sandbox's `createSandbox(...)` returns one. */
export interface CodeExecutor {
  /**
   * `globals`: variables bound for this program only (CodeProtocolOptions.questionVariable);
   * `finalAnswer`: define final_answer() for it (CodeProtocolOptions.finalAnswer).
   */
  run(code: string, opts?: { globals?: Record<string, unknown>; finalAnswer?: boolean }): Promise<ProgramResult>;
}

/** Top-k passages for a query; lib/retrieval's SearchIndex has it. */
export interface PassageSearch {
  searchPassages(query: string, k?: number): Promise<PassageLike[]> | PassageLike[];
}

/** One call an episode made to its environment, in order. */
export interface EpisodeCall {
  /** The turn whose action made it (1-based). */
  turn: number;
  /** `search_pages` / `view_sections` / `read_section` from a program, or `search` for a `<search>` tag. */
  name: string;
  args: unknown[];
  ok: boolean;
  ms: number;
  /** Why it failed, where known. */
  error?: string;
  /** Passages returned (search). */
  results?: number;
}

/** Summary of one program run, kept per turn. */
export interface ProgramSummary {
  error: string | null;
  timed_out: boolean;
  truncated: boolean;
  output_chars: number;
  duration_ms: number;
}

export interface EnvReply {
  /** chat protocols: the messages to add. */
  messages?: ChatMessage[];
  /** inline protocols: the text appended to the assistant's text. */
  text?: string;
  calls: EpisodeCall[];
  /** Wall time of the environment's work for this reply. */
  toolMs: number;
  program?: ProgramSummary;
  /**
   * The episode's final answer, given by the environment (a program's final_answer() call): the
   * episode ends with it and no reply is appended.
   */
  answer?: string;
}

export interface TurnContext {
  /** The turn just generated (1-based). */
  turn: number;
  /** Generations the episode may have, the last one (which gets no reply) included. */
  maxTurns: number;
  finishReason: FinishReason;
  maxNewTokens: number;
  /** The episode's question (the code protocol binds it to a variable when asked to). */
  question?: string;
}

export type TurnsCount = 'generations' | 'searches';

export interface EpisodeProtocol {
  readonly name: string;
  readonly injection: 'chat' | 'inline';
  /** Stop strings for generation: the closing tags of the actions. */
  readonly stopStrings: readonly string[];
  /**
   * How the runner's maxTurns counts: `generations` (the default; the code protocol, as the
   * reference: N generations, the last must answer) or `searches` (Search-R1's max_turns: N turns
   * that get a reply, then one more generation that gets none and must answer).
   */
  readonly turnsCount?: TurnsCount;
  /**
   * The conversation an episode starts from. `maxTurns`: the generations it may have. `prompt`: the
   * question row's own chat prompt, when it has one (Search-R1's processed files); a protocol may
   * start from it (tags) or ignore it (code, direct).
   */
  initialMessages(question: string, maxTurns: number, prompt?: readonly ChatMessage[]): ChatMessage[];
  parse(text: string): TurnAction;
  /** The environment's reply to a turn that did not answer and was not the last. */
  respond(action: ToolAction, ctx: TurnContext): Promise<EnvReply>;
}

// ---------------------------------------------------------------------------------------------
// code

export interface CodeProtocolOptions {
  executor: CodeExecutor;
  /** Cap on the program output shown to the model (default 6000 characters, as the reference). */
  maxOutputChars?: number;
  /** Role of the environment's messages: `user` as the reference (default), or `tool`. */
  envRole?: 'user' | 'tool';
  /** The system prompt, or a function of maxTurns (default: codeSystemPrompt). */
  systemPrompt?: string | ((maxTurns: number) => string);
  /** Language named in the default system prompt (python; javascript for QuickJS). */
  language?: CodeLanguage;
  /** Reminder before the last turn (default finalTurnNotice()); null for none. */
  finalTurnNotice?: string | null;
  tags?: CodeTags;
  /**
   * When set, every program of an episode finds the episode's question in a global variable of this
   * name (e.g. `question`), so it can search with it without copying it out of the prompt: a
   * smolagents-style task input. The default system prompt then says so. Default: none.
   */
  questionVariable?: string;
  /**
   * Programs may call `final_answer(answer)` (smolagents' CodeAgent): the call ends the program and
   * the episode, whose answer is the value as text; `<answer>` tags still work. Default false (the
   * reference's protocol has no such function).
   */
  finalAnswer?: boolean;
  /** Pages search_pages returns, as the default system prompt says (retrieval.k; default 10). */
  searchResults?: number;
}

export function codeProtocol(codeProtocolOptions: CodeProtocolOptions): EpisodeProtocol {
  if (!codeProtocolOptions || typeof codeProtocolOptions.executor?.run !== 'function') {
    throw new SlmError(
      'ARGUMENT_INVALID',
      'Expected codeProtocol({ executor }) with an executor that has run(code), e.g. a sandbox from createSandbox(); found none.',
    );
  }
  const tags = codeProtocolOptions.tags ?? CODE_TAGS;
  const role = codeProtocolOptions.envRole ?? 'user';
  const notice = codeProtocolOptions.finalTurnNotice === undefined ? finalTurnNotice(tags) : codeProtocolOptions.finalTurnNotice;
  const maxChars = codeProtocolOptions.maxOutputChars ?? DEFAULT_OBSERVATION_CHARS;
  const qVar = codeProtocolOptions.questionVariable;
  if (qVar !== undefined && !IDENTIFIER.test(qVar)) {
    throw new SlmError(
      'ARGUMENT_INVALID',
      `Expected questionVariable to be an identifier such as "question" but received ${JSON.stringify(qVar)}.`,
    );
  }
  return {
    name: 'code',
    injection: 'chat',
    stopStrings: [`</${tags.code}>`, `</${tags.answer}>`],
    initialMessages(question, maxTurns) {
      const system =
        typeof codeProtocolOptions.systemPrompt === 'function'
          ? codeProtocolOptions.systemPrompt(maxTurns)
          : (codeProtocolOptions.systemPrompt ??
            codeSystemPrompt({
              maxTurns,
              language: codeProtocolOptions.language,
              tags,
              questionVariable: qVar,
              finalAnswer: codeProtocolOptions.finalAnswer,
              searchResults: codeProtocolOptions.searchResults,
            }));
      return [
        { role: 'system', content: system },
        { role: 'user', content: codeQuestionMessage(question) },
      ];
    },
    parse: (text) => parseCodeTurn(text, tags),
    async respond(action, ctx) {
      const out: EnvReply = { messages: [], calls: [], toolMs: 0 };
      if (action.kind === 'code') {
        const t0 = performance.now();
        if (qVar !== undefined && typeof ctx.question !== 'string') {
          throw new SlmError(
            'PROTOCOL_ERROR',
            `Expected the turn context to carry the episode's question (the protocol binds it to "${qVar}") but it had none.`,
          );
        }
        const opts =
          qVar !== undefined || codeProtocolOptions.finalAnswer
            ? {
                ...(qVar !== undefined ? { globals: { [qVar]: ctx.question } } : {}),
                finalAnswer: codeProtocolOptions.finalAnswer === true,
              }
            : undefined;
        const r = await codeProtocolOptions.executor.run(action.code, opts);
        out.toolMs = performance.now() - t0;
        out.calls = (r.calls ?? []).map((c) => ({ turn: ctx.turn, name: c.name, args: c.args, ok: c.ok, ms: c.ms }));
        out.program = {
          error: r.error,
          timed_out: r.timed_out,
          truncated: r.truncated ?? false,
          output_chars: r.stdout.length,
          duration_ms: r.duration_ms ?? out.toolMs,
        };
        if (codeProtocolOptions.finalAnswer && typeof r.final_answer === 'string') {
          out.answer = r.final_answer.trim();
          return out;
        }
        out.messages!.push({ role, content: formatCodeObservation(r, { maxChars, tags }) });
      } else if (action.kind === 'none') {
        out.messages!.push({
          role,
          content: codeFeedback(action, { finishReason: ctx.finishReason, maxNewTokens: ctx.maxNewTokens, tags }),
        });
      } else {
        throw new SlmError(
          'PROTOCOL_ERROR',
          `Expected a code, answer or no-action turn in a code episode, but the parser gave a "${action.kind}" action.`,
        );
      }
      if (notice && ctx.turn + 1 === ctx.maxTurns) out.messages!.push({ role, content: notice });
      return out;
    },
  };
}

// ---------------------------------------------------------------------------------------------
// tags

export interface TagsProtocolOptions {
  search: PassageSearch;
  /** Passages per search (Search-R1's default: 3). */
  topK?: number;
  /** inline (Search-R1, default) or chat (the `<information>` block as a user/tool message). */
  mode?: 'inline' | 'chat';
  envRole?: 'user' | 'tool';
  /**
   * The first user message for a question: a template with `{question}` where the question goes, or
   * a function of the question (default: Search-R1's template, SEARCH_R1_INSTRUCTION).
   */
  instruction?: string | ((question: string) => string);
  /** An optional system message (Search-R1 has none). */
  systemPrompt?: string;
  /**
   * An episode whose question row carries its own chat prompt (Search-R1's processed files: `prompt`)
   * starts from exactly those messages, as Search-R1 renders them with the chat template; instruction
   * and systemPrompt are then not used. Default true; false wraps the question in instruction.
   */
  usePrompt?: boolean;
  /**
   * What the runner's maxTurns counts (default `searches`, Search-R1's max_turns: N rounds of
   * generation + reply, a search or the invalid-action note, then one last generation without
   * search results); `generations` makes N the number of generations, the last one included.
   */
  turnsCount?: TurnsCount;
}

/** Errors of the search that are about the query (shown to the model) rather than a broken index (thrown). */
const QUERY_ERRORS = new Set(['ARGUMENT_INVALID', 'NOT_FOUND']);

export function tagsProtocol(opts: TagsProtocolOptions): EpisodeProtocol {
  if (!opts || typeof opts.search?.searchPassages !== 'function') {
    throw new SlmError(
      'ARGUMENT_INVALID',
      'Expected tagsProtocol({ search }) with a search that has searchPassages(query, k), e.g. a SearchIndex; found none.',
    );
  }
  const topK = opts.topK ?? 3;
  const mode = opts.mode ?? 'inline';
  const role = opts.envRole ?? 'user';
  const turnsCount = opts.turnsCount ?? 'searches';
  if (turnsCount !== 'searches' && turnsCount !== 'generations') {
    throw new SlmError(
      'ARGUMENT_INVALID',
      `Expected turnsCount of tagsProtocol to be "searches" or "generations" but received ${JSON.stringify(turnsCount)}.`,
    );
  }
  const template = opts.instruction ?? SEARCH_R1_INSTRUCTION;
  if (typeof template === 'string' && !template.includes(QUESTION_PLACEHOLDER)) {
    throw new SlmError(
      'ARGUMENT_INVALID',
      `Expected the instruction template of tagsProtocol to contain ${QUESTION_PLACEHOLDER} where the question goes, but it has none: ${JSON.stringify(template.slice(0, 80))}.`,
    );
  }
  const instruction = typeof template === 'string' ? (q: string) => fillInstruction(template, q) : template;
  const wrap = (text: string, calls: EpisodeCall[], toolMs: number): EnvReply =>
    mode === 'inline' ? { text, calls, toolMs } : { messages: [{ role, content: text.trim() }], calls, toolMs };
  return {
    name: 'tags',
    injection: mode,
    stopStrings: ['</search>', '</answer>'],
    turnsCount,
    initialMessages(question, _maxTurns, prompt) {
      if (prompt?.length && opts.usePrompt !== false) return prompt.map((m) => ({ role: m.role, content: m.content }));
      const user: ChatMessage = { role: 'user', content: instruction(question) };
      return opts.systemPrompt ? [{ role: 'system', content: opts.systemPrompt }, user] : [user];
    },
    parse: parseTagsTurn,
    async respond(action, ctx) {
      if (action.kind === 'none') return wrap(tagsFeedback(action), [], 0);
      if (action.kind !== 'search') {
        throw new SlmError(
          'PROTOCOL_ERROR',
          `Expected a search, answer or no-action turn in a tags episode, but the parser gave a "${action.kind}" action.`,
        );
      }
      const t0 = performance.now();
      try {
        const passages = await opts.search.searchPassages(action.query, topK);
        const ms = performance.now() - t0;
        return wrap(
          formatInformation(passages),
          [{ turn: ctx.turn, name: 'search', args: [action.query], ok: true, ms, results: passages.length }],
          ms,
        );
      } catch (e) {
        if (!isSlmError(e) || !QUERY_ERRORS.has(e.code)) throw e;
        const ms = performance.now() - t0;
        return wrap(
          `\n\n<information>The search failed: ${e.message}</information>\n\n`,
          [{ turn: ctx.turn, name: 'search', args: [action.query], ok: false, ms, error: e.message }],
          ms,
        );
      }
    },
  };
}
