/**
 * The shape of a resolved config: every key present (defaults filled, derived defaults resolved,
 * paths absolute). Mirrors lib/config/schema.ts by hand; test/config-types.test.ts checks that both
 * agree (keys, value types, enum values; every default a value of its key).
 */

import type { LoraTarget } from '../engine/adapter.js';
import type { ComputeDtype } from '../engine/types.js';
/**
 * What `slm-train train` can run: sft, an RL algorithm of lib/train/rl/registry.ts (grpo, ppo, rloo,
 * rft, or one registered by `registerAlgorithm`), eval. The schema's `stage` enum holds the names.
 */
export type Stage = string;

export interface ModelConfig {
  path: string;
  adapter: string | null;
  dtype: ComputeDtype;
  device: string;
  threads: number;
  /** A chat template file, or a shipped template's name (chatml, qwen3, qwen3-instruct); null = the model folder's own. */
  chat_template: string | null;
}

export interface LoraConfig {
  r: number;
  alpha: number;
  dropout: number;
  rslora: boolean;
  targets: LoraTarget[];
  layers: number[] | null;
}

export interface DataConfig {
  questions: string | null;
  /** Evaluate on this file (every row of data.questions then trains); null = data.split of data.questions. */
  eval_questions: string | null;
  corpus: string | null;
  index: string | null;
  sft: string | null;
  split: { train_fraction: number; seed: number | null };
  exclude_leaking: boolean;
  /** RL: this many of the train questions, drawn with data.split.seed (null = all). */
  train_questions: number | null;
}

export interface ProtocolConfig {
  kind: 'code' | 'tags' | 'direct';
  max_turns: number;
  max_turns_eval: number;
  /** null: the protocol's own (tags: searches, as Search-R1; code and direct: generations). */
  turns_count: 'searches' | 'generations' | null;
  max_new_tokens: number;
  max_context: number;
  tool_output_chars: number;
  top_k: number;
  /** tags: an environment reply keeps its first N tokens (Search-R1's max_obs_length); null = no cut. */
  max_observation_tokens: number | null;
  system_prompt: string | null;
  /** tags: the user message template, with {question}. */
  instruction: string;
  /** tags: start from a question row's own chat prompt when it has one. */
  use_data_prompt: boolean;
  final_turn_notice: string | null;
  /** The chat template's enable_thinking for rollouts, evaluation and SFT; null = not passed. */
  enable_thinking: boolean | null;
  /** direct: the user message template, with {question}; null = the protocol's own. */
  direct_instruction: string | null;
  prompts_from_sft: boolean;
  question_variable: string | null;
  final_answer: boolean;
  /** Training rollouts: the text turn 1 / the last turn starts with; whether the loss covers it. */
  prefill_first: string | null;
  prefill_final: string | null;
  prefill_trained: boolean;
}

export interface SandboxConfig {
  kind: 'python' | 'quickjs';
  timeout_s: number;
  memory_mb: number;
  workers: number;
  /** python: refuse to start below this isolation level (null = any). */
  require_isolation: 'bwrap' | 'unshare' | 'rlimits-only' | null;
  /** A JavaScript module exporting extra tools programs can call (lib/extensions.ts); null = none. */
  tools_module: string | null;
}

export interface RetrievalConfig {
  kind: 'dense' | 'bm25' | 'hybrid' | 'http';
  embedder: string;
  text: 'chunks' | 'titles';
  ef: number;
  k: number;
  url: string | null;
  timeout_s: number;
  retries: number;
}

export interface RolloutConfig {
  k: number;
  batch_questions: number;
  temperature: number | [number, number];
  top_p: number | [number, number];
  top_k: number;
  /** Training rollouts: turn 1's fixed sampling (null = the rollout's own draw). */
  first_turn_temperature: number | null;
  first_turn_top_p: number | null;
  /** DAPO's dynamic sampling (GRPO, RLOO). */
  dynamic_sampling: { enabled: boolean; max_draws: number };
  kv_cache_reuse: boolean;
  kv_cache_mb: number;
  engine: 'native' | 'openai';
  openai: { urls: string[]; model: string | null; timeout_s: number; retries: number; concurrency: number; adapter_dir: string | null };
}

export interface DistributedConfig {
  nproc: number;
  nnodes: number;
  node_rank: number;
  master_addr: string;
  master_port: number;
  backend: 'auto' | 'gloo' | 'nccl';
  timeout_s: number;
  python: string;
}

/** A reward part: its keys belong to lib/rewards (combine.ts), so they are loosely typed here. */
export type RewardPartConfig = Record<string, unknown>;

export interface RewardConfig {
  combine: 'weighted' | 'sign_magnitude';
  /** A failed component (judge call): score failure_value ('penalty'), or also mark the episode excluded. */
  on_failure: 'penalty' | 'exclude';
  /** The value of a failed part; null = -1 under sign_magnitude, 0 under weighted. */
  failure_value: number | null;
  parts: RewardPartConfig[];
  judge: Record<string, unknown>;
  /** A JavaScript module exporting a reward function, the part `module` (lib/extensions.ts); null = none. */
  module: string | null;
}

export interface GroupFallbackConfig {
  flat_std: number;
  flat_skip_below: number;
  fail_at_or_below: number;
  fail_by: 'reward' | 'correct';
  all_failed: 'skip' | 'normalize';
  zero_variance: 'center' | 'skip' | 'zero';
  center: number;
}

export interface AlgorithmConfig {
  /** The algorithm whose settings these are: a registered one's name (lib/train/rl/registry.ts) or sft. */
  kind: string;
  clip_low: number;
  clip_high: number;
  kl_coef: number;
  kl_reference: 'start' | 'base';
  kl_in: 'loss' | 'reward';
  kl_estimator: 'k1' | 'k2' | 'k3';
  loss_norm: 'token' | 'sequence' | 'turn';
  turn_discount: number;
  inner_epochs: number;
  entropy_coef: number;
  std: 'group' | 'none';
  std_estimator: 'sample' | 'population';
  adv_eps: number;
  fallbacks: GroupFallbackConfig;
  gamma: number;
  lam: number;
  vf_coef: number;
  /** PPO's critic: a value head on the actor's trunk, or a second adapter + value head on the same frozen base. */
  critic: 'shared' | 'separate';
  value_clip: number;
  whiten: boolean;
  /** The temperature the loss scores tokens at (null = each episode's sampling temperature). */
  loss_temperature: number | null;
  /** The clipped ratio's old log-probs: the sampler's, or recomputed by the trained policy before the update. */
  old_logprobs: 'sampler' | 'recompute' | 'forward';
  /** Truncated episodes: DAPO's overlong filtering and soft over-length penalty. */
  overlong: { filter: boolean; buffer: number; penalty_factor: number };
  mini_batch: number;
}

/** Rejection-sampling fine-tuning (stage rft, lib/train/rl/rft.ts). */
export interface RftConfig {
  rounds: number;
  /** null: keep the episodes the reward marks correct; a number: those whose reward is >= it. */
  min_reward: number | null;
  epochs: number;
  /** Kept episodes per question and round; 0 = no cap. */
  max_per_question: number;
  unique: boolean;
  /** Questions sampled per round; null = every train question. */
  questions_per_round: number | null;
}

export interface OptimConfig {
  lr: number;
  critic_lr: number;
  weight_decay: number;
  betas: [number, number];
  eps: number;
  max_grad_norm: number;
  /** The separate critic's own gradient clip; null = max_grad_norm. */
  critic_max_grad_norm: number | null;
  schedule: 'constant' | 'linear' | 'cosine';
  warmup_steps: number;
  /** PPO: the value head's warm-up steps; null = warmup_steps. */
  critic_warmup_steps: number | null;
  min_lr_ratio: number;
  micro_batch: number;
  gradient_checkpointing: boolean;
}

export interface TrainConfig {
  epochs: number;
  steps: number | null;
  batch_size: number;
  seed: number;
  checkpoint_every: number;
  eval_every: number;
  /** Keep only the newest N checkpoints; null = all. */
  save_total_limit: number | null;
}

export interface EvalConfig {
  split: 'train' | 'eval' | 'all';
  max_questions: number | null;
  temperature: number;
  top_p: number | null;
  /** Tokens per turn in evaluation (null = protocol.max_new_tokens). */
  max_new_tokens: number | null;
  table: 'full' | 'em_rouge_l';
  /** pass@k after the greedy pass (0 = off). */
  pass_k: number;
}

export interface RunConfig {
  dir: string;
  name: string | null;
}

/** The trackers `log.report_to` can name. */
export const REPORT_TO = ['tensorboard', 'mlflow'] as const;
export type ReportTo = (typeof REPORT_TO)[number];

export interface LogConfig {
  /** Where step metrics go besides metrics.jsonl. */
  report_to: ReportTo[];
  /** null = $MLFLOW_TRACKING_URI. */
  mlflow_tracking_uri: string | null;
  /** null = $MLFLOW_EXPERIMENT_NAME, else the Default experiment. */
  mlflow_experiment: string | null;
}

export interface ResolvedConfig {
  stage: Stage;
  model: ModelConfig;
  lora: LoraConfig;
  data: DataConfig;
  protocol: ProtocolConfig;
  sandbox: SandboxConfig;
  retrieval: RetrievalConfig;
  rollout: RolloutConfig;
  distributed: DistributedConfig;
  reward: RewardConfig;
  algorithm: AlgorithmConfig;
  rft: RftConfig;
  optim: OptimConfig;
  train: TrainConfig;
  eval: EvalConfig;
  run: RunConfig;
  log: LogConfig;
}
