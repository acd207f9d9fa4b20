/**
 * Text in, text out on top of the token API (Model.generateStream): `chat` renders messages with the
 * model's chat template and returns the assistant's reply; `chatStream` yields the reply's text as it
 * is sampled (an async iterator, as node-llama-cpp's and the openai client's streams give). Both take
 * an AbortSignal: aborting stops generation before the next token, and the call rejects (the
 * iterator throws) with the signal's reason.
 */
import type { ChatFormatter, ChatMessage } from '../model/chat.js';
import type { Tokenizer } from '../model/tokenizer-types.js';
import type { Model } from './model.js';

/** What a chat call needs: the model, its tokenizer and chat template (a loadAgent / loadPolicy result). */
export interface ChatPolicy {
  model: Model;
  tokenizer: Tokenizer;
  formatter: ChatFormatter;
}

export interface ChatCallOptions {
  /** Default 256. */
  maxNewTokens?: number;
  /** Default 0.7; 0 or `greedy` = argmax. */
  temperature?: number;
  topP?: number;
  topK?: number;
  greedy?: boolean;
  seed?: number;
  /** The template's enable_thinking (Qwen3's hybrid templates); undefined: not passed. */
  enableThinking?: boolean;
  /** Tool definitions for the template (JSON-schema objects, as in transformers). */
  tools?: unknown[];
  signal?: AbortSignal;
}

export interface ChatReply {
  /** The assistant's text, without the stop text that ended it (`<|im_end|>`). */
  text: string;
  tokens: Int32Array;
  finishReason: 'stop_token' | 'stop_string' | 'length';
}

/** The assistant's reply to `messages`. */
export async function chat(policy: ChatPolicy, messages: readonly ChatMessage[], opts: ChatCallOptions = {}): Promise<ChatReply> {
  const it = chatStream(policy, messages, opts);
  for (;;) {
    const r = await it.next();
    if (r.done) return r.value;
  }
}

/**
 * The reply's text in pieces as it is sampled (a piece never ends inside a UTF-8 character); the
 * iterator's return value is the whole reply. Stopping the loop early (break) stops generation.
 */
export async function* chatStream(
  policy: ChatPolicy,
  messages: readonly ChatMessage[],
  opts: ChatCallOptions = {},
): AsyncGenerator<string, ChatReply, undefined> {
  opts.signal?.throwIfAborted();
  const { model, tokenizer, formatter } = policy;
  const prompt = formatter.prompt(messages, {
    ...(opts.enableThinking !== undefined ? { enableThinking: opts.enableThinking } : {}),
    ...(opts.tools ? { tools: opts.tools } : {}),
  });
  const ids = Int32Array.from(tokenizer.encode(prompt));
  const stop = new AbortController();
  const onAbort = () => stop.abort();
  opts.signal?.addEventListener('abort', onAbort, { once: true });
  const queue: number[] = [];
  let wake: (() => void) | undefined;
  const tokens: number[] = [];
  let finished = false;
  const done = model
    .generateStream({
      prompts: [ids],
      maxNewTokens: opts.maxNewTokens ?? 256,
      temperature: opts.temperature ?? 0.7,
      ...(opts.topP !== undefined ? { topP: opts.topP } : {}),
      ...(opts.topK !== undefined ? { topK: opts.topK } : {}),
      ...(opts.greedy !== undefined ? { greedy: opts.greedy } : {}),
      ...(opts.seed !== undefined ? { seed: opts.seed } : {}),
      stopStrings: formatter.stopTexts,
      signals: [stop.signal],
      onToken: (ev) => {
        queue.push(ev.token);
        wake?.();
      },
    })
    .finally(() => {
      finished = true;
      wake?.();
    });
  done.catch(() => {}); // handled where it is awaited
  let sent = '';
  // The text so far minus the stop text it may end with; held back while it ends inside a character.
  const visible = () => {
    const text = tokenizer.decode(tokens);
    const s = formatter.stopTexts.find((x) => x && text.endsWith(x));
    return s ? text.slice(0, -s.length) : text;
  };
  try {
    for (;;) {
      while (queue.length) tokens.push(queue.shift()!);
      const text = visible();
      if (text.length > sent.length && text.startsWith(sent) && !text.endsWith('\uFFFD')) {
        const piece = text.slice(sent.length);
        sent = text;
        yield piece;
        continue;
      }
      if (finished && !queue.length) break;
      await new Promise<void>((r) => {
        wake = r;
        if (queue.length || finished) r();
      });
      wake = undefined;
    }
    const res = await done;
    opts.signal?.throwIfAborted();
    const text = visible();
    if (text.length > sent.length) yield text.slice(sent.length);
    const finish = res.finishReasons[0];
    return {
      text,
      tokens: res.tokens[0] ?? new Int32Array(),
      finishReason: finish === 'cancelled' || finish === undefined ? 'length' : finish,
    };
  } finally {
    // break, a throw in the loop body or an abort: stop the row and wait for the native call.
    stop.abort();
    opts.signal?.removeEventListener('abort', onAbort);
    await done.catch(() => {});
  }
}
