/** Hugging Face `config.json` of a Qwen3 model, validated into what the native engine needs. */
import { existsSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { SlmError, describe } from '../errors.js';
import type { NativeModelConfig } from '../binding/types.js';

export const SUPPORTED_MODEL_TYPES = ['qwen3'] as const;

export interface ModelConfig extends NativeModelConfig {
  model_type: string;
  max_position_embeddings: number;
  bos_token_id?: number;
  eos_token_id?: number | number[];
  torch_dtype?: string;
  /** The raw JSON, for writing back unchanged fields. */
  raw: Record<string, unknown>;
}

export function checkModelDir(dir: string): void {
  if (!existsSync(dir))
    throw new SlmError('MODEL_NOT_FOUND', `model folder ${dir} does not exist. Expected a Hugging Face model folder (config.json + *.safetensors); create one with \`slm-train init-model --preset tiny --out ${dir}\`.`);
  if (!statSync(dir).isDirectory()) throw new SlmError('MODEL_NOT_FOUND', `${dir} is a file; expected a Hugging Face model folder (config.json + *.safetensors).`);
  if (!existsSync(join(dir, 'config.json')))
    throw new SlmError('MODEL_CONFIG_INVALID', `${dir} has no config.json. Expected a Hugging Face model folder (config.json + model.safetensors or shards).`);
}

export function readModelConfig(dir: string): ModelConfig {
  checkModelDir(dir);
  let raw: Record<string, unknown>;
  try {
    raw = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8'));
  } catch (e) {
    throw new SlmError('MODEL_CONFIG_INVALID', `${join(dir, 'config.json')} is not valid JSON: ${(e as Error).message}.`);
  }
  return parseModelConfig(raw, join(dir, 'config.json'));
}

export function parseModelConfig(raw: Record<string, unknown>, where = 'config.json'): ModelConfig {
  const modelType = raw.model_type;
  if (typeof modelType !== 'string' || !(SUPPORTED_MODEL_TYPES as readonly string[]).includes(modelType))
    throw new SlmError(
      'MODEL_TYPE_UNSUPPORTED',
      `${where}: model_type ${describe(modelType)} is not supported; supported: ${SUPPORTED_MODEL_TYPES.join(', ')}. Use a Qwen3 checkpoint (e.g. Qwen/Qwen3-4B-Instruct-2507).`,
    );
  const int = (k: string, dflt?: number): number => {
    const v = raw[k] ?? dflt;
    if (typeof v !== 'number' || !Number.isInteger(v) || v <= 0)
      throw new SlmError('MODEL_CONFIG_INVALID', `${where}: expected a positive integer for "${k}", found ${describe(raw[k])}.`);
    return v;
  };
  const num = (k: string, dflt: number): number => {
    const v = raw[k] ?? dflt;
    if (typeof v !== 'number' || !(v > 0)) throw new SlmError('MODEL_CONFIG_INVALID', `${where}: expected a positive number for "${k}", found ${describe(raw[k])}.`);
    return v;
  };
  const heads = int('num_attention_heads');
  const hidden = int('hidden_size');
  const rs = raw.rope_scaling as { rope_type?: string; type?: string } | null | undefined;
  if (rs && (rs.rope_type ?? rs.type) && (rs.rope_type ?? rs.type) !== 'default')
    throw new SlmError('MODEL_CONFIG_INVALID', `${where}: rope_scaling of type "${rs.rope_type ?? rs.type}" is not supported yet; supported: none/default.`);
  const cfg: ModelConfig = {
    model_type: modelType,
    vocab_size: int('vocab_size'),
    hidden_size: hidden,
    intermediate_size: int('intermediate_size'),
    num_hidden_layers: int('num_hidden_layers'),
    num_attention_heads: heads,
    num_key_value_heads: int('num_key_value_heads', heads),
    head_dim: int('head_dim', Math.floor(hidden / heads)),
    rope_theta: num('rope_theta', 1e6),
    rms_norm_eps: num('rms_norm_eps', 1e-6),
    tie_word_embeddings: raw.tie_word_embeddings === true,
    max_position_embeddings: int('max_position_embeddings', 40960),
    bos_token_id: typeof raw.bos_token_id === 'number' ? raw.bos_token_id : undefined,
    eos_token_id: (raw.eos_token_id as number | number[] | undefined) ?? undefined,
    torch_dtype: typeof raw.torch_dtype === 'string' ? raw.torch_dtype : undefined,
    raw,
  };
  if (cfg.num_attention_heads % cfg.num_key_value_heads !== 0)
    throw new SlmError(
      'MODEL_CONFIG_INVALID',
      `${where}: num_attention_heads (${cfg.num_attention_heads}) must be a multiple of num_key_value_heads (${cfg.num_key_value_heads}).`,
    );
  return cfg;
}

export function nativeConfig(c: ModelConfig): NativeModelConfig {
  const { vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, rope_theta, rms_norm_eps, tie_word_embeddings } = c;
  return { vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, rope_theta, rms_norm_eps, tie_word_embeddings };
}
