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

export const LORA_TARGETS = ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'] as const;
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
export const ADAPTER_CONFIG = 'adapter_config.json';
export const VALUE_HEAD = 'value_head.safetensors';

function moduleName(layer: number, t: LoraTarget): string {
  return `model.layers.${layer}.${t.endsWith('_proj') && ['gate_proj', 'up_proj', 'down_proj'].includes(t) ? 'mlp' : 'self_attn'}.${t}`;
}

export function checkLoraSpec(s: LoraSpec, numLayers?: number): LoraSpec {
  if (!Number.isInteger(s.r) || s.r < 1) throw new SlmError('ADAPTER_INVALID', `LoRA r must be a positive integer, found ${describe(s.r)}.`);
  if (!(s.alpha > 0)) throw new SlmError('ADAPTER_INVALID', `lora_alpha must be positive, found ${describe(s.alpha)}.`);
  if (!(s.dropout >= 0 && s.dropout < 1)) throw new SlmError('ADAPTER_INVALID', `lora_dropout must be in [0, 1), found ${describe(s.dropout)}.`);
  if (!s.targets.length) throw new SlmError('ADAPTER_INVALID', `target_modules is empty; expected some of ${LORA_TARGETS.join(', ')}.`);
  for (const t of s.targets)
    if (!(LORA_TARGETS as readonly string[]).includes(t)) {
      const hint = closest(t, LORA_TARGETS);
      throw new SlmError('ADAPTER_TARGET_UNKNOWN', `target module "${t}" does not exist in Qwen3${hint ? ` (did you mean "${hint}"?)` : ''}; expected some of ${LORA_TARGETS.join(', ')}.`);
    }
  if (s.layers && numLayers !== undefined)
    for (const l of s.layers)
      if (!Number.isInteger(l) || l < 0 || l >= numLayers) throw new SlmError('ADAPTER_INVALID', `layer ${describe(l)} is not in the model (it has ${numLayers} layers).`);
  return s;
}

/** Reads and validates a PEFT adapter_config.json. */
export function readAdapterConfig(dir: string, numLayers: number): { spec: LoraSpec; raw: Record<string, unknown>; weights: string; valueHead?: string } {
  const cfgPath = join(dir, ADAPTER_CONFIG);
  if (!existsSync(dir)) throw new SlmError('ADAPTER_NOT_FOUND', `adapter folder ${dir} does not exist. Expected a PEFT folder (adapter_config.json + adapter_model.safetensors).`);
  if (!existsSync(cfgPath)) throw new SlmError('ADAPTER_NOT_FOUND', `${dir} has no adapter_config.json: expected a PEFT LoRA adapter folder.`);
  let raw: Record<string, unknown>;
  try {
    raw = JSON.parse(readFileSync(cfgPath, 'utf8'));
  } catch (e) {
    throw new SlmError('ADAPTER_INVALID', `${cfgPath} is not valid JSON: ${(e as Error).message}.`);
  }
  if (raw.peft_type !== 'LORA') throw new SlmError('NOT_SUPPORTED', `${cfgPath}: peft_type ${describe(raw.peft_type)} is not supported; only LORA adapters are.`);
  if (raw.use_dora === true) throw new SlmError('NOT_SUPPORTED', `${cfgPath}: DoRA adapters (use_dora) are not supported.`);
  if (raw.bias !== undefined && raw.bias !== 'none') throw new SlmError('NOT_SUPPORTED', `${cfgPath}: bias "${raw.bias}" is not supported; only "none".`);
  if (raw.modules_to_save && (raw.modules_to_save as unknown[]).length) throw new SlmError('NOT_SUPPORTED', `${cfgPath}: modules_to_save is not supported.`);
  for (const k of ['rank_pattern', 'alpha_pattern'])
    if (raw[k] && Object.keys(raw[k] as object).length) throw new SlmError('NOT_SUPPORTED', `${cfgPath}: per-module ${k} is not supported.`);
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
    { r: Number(raw.r), alpha: Number(raw.lora_alpha ?? raw.r), dropout: Number(raw.lora_dropout ?? 0), rslora: raw.use_rslora === true, targets, layers },
    numLayers,
  );
  const weights = join(dir, ADAPTER_WEIGHTS);
  if (!existsSync(weights))
    throw new SlmError('ADAPTER_NOT_FOUND', `${dir} has adapter_config.json but no ${ADAPTER_WEIGHTS}${existsSync(join(dir, 'adapter_model.bin')) ? ' (adapter_model.bin is a PyTorch pickle: re-save with safe_serialization=True)' : ''}.`);
  const vh = join(dir, VALUE_HEAD);
  return { spec, raw, weights, valueHead: existsSync(vh) ? vh : undefined };
}

/** The adapter_config.json PEFT writes for this spec. */
export function adapterConfigJson(spec: LoraSpec, baseModel: string): Record<string, unknown> {
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
