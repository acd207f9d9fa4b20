/** What a merged export writes beside the weights, and the counters Model.generate reports. */
import { copyFileSync, existsSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { NativeGenerateResult } from '../binding/types.js';

/** What Model.generate reports beside the tokens: the native result's counters, as the addon documents them. */
export type GenerateStats = Pick<
  NativeGenerateResult,
  | 'steps'
  | 'prefillSeconds'
  | 'decodeSeconds'
  | 'prefillTokens'
  | 'prefillTokensRequested'
  | 'cacheReusedTokens'
  | 'cacheHits'
  | 'cacheEvicted'
  | 'cacheStale'
>;

/** The files of a Hugging Face folder besides its weights, copied from the base model's folder to a merged export. */
const FOLDER_FILES = [
  'tokenizer.json',
  'tokenizer_config.json',
  'chat_template.jinja',
  'generation_config.json',
  'special_tokens_map.json',
  'added_tokens.json',
  'vocab.json',
  'merges.txt',
];

/** A merged export's config.json (the base's, with the export's dtype) and the base folder's tokenizer and template files. */
export function writeFolderFiles(baseDir: string, out: string, config: Record<string, unknown>): void {
  writeFileSync(join(out, 'config.json'), JSON.stringify(config, null, 2) + '\n');
  for (const f of FOLDER_FILES) if (existsSync(join(baseDir, f))) copyFileSync(join(baseDir, f), join(out, f));
}
