/// <reference types="node" preserve="true" />
/**
 * slm-train as a library: `import { ... } from 'slm-train'`.
 *
 * The supported surface: a config (from a YAML file or an object), a model with its tokenizer and
 * chat template, generation, the episode environment (search index, sandboxes, protocols), the
 * episode runner, rewards (the config's, or your own function), the training stages and
 * evaluation, and the search index. Everything else in the package is internal and may change.
 *
 * Importing this module has no side effects: the native engine (libtorch) is loaded the first time
 * a model is loaded or created, and nothing is logged or set in the environment before that.
 */

// Errors: every failure carries a stable `code`.
export { SlmError, isSlmError, type ErrorCode } from './errors.js';

// Config
export { loadConfig, configFromObject, validateConfig, runDir, configToYaml, type LoadOptions } from './config/load.js';
export { CONFIG_SCHEMA } from './config/schema.js';
export { STAGES, algorithmOf, algorithms, registerAlgorithm, stageNames } from './train/rl/registry.js';
export type { AlgorithmDefinition, AlgorithmRun, ConfigProblem } from './train/rl/algorithm.js';
export type * from './config/types.js';

// Model, tokenizer, chat template, generation
export { Model, type LoadModelOptions, type ComputeDtype } from './engine/model.js';
export type {
  GenerateRequest,
  GenerateResult,
  TextGenerator,
  StreamGenerateRequest,
  StreamGenerateResult,
  TokenEvent,
} from './engine/types.js';
export { setThreads } from './engine/runtime.js';
export type { DecodeSession, SessionOptions, SessionRow, SessionStats, RowFinish } from './engine/session.js';
export type { ProgressTo } from './util/progress.js';
export { loadTokenizer, qwen3Tokenizer, HfTokenizer, type Tokenizer } from './model/tokenizer.js';
export { ChatFormatter, renderChat, type ChatMessage } from './model/chat.js';
export { CHAT_TEMPLATE_NAMES, type ChatTemplateName } from './model/chat-templates.js';
export { chat, chatStream, type ChatPolicy, type ChatCallOptions, type ChatReply } from './engine/chat-call.js';
export { initModel, PRESETS, type InitOptions, type Preset } from './model/init.js';
export type { LoraSpec } from './engine/adapter.js';

// Episodes: protocols and the runner
export {
  EpisodeRunner,
  type Episode,
  type EpisodeRequest,
  type EpisodeRunnerOptions,
  type EpisodeFinish,
  type BatchResult,
  type TurnRecord,
  type RunnerTokenizer,
  type PromptFormatter,
} from './episodes/runner.js';
export {
  tagsProtocol,
  codeProtocol,
  type EpisodeProtocol,
  type TagsProtocolOptions,
  type CodeProtocolOptions,
  type CodeExecutor,
  type EpisodeCall,
} from './episodes/protocol.js';
export { directProtocol } from './episodes/direct.js';

// Rewards
export type { RewardContext, RewardEpisode, RewardFn, RewardParts } from './rewards/types.js';
export {
  rewardFromConfig,
  composeRewards,
  type ComposedReward,
  type ComposedRewardFn,
  type RewardDeps,
  type RewardTerm,
  type ComposeSpec,
} from './rewards/combine.js';
export { answerMetrics, exactMatch, subExactMatch, f1Score, rougeL, extractAnswer, type AnswerMetrics } from './rewards/metrics.js';
export {
  customReward,
  loadRewardModule,
  loadToolsModule,
  checkTools,
  type CustomRewardContext,
  type CustomRewardFn,
  type CustomRewardValue,
  type CustomTool,
  type CustomTools,
} from './extensions.js';

// Sandboxes
export {
  createSandbox,
  detectIsolation,
  type CreateSandboxOptions,
  type Sandbox,
  type SandboxResult,
  type SandboxKind,
  type RunOptions,
  type IsolationLevel,
  type IsolationReport,
  type ToolCall,
} from './sandbox/index.js';

// Search index
export { SearchIndex, type IndexKind, type IndexParams, type Passage } from './retrieval/index.js';
export { Corpus, type Page, type Section } from './retrieval/corpus.js';
export type { SearchTools, PageHit, SectionRef } from './retrieval/types.js';

// From a config to a running stage: environment, episodes, training, evaluation
export { loadQuestions, splitQuestions, type Question } from './train/data.js';
export {
  loadAgent,
  openIndex,
  openEnvironment,
  episodeRunner,
  rewardDeps,
  type Agent,
  type Environment,
  type Extensions,
  type Log,
} from './train/environment.js';
export { trainFromConfig, type StageOptions, type StepMetrics } from './train/session.js';
export { trainSteps } from './train/steps.js';
export type { TrainResult } from './train/stages.js';
export { evalFromConfig, evaluate, evalQuestions, comparisonTable, type EvalOptions, type EvalSummary } from './train/evaluation.js';
