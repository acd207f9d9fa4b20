/**
 * PEFT LoRA adapters: `adapter_config.json` + `adapter_model.safetensors` (tensor names
 * `base_model.model.<module>.lora_A.weight` [r, in] and `lora_B.weight` [out, r]; scaling
 * lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora). A PPO value head, when present, is saved
 * beside them as `value_head.safetensors` (value_head.weight [hidden], value_head.bias [1]) — a file
 * PEFT and vLLM ignore.
 */
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { SlmError, closest, describe } from '../errors.js';
import { readSafetensorsHeader } from '../model/safetensors.js';
import type { NativeModelConfig } from '../binding/types.js';

/** The attention projections of a decoder layer (the default lora.targets). */
export const ATTENTION_TARGETS = ['q_proj', 'k_proj', 'v_proj', 'o_proj'] as const;
/** The MLP projections of a decoder layer. */
const MLP_TARGETS = ['gate_proj', 'up_proj', 'down_proj'] as const;
/** Every projection a LoRA adapter can target (lora.targets, PEFT target_modules). */
export const LORA_TARGETS = [...ATTENTION_TARGETS, ...MLP_TARGETS] as const;
export type LoraTarget = (typeof LORA_TARGETS)[number];

export interface LoraSpec {
  r: number;
  alpha: number;
  dropout: number;
  rslora: boolean;
  targets: LoraTarget[];
  /** Layers that get adapters; undefined = all. */
  layers?: number[];
}

export const ADAPTER_WEIGHTS = 'adapter_model.safetensors';
const ADAPTER_CONFIG = 'adapter_config.json';
export const VALUE_HEAD = 'value_head.safetensors';
/** PPO's separate critic: its LoRA A and B under the actor adapter's PEFT names (same rank and targets). */
export const CRITIC_ADAPTER = 'critic_adapter.safetensors';

function moduleName(layer: number, t: LoraTarget): string {
  return `model.layers.${layer}.${(MLP_TARGETS as readonly string[]).includes(t) ? 'mlp' : 'self_attn'}.${t}`;
}

export function checkLoraSpec(spec: LoraSpec, numLayers?: number): LoraSpec {
  if (!Number.isInteger(spec.r) || spec.r < 1)
    throw new SlmError('ADAPTER_INVALID', `LoRA r must be a positive integer, found ${describe(spec.r)}.`);
  if (!(spec.alpha > 0)) throw new SlmError('ADAPTER_INVALID', `lora_alpha must be positive, found ${describe(spec.alpha)}.`);
  if (!(spec.dropout >= 0 && spec.dropout < 1))
    throw new SlmError('ADAPTER_INVALID', `lora_dropout must be in [0, 1), found ${describe(spec.dropout)}.`);
  if (!spec.targets.length) throw new SlmError('ADAPTER_INVALID', `target_modules is empty; expected some of ${LORA_TARGETS.join(', ')}.`);
  for (const t of spec.targets)
    if (!(LORA_TARGETS as readonly string[]).includes(t)) {
      const hint = closest(t, LORA_TARGETS);
      throw new SlmError(
        'ADAPTER_TARGET_UNKNOWN',
        `target module "${t}" does not exist in Qwen3${hint ? ` (did you mean "${hint}"?)` : ''}; expected some of ${LORA_TARGETS.join(', ')}.`,
      );
    }
  if (spec.layers && numLayers !== undefined)
    for (const l of spec.layers)
      if (!Number.isInteger(l) || l < 0 || l >= numLayers)
        throw new SlmError('ADAPTER_INVALID', `layer ${describe(l)} is not in the model (it has ${numLayers} layers).`);
  return spec;
}

/** Reads and validates a PEFT adapter_config.json. */
export function readAdapterConfig(
  dir: string,
  numLayers: number,
): { spec: LoraSpec; raw: Record<string, unknown>; weights: string; valueHead?: string; critic?: string } {
  const cfgPath = join(dir, ADAPTER_CONFIG);
  if (!existsSync(dir))
    throw new SlmError(
      'ADAPTER_NOT_FOUND',
      `adapter folder ${dir} does not exist. Expected a PEFT folder (adapter_config.json + adapter_model.safetensors).`,
    );
  if (!existsSync(cfgPath))
    throw new SlmError('ADAPTER_NOT_FOUND', `${dir} has no adapter_config.json: expected a PEFT LoRA adapter folder.`);
  let raw: Record<string, unknown>;
  try {
    raw = JSON.parse(readFileSync(cfgPath, 'utf8'));
  } catch (e) {
    throw new SlmError('ADAPTER_INVALID', `${cfgPath} is not valid JSON: ${(e as Error).message}.`);
  }
  if (raw.peft_type !== 'LORA')
    throw new SlmError('NOT_SUPPORTED', `${cfgPath}: peft_type ${describe(raw.peft_type)} is not supported; only LORA adapters are.`);
  if (raw.use_dora === true) throw new SlmError('NOT_SUPPORTED', `${cfgPath}: DoRA adapters (use_dora) are not supported.`);
  if (raw.bias !== undefined && raw.bias !== 'none')
    throw new SlmError('NOT_SUPPORTED', `${cfgPath}: bias "${raw.bias}" is not supported; only "none".`);
  if (raw.modules_to_save && (raw.modules_to_save as unknown[]).length)
    throw new SlmError('NOT_SUPPORTED', `${cfgPath}: modules_to_save is not supported.`);
  for (const k of ['rank_pattern', 'alpha_pattern'])
    if (raw[k] && Object.keys(raw[k] as object).length)
      throw new SlmError('NOT_SUPPORTED', `${cfgPath}: per-module ${k} is not supported.`);
  let targets: LoraTarget[];
  const tm = raw.target_modules;
  if (Array.isArray(tm)) targets = tm.map(String) as LoraTarget[];
  else if (typeof tm === 'string') {
    // PEFT: a string is a regex that must match the full module name.
    const re = new RegExp(`^(?:${tm})$`);
    targets = LORA_TARGETS.filter((t) => Array.from({ length: numLayers }, (_, i) => moduleName(i, t)).some((n) => re.test(n)));
  } else throw new SlmError('ADAPTER_INVALID', `${cfgPath}: target_modules must be a list or a regex string, found ${describe(tm)}.`);
  const ltt = raw.layers_to_transform;
  const layers = ltt === null || ltt === undefined ? undefined : Array.isArray(ltt) ? ltt.map(Number) : [Number(ltt)];
  const spec = checkLoraSpec(
    {
      r: Number(raw.r),
      alpha: Number(raw.lora_alpha ?? raw.r),
      dropout: Number(raw.lora_dropout ?? 0),
      rslora: raw.use_rslora === true,
      targets,
      layers,
    },
    numLayers,
  );
  const weights = join(dir, ADAPTER_WEIGHTS);
  if (!existsSync(weights))
    throw new SlmError(
      'ADAPTER_NOT_FOUND',
      `${dir} has adapter_config.json but no ${ADAPTER_WEIGHTS}${existsSync(join(dir, 'adapter_model.bin')) ? ' (adapter_model.bin is a PyTorch pickle: re-save with safe_serialization=True)' : ''}.`,
    );
  const vh = join(dir, VALUE_HEAD);
  const critic = join(dir, CRITIC_ADAPTER);
  return { spec, raw, weights, valueHead: existsSync(vh) ? vh : undefined, critic: existsSync(critic) ? critic : undefined };
}

/** The dimensions of a model that decide its LoRA tensors' shapes (a subset of config.json). */
export type ProjectionDims = Pick<
  NativeModelConfig,
  'hidden_size' | 'intermediate_size' | 'num_hidden_layers' | 'num_attention_heads' | 'num_key_value_heads' | 'head_dim'
>;

/** [out_features, in_features] of a projection, and the config.json keys they come from. */
function projection(target: LoraTarget, dims: ProjectionDims): { out: number; in: number; why: [string, string] } {
  const q = `num_attention_heads ${dims.num_attention_heads} x head_dim ${dims.head_dim}`;
  const kv = `num_key_value_heads ${dims.num_key_value_heads} x head_dim ${dims.head_dim}`;
  const h = `hidden_size ${dims.hidden_size}`;
  const i = `intermediate_size ${dims.intermediate_size}`;
  switch (target) {
    case 'q_proj':
      return { out: dims.num_attention_heads * dims.head_dim, in: dims.hidden_size, why: [q, h] };
    case 'k_proj':
    case 'v_proj':
      return { out: dims.num_key_value_heads * dims.head_dim, in: dims.hidden_size, why: [kv, h] };
    case 'o_proj':
      return { out: dims.hidden_size, in: dims.num_attention_heads * dims.head_dim, why: [h, q] };
    case 'gate_proj':
    case 'up_proj':
      return { out: dims.intermediate_size, in: dims.hidden_size, why: [i, h] };
    case 'down_proj':
      return { out: dims.hidden_size, in: dims.intermediate_size, why: [h, i] };
  }
}

/**
 * Checks a PEFT adapter's tensors against the model it is loaded into before anything is loaded, and
 * reports every misfit at once: how many tensors have other shapes (the first named with both shapes
 * and the config.json dimension behind them), how many are missing or left over, and the base model
 * adapter_config.json says the adapter was made for. Throws ADAPTER_MISMATCH; returns when it fits.
 */
export function checkAdapterFits(
  dir: string,
  spec: LoraSpec,
  raw: Record<string, unknown>,
  weights: string,
  dims: ProjectionDims,
  modelDir: string,
): void {
  const header = readSafetensorsHeader(weights);
  const have = new Map(Object.entries(header).map(([n, e]) => [n.replace('.default.weight', '.weight'), e.shape]));
  const wrong: string[] = [];
  const missing: string[] = [];
  let expected = 0;
  const layers = spec.layers ?? Array.from({ length: dims.num_hidden_layers }, (_, i) => i);
  for (const l of layers)
    for (const t of spec.targets) {
      const pr = projection(t, dims);
      const base = `base_model.model.${moduleName(l, t)}`;
      for (const [part, want, why] of [
        ['lora_A', [spec.r, pr.in], `r=${spec.r}, in_features = ${pr.why[1]}`],
        ['lora_B', [pr.out, spec.r], `out_features = ${pr.why[0]}, r=${spec.r}`],
      ] as const) {
        expected++;
        const name = `${base}.${part}.weight`;
        const shape = have.get(name);
        have.delete(name);
        if (!shape) missing.push(name);
        else if (shape.join() !== want.join()) wrong.push(`${name} [${shape.join(', ')}], this model needs [${want.join(', ')}] (${why})`);
      }
    }
  const extra = [...have.keys()].filter((n) => n.includes('.lora_'));
  if (!wrong.length && !missing.length && !extra.length) return;
  const adapterLayers = new Set([...Object.keys(header)].map((n) => /\.layers\.(\d+)\./.exec(n)?.[1]).filter((x) => x !== undefined)).size;
  const parts: string[] = [];
  if (wrong.length) parts.push(`${wrong.length} of ${expected} LoRA tensors have other shapes (e.g. ${wrong[0]})`);
  if (missing.length)
    parts.push(
      `${missing.length} of ${expected} LoRA tensors are missing (e.g. ${missing[0]}${adapterLayers < layers.length ? `; the adapter covers ${adapterLayers} layers, this model has ${dims.num_hidden_layers}` : ''})`,
    );
  if (extra.length) parts.push(`${extra.length} adapter tensors have no place in this model (e.g. ${extra[0]})`);
  const base = raw.base_model_name_or_path;
  throw new SlmError(
    'ADAPTER_MISMATCH',
    `adapter ${dir} does not fit the model ${modelDir}: ${parts.join('; ')}. ${typeof base === 'string' && base ? `Its adapter_config.json says it was made for base_model_name_or_path "${base}": load it with that model, or train an adapter for this one.` : 'It was made for another base model (or another rank than adapter_config.json says): load it with the model it was trained on.'}`,
    { wrong: wrong.length, missing: missing.length, extra: extra.length },
  );
}

/** The adapter_config.json PEFT writes for this spec. */
function adapterConfigJson(spec: LoraSpec, baseModel: string): Record<string, unknown> {
  return {
    alpha_pattern: {},
    auto_mapping: null,
    base_model_name_or_path: baseModel,
    bias: 'none',
    fan_in_fan_out: false,
    inference_mode: true,
    init_lora_weights: true,
    layers_pattern: null,
    layers_to_transform: spec.layers ?? null,
    lora_alpha: spec.alpha,
    lora_dropout: spec.dropout,
    modules_to_save: null,
    peft_type: 'LORA',
    r: spec.r,
    rank_pattern: {},
    revision: null,
    target_modules: [...spec.targets].sort(),
    task_type: 'CAUSAL_LM',
    use_dora: false,
    use_rslora: spec.rslora,
  };
}

export function writeAdapterConfig(dir: string, spec: LoraSpec, baseModel: string): void {
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, ADAPTER_CONFIG), JSON.stringify(adapterConfigJson(spec, baseModel), null, 2) + '\n');
}

/** The values of `params` that are NaN or inf: their count and the tensors holding them; undefined when all are finite. */
export function nonFinite(params: Record<string, Float32Array>): { count: number; tensors: string[] } | undefined {
  let count = 0;
  const tensors: string[] = [];
  for (const [name, v] of Object.entries(params)) {
    let n = 0;
    for (let i = 0; i < v.length; i++) if (!Number.isFinite(v[i])) n++;
    if (n) tensors.push(name);
    count += n;
  }
  return count ? { count, tensors } : undefined;
}
