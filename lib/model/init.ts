/**
 * `slm-train init-model`: a randomly initialised checkpoint of a supported architecture (Qwen3,
 * Qwen2/2.5, Llama 3.x) in Hugging Face layout (config.json, model.safetensors,
 * generation_config.json), initialised as HF does (normal(0, initializer_range) for matrices, ones
 * for norms, zeros for biases), deterministic for a given seed.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { SlmError } from '../errors.js';
import { writeSafetensors, type TensorSpec, type StDtype, f32ToBf16Bits } from './safetensors.js';
import { ARCHITECTURES, SUPPORTED_MODEL_TYPES, parseModelConfig, type SupportedModelType } from './config.js';

/** The Qwen3 tokenizer's size rounded up as the real checkpoints do (151,669 ids -> 151,936 rows). */
const QWEN3_VOCAB = 151936;

export interface Preset {
  description: string;
  config: Record<string, unknown>;
}

/** The config.json fields of each architecture that the presets do not set (as the released models have them). */
export const FAMILIES: Record<SupportedModelType, Record<string, unknown>> = {
  // Qwen3-4B-Instruct-2507
  qwen3: {
    architectures: [ARCHITECTURES.qwen3.hfClass],
    model_type: 'qwen3',
    hidden_act: 'silu',
    rope_theta: 1000000.0,
    rope_scaling: null,
    rms_norm_eps: 1e-6,
    attention_bias: false,
    attention_dropout: 0.0,
    use_sliding_window: false,
    sliding_window: null,
    initializer_range: 0.02,
    use_cache: true,
    bos_token_id: 151643,
    eos_token_id: 151645,
    max_position_embeddings: 40960,
    vocab_size: QWEN3_VOCAB,
  },
  // Qwen2.5-3B-Instruct
  qwen2: {
    architectures: [ARCHITECTURES.qwen2.hfClass],
    model_type: 'qwen2',
    hidden_act: 'silu',
    rope_theta: 1000000.0,
    rope_scaling: null,
    rms_norm_eps: 1e-6,
    attention_dropout: 0.0,
    use_sliding_window: false,
    sliding_window: 32768,
    initializer_range: 0.02,
    use_cache: true,
    bos_token_id: 151643,
    eos_token_id: 151645,
    max_position_embeddings: 32768,
    vocab_size: 151936,
  },
  // Llama-3.2-3B-Instruct
  llama: {
    architectures: [ARCHITECTURES.llama.hfClass],
    model_type: 'llama',
    hidden_act: 'silu',
    rope_theta: 500000.0,
    rope_scaling: {
      rope_type: 'llama3',
      factor: 32.0,
      low_freq_factor: 1.0,
      high_freq_factor: 4.0,
      original_max_position_embeddings: 8192,
    },
    rms_norm_eps: 1e-5,
    attention_bias: false,
    mlp_bias: false,
    attention_dropout: 0.0,
    initializer_range: 0.02,
    pretraining_tp: 1,
    use_cache: true,
    bos_token_id: 128000,
    eos_token_id: [128001, 128008, 128009],
    max_position_embeddings: 131072,
    vocab_size: 128256,
  },
};

/** Sizes; the architecture's own fields come from FAMILIES. */
export const PRESETS: Record<string, Preset> = {
  tiny: {
    description: '~10M parameters (9.7M of them the tied 151,936-row Qwen embedding): tests and quick runs',
    config: {
      hidden_size: 64,
      intermediate_size: 192,
      num_hidden_layers: 2,
      num_attention_heads: 4,
      num_key_value_heads: 2,
      head_dim: 32,
      tie_word_embeddings: true,
    },
  },
  small: {
    description: '~103M parameters (8 layers, hidden 512): weights far larger than the CPU caches, for benchmarks',
    config: {
      hidden_size: 512,
      intermediate_size: 1536,
      num_hidden_layers: 8,
      num_attention_heads: 8,
      num_key_value_heads: 4,
      head_dim: 64,
      tie_word_embeddings: true,
    },
  },
};

/** xorshift128+ with Box-Muller: fast, seeded, good enough for initialisation. */
class Rng {
  private s0: bigint;
  private s1: bigint;
  private spare: number | null = null;
  constructor(seed: number) {
    this.s0 = BigInt(seed) * 0x9e3779b97f4a7c15n + 1n;
    this.s1 = (BigInt(seed) ^ 0xdeadbeefcafebaben) | 1n;
    for (let i = 0; i < 10; i++) this.nextU();
  }
  private nextU(): number {
    const M = (1n << 64n) - 1n;
    let x = this.s0;
    const y = this.s1;
    this.s0 = y;
    x ^= (x << 23n) & M;
    this.s1 = x ^ y ^ (x >> 17n) ^ (y >> 26n);
    return Number(((this.s1 + y) & M) >> 11n) / 9007199254740992;
  }
  normal(): number {
    if (this.spare !== null) {
      const s = this.spare;
      this.spare = null;
      return s;
    }
    const u = Math.max(this.nextU(), 1e-300);
    const v = this.nextU();
    const r = Math.sqrt(-2 * Math.log(u));
    this.spare = r * Math.sin(2 * Math.PI * v);
    return r * Math.cos(2 * Math.PI * v);
  }
}

/** Faster bulk normals: a small seeded table of Box-Muller pairs walked with a seeded LCG stride. */
function normalFiller(seed: number, std: number, dtype: StDtype, mean = 0): (out: Uint8Array, off: number) => void {
  const rng = new Rng(seed);
  const table = new Float32Array(1 << 16);
  for (let i = 0; i < table.length; i++) table[i] = mean + rng.normal() * std;
  let state = (seed * 2654435761) >>> 0;
  const scratch = new Float32Array(1);
  return (out) => {
    if (dtype === 'F32') {
      const f = new Float32Array(out.buffer, out.byteOffset, out.byteLength / 4);
      for (let i = 0; i < f.length; i++) {
        state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
        f[i] = table[state >>> 16];
      }
    } else {
      const u = new Uint16Array(out.buffer, out.byteOffset, out.byteLength / 2);
      for (let i = 0; i < u.length; i++) {
        state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
        u[i] = f32ToBf16Bits(table[state >>> 16], scratch);
      }
    }
  };
}

function constFiller(dtype: StDtype, value: 0 | 1): (out: Uint8Array) => void {
  return (out) => {
    if (dtype === 'F32') new Float32Array(out.buffer, out.byteOffset, out.byteLength / 4).fill(value);
    else new Uint16Array(out.buffer, out.byteOffset, out.byteLength / 2).fill(value ? 0x3f80 : 0);
  };
}

/** The dtypes `init-model` writes weights in. */
export const STORAGE_DTYPES = ['float32', 'bfloat16'] as const;

export interface InitOptions {
  preset: string;
  out: string;
  /** The architecture (config.json's model_type); default qwen3. */
  modelType?: string;
  seed?: number;
  dtype?: (typeof STORAGE_DTYPES)[number];
  /** Overrides of config fields (e.g. a smaller vocab_size for a model with its own tokenizer, or rope_scaling). */
  overrides?: Record<string, unknown>;
  /**
   * Standard deviation of the (tied) embedding. HF's 0.02 caps a tiny model's logits near
   * 0.02 * hidden_size (~1.3 at hidden 64), too flat for a frozen output layer to ever predict
   * confidently; models meant to be trained with LoRA alone use a larger value.
   */
  embedStd?: number;
  /**
   * For tests against references: biases drawn from normal(0, biasStd) and norm weights from
   * normal(1, normStd) instead of HF's zeros and ones, so that a bias or norm the engine mishandled
   * would change the output. Default 0 (HF's initialisation).
   */
  biasStd?: number;
  normStd?: number;
}

export function initModel(opts: InitOptions): { dir: string; parameters: number; config: Record<string, unknown> } {
  const preset = PRESETS[opts.preset];
  if (!preset)
    throw new SlmError('ARGUMENT_INVALID', `unknown preset "${opts.preset}"; expected one of: ${Object.keys(PRESETS).join(', ')}.`);
  const modelType = opts.modelType ?? 'qwen3';
  if (!(SUPPORTED_MODEL_TYPES as string[]).includes(modelType))
    throw new SlmError('ARGUMENT_INVALID', `unknown model type "${modelType}"; expected one of: ${SUPPORTED_MODEL_TYPES.join(', ')}.`);
  const dtype: StDtype = opts.dtype === 'bfloat16' ? 'BF16' : 'F32';
  const sizes = preset.config;
  const c: Record<string, unknown> = {
    ...FAMILIES[modelType as SupportedModelType],
    ...sizes,
    ...(modelType === 'llama' ? {} : { max_window_layers: sizes.num_hidden_layers }),
    ...(opts.overrides ?? {}),
    torch_dtype: opts.dtype ?? 'float32',
  };
  // The same validation and switches the engine uses: which biases and norms this architecture has.
  const arch = parseModelConfig(c, 'init-model config');
  const n = (k: string) => c[k] as number;
  const H = n('hidden_size'),
    I = n('intermediate_size'),
    V = n('vocab_size'),
    D = arch.head_dim;
  const nq = n('num_attention_heads'),
    nkv = arch.num_key_value_heads,
    std = (c.initializer_range as number | undefined) ?? 0.02;
  let seed = opts.seed ?? 0;
  const tensors: TensorSpec[] = [];
  const mat = (name: string, shape: number[]) => tensors.push({ name, dtype, shape, fill: normalFiller(++seed * 7919 + 13, std, dtype) });
  const ones = (name: string, n: number) =>
    tensors.push({
      name,
      dtype,
      shape: [n],
      fill: opts.normStd ? normalFiller(++seed * 7919 + 13, opts.normStd, dtype, 1) : constFiller(dtype, 1),
    });
  const bias = (name: string, n: number) =>
    tensors.push({
      name,
      dtype,
      shape: [n],
      fill: opts.biasStd ? normalFiller(++seed * 7919 + 13, opts.biasStd, dtype) : constFiller(dtype, 0),
    });
  const proj = (name: string, out: number, inp: number, hasBias: boolean) => {
    mat(name + '.weight', [out, inp]);
    if (hasBias) bias(name + '.bias', out);
  };
  tensors.push({
    name: 'model.embed_tokens.weight',
    dtype,
    shape: [V, H],
    fill: normalFiller(++seed * 7919 + 13, opts.embedStd ?? std, dtype),
  });
  for (let i = 0; i < n('num_hidden_layers'); i++) {
    const p = `model.layers.${i}.`;
    ones(p + 'input_layernorm.weight', H);
    ones(p + 'post_attention_layernorm.weight', H);
    proj(p + 'self_attn.q_proj', nq * D, H, arch.qkv_bias);
    proj(p + 'self_attn.k_proj', nkv * D, H, arch.qkv_bias);
    proj(p + 'self_attn.v_proj', nkv * D, H, arch.qkv_bias);
    proj(p + 'self_attn.o_proj', H, nq * D, arch.o_bias);
    if (arch.qk_norm) {
      ones(p + 'self_attn.q_norm.weight', D);
      ones(p + 'self_attn.k_norm.weight', D);
    }
    proj(p + 'mlp.gate_proj', I, H, arch.mlp_bias);
    proj(p + 'mlp.up_proj', I, H, arch.mlp_bias);
    proj(p + 'mlp.down_proj', H, I, arch.mlp_bias);
  }
  ones('model.norm.weight', H);
  if (c.tie_word_embeddings !== true) mat('lm_head.weight', [V, H]);
  mkdirSync(opts.out, { recursive: true });
  writeSafetensors(join(opts.out, 'model.safetensors'), tensors, { format: 'pt' });
  writeFileSync(join(opts.out, 'config.json'), JSON.stringify(c, null, 2) + '\n');
  writeFileSync(
    join(opts.out, 'generation_config.json'),
    JSON.stringify(
      {
        bos_token_id: c.bos_token_id,
        eos_token_id: [...new Set([c.eos_token_id, c.bos_token_id].flat())],
        do_sample: true,
        temperature: 0.7,
        top_p: 0.8,
        top_k: 20,
      },
      null,
      2,
    ) + '\n',
  );
  const parameters = tensors.reduce((a, t) => a + t.shape.reduce((x, y) => x * y, 1), 0);
  return { dir: opts.out, parameters, config: c };
}
