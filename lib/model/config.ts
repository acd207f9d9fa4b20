/**
 * Hugging Face `config.json` of a Qwen3, Qwen2/2.5 or Llama 3.x model, validated into what the native
 * engine needs. ARCHITECTURES is the one list of supported model types: it turns each into the
 * switches of the shared decoder block (q/k norm, biases) that are passed to the native engine.
 */
import { existsSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { SlmError, describe } from '../errors.js';
import type { NativeModelConfig } from '../binding/types.js';

/** The switches of the shared decoder block (native/core/qwen3.h ModelArch). */
export interface ArchSwitches {
  /** Per-head RMSNorm on q and k before RoPE. */
  qk_norm: boolean;
  /** Biases on q_proj, k_proj, v_proj. */
  qkv_bias: boolean;
  /** Bias on o_proj. */
  o_bias: boolean;
  /** Biases on gate_proj, up_proj, down_proj. */
  mlp_bias: boolean;
}

interface Architecture {
  /** How Hugging Face's modeling file builds the block from config.json. */
  switches(raw: Record<string, unknown>): ArchSwitches;
  /** The architectures entry of config.json. */
  hfClass: string;
  example: string;
}

/** The supported `model_type`s, as modeling_qwen3.py, modeling_qwen2.py and modeling_llama.py build them. */
export const ARCHITECTURES = {
  qwen3: {
    hfClass: 'Qwen3ForCausalLM',
    example: 'Qwen/Qwen3-4B-Instruct-2507',
    switches: (raw) => ({ qk_norm: true, qkv_bias: raw.attention_bias === true, o_bias: raw.attention_bias === true, mlp_bias: false }),
  },
  qwen2: {
    hfClass: 'Qwen2ForCausalLM',
    example: 'Qwen/Qwen2.5-3B-Instruct',
    // Qwen2 always has q/k/v biases and none on o_proj (attention_bias is not read).
    switches: () => ({ qk_norm: false, qkv_bias: true, o_bias: false, mlp_bias: false }),
  },
  llama: {
    hfClass: 'LlamaForCausalLM',
    example: 'meta-llama/Llama-3.2-3B-Instruct',
    switches: (raw) => ({
      qk_norm: false,
      qkv_bias: raw.attention_bias === true,
      o_bias: raw.attention_bias === true,
      mlp_bias: raw.mlp_bias === true,
    }),
  },
} satisfies Record<string, Architecture>;

export type SupportedModelType = keyof typeof ARCHITECTURES;
export const SUPPORTED_MODEL_TYPES = Object.keys(ARCHITECTURES) as SupportedModelType[];
/** rope_scaling types: none / "default", and Llama 3.1's "llama3" frequency-band rescaling. */
const SUPPORTED_ROPE_TYPES = ['default', 'llama3'] as const;

export interface ModelConfig extends NativeModelConfig {
  model_type: SupportedModelType;
  max_position_embeddings: number;
  bos_token_id?: number;
  eos_token_id?: number | number[];
  torch_dtype?: string;
  /** The raw JSON, for writing back unchanged fields. */
  raw: Record<string, unknown>;
}

function checkModelDir(dir: string): void {
  if (!existsSync(dir))
    throw new SlmError(
      'MODEL_NOT_FOUND',
      `model folder ${dir} does not exist. Expected a Hugging Face model folder (config.json + *.safetensors); create one with \`slm-train init-model --preset tiny --out ${dir}\`.`,
    );
  if (!statSync(dir).isDirectory())
    throw new SlmError('MODEL_NOT_FOUND', `${dir} is a file; expected a Hugging Face model folder (config.json + *.safetensors).`);
  if (!existsSync(join(dir, 'config.json'))) {
    // A PEFT adapter folder given where the base model goes (`--model runs/x/adapter`).
    const adapter = adapterBase(dir);
    if (adapter !== undefined)
      throw new SlmError(
        'MODEL_CONFIG_INVALID',
        `${dir} has no config.json: it is a PEFT adapter folder (adapter_config.json), not a model. Pass it with --adapter (model.adapter in a config) and the base model${adapter ? ` (${adapter}, its base_model_name_or_path)` : ''} with --model (model.path).`,
        { adapter: dir, base: adapter || undefined },
      );
    throw new SlmError(
      'MODEL_CONFIG_INVALID',
      `${dir} has no config.json. Expected a Hugging Face model folder (config.json + model.safetensors or shards).`,
    );
  }
}

/** The base model an adapter folder names ('' when it names none), or undefined when `dir` holds no adapter_config.json. */
function adapterBase(dir: string): string | undefined {
  const file = join(dir, 'adapter_config.json');
  if (!existsSync(file)) return undefined;
  try {
    const base = (JSON.parse(readFileSync(file, 'utf8')) as { base_model_name_or_path?: unknown }).base_model_name_or_path;
    return typeof base === 'string' ? base : '';
  } catch {
    return '';
  }
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
      `${where}: model_type ${describe(modelType)} is not supported; supported: ${SUPPORTED_MODEL_TYPES.join(', ')}. ` +
        `Use a checkpoint of one of these architectures (e.g. ${SUPPORTED_MODEL_TYPES.map((k) => ARCHITECTURES[k].example).join(', ')}).`,
    );
  const arch = ARCHITECTURES[modelType as SupportedModelType];
  const int = (k: string, dflt?: number): number => {
    const v = raw[k] ?? dflt;
    if (typeof v !== 'number' || !Number.isInteger(v) || v <= 0)
      throw new SlmError('MODEL_CONFIG_INVALID', `${where}: expected a positive integer for "${k}", found ${describe(raw[k])}.`);
    return v;
  };
  const num = (k: string, dflt: number): number => {
    const v = raw[k] ?? dflt;
    if (typeof v !== 'number' || !(v > 0))
      throw new SlmError('MODEL_CONFIG_INVALID', `${where}: expected a positive number for "${k}", found ${describe(raw[k])}.`);
    return v;
  };
  const numIn = (o: Record<string, unknown>, k: string, name: string): number => {
    const v = o[k];
    if (typeof v !== 'number' || !(v > 0))
      throw new SlmError('MODEL_CONFIG_INVALID', `${where}: expected a positive number for "${name}", found ${describe(v)}.`);
    return v;
  };
  const heads = int('num_attention_heads');
  const hidden = int('hidden_size');
  // transformers 5 writes `rope_parameters` ({rope_theta, rope_type, factor, ...}) where earlier
  // checkpoints have `rope_theta` and `rope_scaling`; both are read, the older keys first.
  const rp =
    raw.rope_parameters !== null && typeof raw.rope_parameters === 'object' && !Array.isArray(raw.rope_parameters)
      ? (raw.rope_parameters as Record<string, unknown>)
      : undefined;
  const rope = ropeScaling(raw.rope_scaling ?? rp, where);
  if (raw.use_sliding_window === true)
    throw new SlmError(
      'MODEL_CONFIG_INVALID',
      `${where}: use_sliding_window is true, but the engine implements full attention only. Set "use_sliding_window": false (as the released Qwen2.5 / Qwen3 checkpoints have it).`,
    );
  const cfg: ModelConfig = {
    model_type: modelType as SupportedModelType,
    ...arch.switches(raw),
    ...rope,
    vocab_size: int('vocab_size'),
    hidden_size: hidden,
    intermediate_size: int('intermediate_size'),
    num_hidden_layers: int('num_hidden_layers'),
    num_attention_heads: heads,
    num_key_value_heads: int('num_key_value_heads', heads),
    head_dim: int('head_dim', Math.floor(hidden / heads)),
    rope_theta:
      raw.rope_theta === undefined && rp?.rope_theta !== undefined
        ? numIn(rp, 'rope_theta', 'rope_parameters.rope_theta')
        : num('rope_theta', 1e6),
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

type RopeFields = Pick<
  NativeModelConfig,
  'rope_type' | 'rope_factor' | 'rope_low_freq_factor' | 'rope_high_freq_factor' | 'rope_original_max_position_embeddings'
>;

/** config.json's `rope_scaling` (null, `{rope_type}` or the older `{type}`), checked against SUPPORTED_ROPE_TYPES. */
function ropeScaling(rs: unknown, where: string): RopeFields {
  if (rs === null || rs === undefined) return { rope_type: 'default' };
  if (typeof rs !== 'object' || Array.isArray(rs))
    throw new SlmError('MODEL_CONFIG_INVALID', `${where}: expected "rope_scaling" to be null or an object, found ${describe(rs)}.`);
  const r = rs as Record<string, unknown>;
  const type = r.rope_type ?? r.type ?? 'default';
  if (typeof type !== 'string' || !(SUPPORTED_ROPE_TYPES as readonly string[]).includes(type))
    throw new SlmError(
      'MODEL_CONFIG_INVALID',
      `${where}: rope_scaling type ${typeof type === 'string' ? JSON.stringify(type) : describe(type)} is not supported; supported: none, ${SUPPORTED_ROPE_TYPES.join(', ')}. ` +
        'Use a checkpoint without this RoPE scaling, or remove rope_scaling from config.json to run within the original context length.',
    );
  if (type === 'default') return { rope_type: 'default' };
  const num = (k: string): number => {
    const v = r[k];
    if (typeof v !== 'number' || !(v > 0))
      throw new SlmError(
        'MODEL_CONFIG_INVALID',
        `${where}: llama3 rope_scaling needs a positive number "${k}" (as transformers requires), found ${describe(v)}.`,
      );
    return v;
  };
  const out = {
    rope_type: 'llama3',
    rope_factor: num('factor'),
    rope_low_freq_factor: num('low_freq_factor'),
    rope_high_freq_factor: num('high_freq_factor'),
    rope_original_max_position_embeddings: num('original_max_position_embeddings'),
  };
  if (out.rope_high_freq_factor <= out.rope_low_freq_factor)
    throw new SlmError(
      'MODEL_CONFIG_INVALID',
      `${where}: llama3 rope_scaling needs high_freq_factor > low_freq_factor, found ${out.rope_high_freq_factor} <= ${out.rope_low_freq_factor}.`,
    );
  return out;
}

export function nativeConfig(c: ModelConfig): NativeModelConfig {
  const { raw: _raw, max_position_embeddings: _m, bos_token_id: _b, eos_token_id: _e, torch_dtype: _t, ...native } = c;
  return native;
}
