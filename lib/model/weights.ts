/** Which safetensors files hold a model folder's weights: one file, or the shards of an index. */
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { SlmError } from '../errors.js';

export function resolveWeightFiles(dir: string): string[] {
  const single = join(dir, 'model.safetensors');
  const index = join(dir, 'model.safetensors.index.json');
  if (existsSync(index)) {
    let idx: { weight_map?: Record<string, string> };
    try {
      idx = JSON.parse(readFileSync(index, 'utf8'));
    } catch (e) {
      throw new SlmError('WEIGHTS_CORRUPT', `${index} is not valid JSON: ${(e as Error).message}. Re-download the model.`);
    }
    if (!idx.weight_map || typeof idx.weight_map !== 'object')
      throw new SlmError('WEIGHTS_CORRUPT', `${index} has no "weight_map" object (tensor name -> shard file).`);
    const shards = [...new Set(Object.values(idx.weight_map))].sort();
    const missing = shards.filter((s) => !existsSync(join(dir, s)));
    if (missing.length)
      throw new SlmError(
        'WEIGHTS_SHARD_MISSING',
        `${index} lists ${shards.length} shard(s) but ${missing.join(', ')} ${missing.length === 1 ? 'is' : 'are'} missing from ${dir}. Download the missing file(s) again.`,
      );
    return shards.map((s) => join(dir, s));
  }
  if (existsSync(single)) return [single];
  throw new SlmError(
    'WEIGHTS_MISSING',
    `${dir} has no weights: expected model.safetensors, or model.safetensors.index.json with its shards. (.bin / PyTorch pickles are not read: convert with save_pretrained(safe_serialization=True).)`,
  );
}
