/**
 * The JSON Schema of a training config (`slm-train train --config FILE`), with a default for every
 * key that has a sensible one. Every object forbids unknown keys except the reward part items and
 * `reward.judge`, which lib/rewards owns. A few defaults depend on other keys and are filled after
 * validation (lib/config/load.ts `derive`): algorithm.kind (= stage), algorithm.kl_in (the algorithm's
 * place: reward for PPO, loss otherwise), algorithm.kl_estimator (k1 in the reward, k3 in the loss),
 * algorithm.clip_high (= clip_low), protocol.max_turns_eval (= max_turns), run.name (= the config
 * file's name). The RL algorithms add their own keys and sections (lib/train/rl/registry.ts calls
 * extendSchema): GRPO's group rule, PPO's GAE and critic, RFT's `rft` section.
 */

import { ATTENTION_TARGETS, LORA_TARGETS } from '../engine/adapter.js';
import { COMPUTE_DTYPES } from '../engine/types.js';
import { SEARCH_R1_INSTRUCTION } from '../episodes/prompts.js';
import { MAX_TIMEOUT_S } from '../sandbox/types.js';
import { REPORT_TO, type ResolvedConfig } from './types.js';

import { bool, int, num, oneOf, section, str, type Schema } from './schema-kit.js';

/** Config keys that hold file or folder paths: resolved against the config file's folder. */
export const PATH_KEYS = [
  'model.path',
  'model.adapter',
  'model.chat_template',
  'data.questions',
  'data.eval_questions',
  'data.corpus',
  'data.index',
  'data.sft',
  'retrieval.embedder',
  'reward.module',
  'sandbox.tools_module',
] as const;

export const CONFIG_SCHEMA: Schema = {
  type: 'object',
  additionalProperties: false,
  required: ['stage', 'model'],
  properties: {
    // The enum: 'sft', the registered RL algorithms (lib/train/rl/registry.ts), 'eval' (extendSchema).
    stage: { type: 'string', enum: ['sft', 'eval'], description: 'what `slm-train train` runs' },
    model: section(
      {
        path: {
          type: 'string',
          minLength: 1,
          description: 'a Hugging Face model folder (config.json, safetensors, tokenizer), or hf:OWNER/NAME from the hub',
        },
        adapter: str(null, 'a PEFT adapter folder (or hf:OWNER/NAME) to start from (e.g. the SFT result before GRPO)'),
        dtype: oneOf(COMPUTE_DTYPES, 'float32'),
        device: { type: 'string', pattern: '^(cpu|cuda(:[0-9]+)?)$', default: 'cpu', description: 'cpu, cuda or cuda:N' },
        threads: int(0, { minimum: 0 }, 'CPU threads for libtorch; 0 = all cores'),
        chat_template: str(
          null,
          "the chat template instead of the model folder's: a .jinja file (or a tokenizer_config.json holding one), or a template shipped with slm-train: chatml, qwen3 (the hybrid-thinking Qwen3 one), qwen3-instruct (Qwen3-2507 Instruct's, earlier turns rendered verbatim); null = the folder's chat_template.jinja or tokenizer_config.json",
        ),
      },
      ['path'],
    ),
    lora: section({
      r: int(16, { minimum: 1 }),
      alpha: num(32, { exclusiveMinimum: 0 }),
      dropout: num(0.05, { minimum: 0, exclusiveMaximum: 1 }),
      rslora: bool(false, 'scale by alpha / sqrt(r) instead of alpha / r'),
      targets: { type: 'array', items: { type: 'string', enum: LORA_TARGETS }, minItems: 1, uniqueItems: true, default: ATTENTION_TARGETS },
      layers: {
        type: ['array', 'null'],
        items: { type: 'integer', minimum: 0 },
        uniqueItems: true,
        default: null,
        description: 'layers with adapters; null = all',
      },
    }),
    data: section({
      questions: str(null, 'JSONL/JSON/Parquet rows {question, answer} (optional id, split), or a hub dataset hf:OWNER/NAME[:split]'),
      eval_questions: str(
        null,
        'a second questions file to evaluate on (Search-R1: train on train.parquet, validate on test.parquet): then every row of data.questions is a train question, eval.split eval is every row of this file, train every row of data.questions, and data.split is not used. null = both splits from data.questions by data.split',
      ),
      corpus: str(null, 'JSONL/JSON/Parquet rows {id, title, content}, or a hub dataset hf:OWNER/NAME[:split]'),
      index: str(null, 'a folder written by `slm-train index`; built from the corpus when null'),
      sft: str(null, 'chat-format JSONL {messages: [...]} for the SFT stage (or hf:OWNER/NAME[:split])'),
      split: section({
        train_fraction: num(0.8, { exclusiveMinimum: 0, maximum: 1 }),
        seed: int(null, {}, 'null: split by index (first train_fraction train, the rest eval); an integer shuffles first'),
      }),
      exclude_leaking: bool(true, 'drop SFT rows marked in_test_split: true (they hold eval questions)'),
      train_questions: int(
        null,
        { minimum: 1 },
        'RL: train on at most this many of the train questions, drawn with data.split.seed (0 when null) and the same every epoch (the reference code-search system: 300 of its 382, min(num_samples, len)); null = all of them',
      ),
    }),
    protocol: section({
      kind: oneOf(['code', 'tags', 'direct'], 'code', 'code: <python> programs; tags: Search-R1 <search>; direct: answer only'),
      max_turns: int(2, { minimum: 1 }, 'turns per episode, counted as turns_count says'),
      max_turns_eval: int(null, { minimum: 1 }, 'null = max_turns'),
      turns_count: oneOf(
        ['searches', 'generations'],
        null,
        "tags: what max_turns counts. null = searches, Search-R1's max_turns: N rounds of generation + reply (search results or the invalid-action note), then a last generation that must answer; generations: N generations, the last must answer (what code and direct always count)",
      ),
      max_new_tokens: int(256, { minimum: 1 }, 'per turn'),
      max_context: int(3000, { minimum: 16 }, 'tokens of prompt + turns + observations'),
      tool_output_chars: int(
        6000,
        { minimum: 0 },
        'observations are cut to this many characters (the reference: 6,000; the first and last 40 % are kept)',
      ),
      top_k: int(3, { minimum: 1 }, 'passages per <search> (tags)'),
      max_observation_tokens: int(
        null,
        { minimum: 1 },
        "tags: an environment reply (the <information> block, or the note after an invalid action) longer than this many tokens keeps its first ones, closing tag included, as Search-R1's max_obs_length cuts it (500 in train_ppo.sh); null = no cut. direct has no observation to cut (its notes are left whole), so protocol.kind=direct runs a tags config as it is; code refuses it (tool_output_chars cuts program output)",
      ),
      system_prompt: str(null, "null = the protocol's own (code: the reference's; tags: none, as Search-R1)"),
      instruction: {
        ...str(
          SEARCH_R1_INSTRUCTION,
          "tags: the user message an episode starts from, {question} replaced by the question (default: Search-R1's make_prefix template, word for word)",
        ),
        pattern: '\\{question\\}',
      },
      use_data_prompt: bool(
        true,
        "tags: a question row that carries its own chat prompt (Search-R1's processed files: prompt, a list of {role, content}) starts from exactly those messages, as Search-R1; false = the row's question in instruction",
      ),
      final_turn_notice: str(null, "code: the message sent before the last turn; null = the protocol's own"),
      enable_thinking: {
        type: ['boolean', 'null'],
        default: null,
        description:
          "the chat template's enable_thinking for rollouts, evaluation and SFT rendering (Qwen3's hybrid templates: false pre-fills an empty <think></think> block in every generation prompt; true or null: the model may think). null = not passed (the template's default). Earlier turns' <think> blocks stay in the sequence as generated, and SFT renders a conversation the same way, turn by turn, so that the tokens trained are the tokens each turn was sampled on",
      },
      direct_instruction: {
        ...str(
          null,
          'direct: the user message of the no-search baseline, {question} replaced by the question; null = slm-train\'s own ("Answer the question below from what you know..."). configs/search-r1-ppo.yaml and search-r1-sft-ppo.yaml set Search-R1\'s no-search template (scripts/data_process/nq.py make_prefix, which asks for <think> reasoning)',
        ),
        pattern: '\\{question\\}',
      },
      prompts_from_sft: bool(
        false,
        'take the system prompt (and, for code, the final-turn notice) from the conversations of data.sft, the most common of each, so that SFT, RL and evaluation see one prompt; system_prompt and final_turn_notice must then be null',
      ),
      question_variable: {
        ...str(
          null,
          'code: bind the question to this variable in every program (e.g. question), as smolagents passes task inputs; null = none',
        ),
        pattern: '^[A-Za-z_][A-Za-z0-9_]*$',
      },
      final_answer: bool(false, 'code: programs may end the episode with final_answer(answer), as in smolagents; <answer> tags still work'),
      prefill_first: str(
        null,
        "training rollouts: text the first assistant turn starts with, the model going on after it (the reference code-search system: <python>, so that every episode searches); null = none. Evaluation never prefills (nor does the reference's)",
      ),
      prefill_final: str(
        null,
        'training rollouts: text the last assistant turn starts with when it is not the first (the reference code-search system: <answer>, so that every episode answers); null = none',
      ),
      prefill_trained: bool(
        false,
        "whether the loss covers the prefilled tokens (the reference's: true, its trained response text starts with them); their old log-probs are then computed by the trainer's forward (the sampler has none)",
      ),
    }),
    sandbox: section({
      kind: oneOf(['python', 'quickjs'], 'python'),
      timeout_s: num(10, { exclusiveMinimum: 0, maximum: MAX_TIMEOUT_S }, 'seconds a program may run (at most 86400, 24 h)'),
      memory_mb: int(512, { minimum: 16 }),
      workers: int(4, { minimum: 1 }),
      require_isolation: oneOf(
        ['bwrap', 'unshare', 'rlimits-only'],
        null,
        "python: the weakest isolation level a run accepts; below it the run refuses to start (SANDBOX_ISOLATION_INSUFFICIENT). bwrap is the only level at which programs cannot read the host's files (the run folder, the questions file with its gold answers, the project); null = any level (the log and `slm-train doctor` say what a program can read)",
      ),
      tools_module: str(
        null,
        'a JavaScript module (.js/.mjs, relative to the config file) whose `tools` export (or default export) is an object of name -> function: each becomes a function programs can call beside search_pages, view_sections and read_section, with JSON arguments and result; the functions run in the trainer process, not in the sandbox. null = none',
      ),
    }),
    retrieval: section({
      kind: oneOf(
        ['dense', 'bm25', 'hybrid', 'http'],
        'hybrid',
        'hybrid: dense + BM25 by reciprocal-rank fusion; http: a Search-R1 retrieval server at retrieval.url (tags protocol)',
      ),
      embedder: str(
        'hashing',
        '"hashing", a sentence-transformers BERT folder (all-MiniLM-L6-v2, the reference\'s title embedder) or a Qwen3 embedding model folder',
      ),
      text: oneOf(
        ['chunks', 'titles'],
        'chunks',
        "what search_pages matches a query against: chunks (~150-word content chunks prefixed with the page title) or titles (each page's title alone, one vector per page, as the reference's search_pages over all-MiniLM-L6-v2 title embeddings); a saved data.index keeps the text it was built with",
      ),
      ef: int(256, { minimum: 1 }, 'HNSW search breadth (hnswlib default 10 loses neighbours)'),
      k: int(10, { minimum: 1 }, 'results per search_pages call'),
      url: str(
        null,
        'kind http: the retrieval server, e.g. http://127.0.0.1:8000/retrieve (Search-R1 retrieval_server.py or slm-train serve-retriever)',
      ),
      timeout_s: num(30, { exclusiveMinimum: 0, maximum: MAX_TIMEOUT_S }, 'kind http: seconds per request before a retry'),
      retries: int(3, { minimum: 0 }, 'kind http: retries after a failed request (exponential backoff)'),
    }),
    rollout: section({
      k: int(8, { minimum: 1 }, 'rollouts per question (the GRPO group size)'),
      batch_questions: int(4, { minimum: 1 }, 'questions per step'),
      temperature: {
        anyOf: [
          { type: 'number', minimum: 0 },
          { type: 'array', items: { type: 'number', minimum: 0 }, minItems: 2, maxItems: 2 },
        ],
        default: 1,
        description: 'a number, or [lo, hi]: each rollout draws its own from the range',
      },
      top_p: {
        anyOf: [
          { type: 'number', exclusiveMinimum: 0, maximum: 1 },
          { type: 'array', items: { type: 'number', exclusiveMinimum: 0, maximum: 1 }, minItems: 2, maxItems: 2 },
        ],
        default: 1,
        description:
          'a number, or [lo, hi]: each rollout draws its own from the range (the reference code-search system draws from [0.85, 0.99])',
      },
      top_k: int(0, { minimum: 0 }, '0 = off'),
      first_turn_temperature: num(
        null,
        { minimum: 0 },
        "training rollouts: turn 1 of every rollout samples at this temperature, later turns at the rollout's own draw (the reference code-search system: 0.925, the middle of [0.7, 1.15]); null = the rollout's own on every turn. Needs algorithm.old_logprobs: recompute (the training forward scores a sequence at one temperature)",
      ),
      first_turn_top_p: num(
        null,
        { exclusiveMinimum: 0, maximum: 1 },
        'with first_turn_temperature: the top-p of turn 1 (the reference: 0.92, the middle of [0.85, 0.99]); null = 1',
      ),
      dynamic_sampling: section({
        enabled: bool(
          false,
          "GRPO and RLOO: DAPO's dynamic sampling: a group whose rewards are all equal (no spread, no gradient) is dropped and the next batch of questions is drawn, until the step has rollout.batch_questions groups with a spread (the surplus of the last draw left out) or max_draws batches were drawn (the step then trains on the groups it has). Every draw moves the data position on, as verl's DAPO takes its next generation batch",
        ),
        max_draws: int(
          4,
          { minimum: 1 },
          'batches of rollout.batch_questions questions one step may draw, the first included (verl: max_num_gen_batches, there 0 = no bound)',
        ),
      }),
      kv_cache_reuse: bool(
        true,
        "engine native: an episode's KV cache survives between its turns, so a turn computes only the tokens appended since the last (the tool output, the template's text) instead of re-prefilling the conversation; the episodes are the same either way. false = re-prefill every turn",
      ),
      kv_cache_mb: int(
        2048,
        { minimum: 0, maximum: 2 ** 32 },
        "engine native: memory the kept episode KV caches may hold (MiB, on the model's device); beyond it the least recently used are evicted and those episodes re-prefill (one log line says so). 0 = keep none",
      ),
      engine: oneOf(
        ['native', 'openai'],
        'native',
        "native: the trainer's own engine generates; openai: OpenAI-compatible servers (vLLM, slm-train serve) generate with the adapter loaded at run time",
      ),
      openai: section({
        urls: {
          type: 'array',
          items: { type: 'string', pattern: '^https?://' },
          default: [],
          description: 'engine openai: server base URLs (e.g. http://10.0.0.5:8000), requests spread over them',
        },
        model: str(null, 'engine openai: the base model name the servers serve (null = the first of GET /v1/models)'),
        timeout_s: num(300, { exclusiveMinimum: 0, maximum: MAX_TIMEOUT_S }, 'engine openai: seconds per request before a retry'),
        retries: int(3, { minimum: 0 }, 'engine openai: retries after a failed request (exponential backoff)'),
        concurrency: int(64, { minimum: 1 }, 'engine openai: requests in flight per server'),
        adapter_dir: str(
          null,
          'engine openai: a folder the servers can read where the adapter is written after each step (default: the run folder)',
        ),
      }),
    }),
    distributed: section({
      nproc: int(1, { minimum: 1 }, 'worker processes on this node, one per device (the CLI: --nproc)'),
      nnodes: int(1, { minimum: 1 }, 'nodes in the job; each runs `slm-train train --nproc N` with its own distributed.node_rank'),
      node_rank: int(0, { minimum: 0 }),
      master_addr: str('127.0.0.1', "rank 0's host (the c10d TCPStore); MASTER_ADDR wins when set"),
      master_port: int(0, { minimum: 0, maximum: 65535 }, '0 = a free port (one node only); MASTER_PORT wins when set'),
      backend: oneOf(['auto', 'gloo', 'nccl'], 'auto', 'auto: nccl when model.device is cuda, else gloo'),
      timeout_s: num(
        300,
        { exclusiveMinimum: 0, maximum: MAX_TIMEOUT_S },
        'seconds for the rendezvous and every collective; past it the run stops with DISTRIBUTED_FAILED',
      ),
      python: str('/usr/bin/python3', 'a python with torch.distributed (Debian: python3-torch)'),
    }),
    reward: section({
      combine: oneOf(
        ['weighted', 'sign_magnitude'],
        'weighted',
        "weighted sum of the parts, or the reference's sign_magnitude: a correct answer scores +approach, a wrong one -(1 - approach), approach in [0, 1]",
      ),
      on_failure: oneOf(
        ['penalty', 'exclude'],
        'penalty',
        'an episode whose reward has a failed component (a judge call): penalty = it scores with failure_value (the reference); exclude = also marked excluded, and the trainer leaves it out of the loss and counts it',
      ),
      failure_value: num(
        null,
        {},
        'the value of a failed part; null = -1 under sign_magnitude (the reference scores a failed judge call -1), 0 under weighted',
      ),
      parts: {
        type: 'array',
        items: { type: 'object' },
        default: [{ kind: 'em', weight: 1 }],
        description: 'reward parts; their keys are defined by lib/rewards',
      },
      judge: {
        type: 'object',
        default: {},
        description: 'the LLM judge (engine model or OpenAI-compatible endpoint); keys defined by lib/rewards',
      },
      module: str(
        null,
        'a JavaScript module (.js/.mjs, relative to the config file) exporting `reward` (or a default function) (ctx: {id, question, golds, answer, episode}) => number | {score, parts?, correct?} (or a promise of one); it is the part named `module` (weight 1) added to reward.parts unless the parts list a {kind: module} themselves. A non-number stops the run with REWARD_MODULE_INVALID. null = none',
      ),
    }),
    algorithm: section({
      // The enum: the registered RL algorithms and 'sft' (extendSchema).
      kind: oneOf(['sft'], null, 'null = the stage'),
      clip_low: num(0.2, { minimum: 0 }),
      clip_high: num(null, { minimum: 0 }, 'null = clip_low; DAPO uses 0.28'),
      kl_coef: num(0, { minimum: 0 }),
      kl_reference: oneOf(
        ['start', 'base'],
        'start',
        'the KL reference policy: start = the adapter the stage starts from (model.adapter, e.g. the SFT result), frozen; base = the base model (adapter off)',
      ),
      kl_in: oneOf(['loss', 'reward'], null, 'null: reward for PPO (Search-R1), loss for GRPO'),
      kl_estimator: oneOf(['k1', 'k2', 'k3'], null, 'null: k1 in the reward, k3 in the loss'),
      loss_norm: oneOf(
        ['token', 'sequence', 'turn'],
        'token',
        "how the policy loss averages: token = every trained token of the batch weighs the same (DAPO, Dr.GRPO); sequence = per episode, then over episodes (the GRPO paper); turn = per assistant turn, then over the batch's turns (the reference code-search system; GRPO only)",
      ),
      turn_discount: num(
        1,
        { minimum: 0, maximum: 1 },
        'GRPO: the advantage of turn j of J is scaled by turn_discount^(J - 1 - j) (the reference: 0.99; 1 = none)',
      ),
      inner_epochs: int(1, { minimum: 1 }),
      entropy_coef: num(0, { minimum: 0 }),
      loss_temperature: num(
        null,
        { exclusiveMinimum: 0 },
        "the temperature the loss scores tokens at (logits / T, the old log-probs recomputed at it too): null = each episode's sampling temperature; 1 = the plain logits, as the reference code-search system's NLL. Set, it needs old_logprobs: recompute",
      ),
      old_logprobs: oneOf(
        ['sampler', 'recompute', 'forward'],
        'sampler',
        "the old policy's log-probs in the clipped ratio: sampler = those the generator reported while sampling; recompute = a teacher-forced forward of the trained policy over each episode before the update, at the temperature the training forward uses (LoRA dropout off: the ratio is exactly 1 only with lora.dropout 0); forward = the training forward's own log-probs, detached, under its LoRA dropout mask: the ratio is exactly 1, clipping never acts, the gradient is -A grad log p (the reference code-search system's loss, which has no ratio; inner_epochs must be 1)",
      ),
      overlong: section({
        filter: bool(
          false,
          "leave truncated episodes out of the loss (DAPO's overlong filtering): one whose turn stopped at protocol.max_new_tokens or whose conversation reached protocol.max_context. They are marked excluded (as reward.on_failure: exclude: out of the loss and of their group's statistics) and counted (episodes_truncated)",
        ),
        buffer: int(
          0,
          { minimum: 0 },
          "DAPO's soft over-length penalty: the last `buffer` tokens before protocol.max_new_tokens are a buffer; a turn that runs into it by x tokens adds -penalty_factor * x / buffer to the episode's reward (the longest turn counts; -penalty_factor at the limit). 0 = off; must be below protocol.max_new_tokens",
        ),
        penalty_factor: num(1, { minimum: 0 }, 'the soft penalty at the limit (verl: overlong_buffer.penalty_factor)'),
      }),
    }),
    optim: section({
      lr: num(1e-4, { exclusiveMinimum: 0 }),
      critic_lr: num(1e-5, { exclusiveMinimum: 0 }, 'PPO value head'),
      weight_decay: num(0, { minimum: 0 }),
      betas: { type: 'array', items: { type: 'number', minimum: 0, exclusiveMaximum: 1 }, minItems: 2, maxItems: 2, default: [0.9, 0.999] },
      eps: num(1e-8, { exclusiveMinimum: 0 }),
      max_grad_norm: num(1, { minimum: 0 }, '0 = no clipping'),
      critic_max_grad_norm: num(
        null,
        { minimum: 0 },
        "PPO with algorithm.critic: separate: the critic's own gradient-norm clip (Search-R1: critic.grad_clip 1.0); null = max_grad_norm, 0 = no clipping",
      ),
      schedule: oneOf(['constant', 'linear', 'cosine'], 'constant'),
      warmup_steps: int(0, { minimum: 0 }),
      critic_warmup_steps: int(
        null,
        { minimum: 0 },
        "PPO: warm-up steps of the value head's learning rate (critic_lr); null = warmup_steps. Search-R1 warms its critic up over 0.015 of the steps, its actor over 0.285",
      ),
      min_lr_ratio: num(0, { minimum: 0, maximum: 1 }),
      micro_batch: int(0, { minimum: 0 }, 'sequences per forward/backward; 0 = the whole batch'),
      gradient_checkpointing: bool(true),
    }),
    train: section({
      epochs: int(1, { minimum: 1 }),
      steps: int(null, { minimum: 1 }, 'null = from epochs'),
      batch_size: int(8, { minimum: 1 }, 'SFT sequences per optimizer step'),
      seed: int(0),
      checkpoint_every: int(50, { minimum: 0 }, '0 = only at the end'),
      save_total_limit: int(
        null,
        { minimum: 1 },
        "keep only the newest N checkpoints (TRL's save_total_limit; the one a resume loads always stays); null = keep all",
      ),
      eval_every: int(0, { minimum: 0 }, '0 = never during training'),
    }),
    eval: section({
      split: oneOf(['train', 'eval', 'all'], 'eval'),
      max_questions: int(null, { minimum: 1 }),
      temperature: num(0, { minimum: 0 }, '0 = greedy'),
      top_p: num(null, { exclusiveMinimum: 0, maximum: 1 }, 'null = rollout.top_p'),
      max_new_tokens: int(
        null,
        { minimum: 1 },
        'tokens per turn in evaluation (the reference code-search system evaluates with 512); null = protocol.max_new_tokens',
      ),
      table: oneOf(
        ['full', 'em_rouge_l'],
        'full',
        "the comparison table: every metric, or the SFT+PPO report's (configuration, EM, ROUGE-L)",
      ),
      pass_k: int(
        0,
        { minimum: 0 },
        'pass@k: after the greedy pass, k episodes per question at the rollout settings (rollout.temperature and rollout.top_p, drawn per episode); a question passes when one is correct. 0 = off',
      ),
    }),
    run: section({
      dir: str('runs', 'parent folder of run folders (relative to the working directory)'),
      name: str(null, 'null = the config file name'),
    }),
    log: section({
      report_to: {
        type: 'array',
        items: { type: 'string', enum: REPORT_TO },
        uniqueItems: true,
        default: ['tensorboard'],
        description:
          "where the metrics of each step go besides metrics.jsonl (TRL's report_to): tensorboard (RUN/tb event files, tags train/..., eval/...), mlflow (a tracking server's REST API: the run's params, then a metric history per key). [] = metrics.jsonl only",
      },
      mlflow_tracking_uri: str(
        null,
        'the MLflow tracking server (http://HOST:PORT); null = $MLFLOW_TRACKING_URI. $MLFLOW_TRACKING_TOKEN (bearer) or $MLFLOW_TRACKING_USERNAME/$MLFLOW_TRACKING_PASSWORD authenticate',
      ),
      mlflow_experiment: str(
        null,
        "the MLflow experiment (created when missing); null = $MLFLOW_EXPERIMENT_NAME, else MLflow's Default experiment",
      ),
    }),
  },
};

/**
 * The schema's defaults of one section, for code that takes a partial section (missing keys take
 * these). The keys lib/config/load.ts derives from others are null here.
 */
export function sectionDefaults<S extends Exclude<keyof ResolvedConfig, 'stage'>>(section: S): ResolvedConfig[S] {
  return schemaDefaults((CONFIG_SCHEMA.properties as Record<string, Schema>)[section]) as ResolvedConfig[S];
}

/** A key's default: for a section, the defaults of its keys (as validation fills them). */
export function schemaDefaults(s: Schema): unknown {
  if (!s.properties) return structuredClone(s.default);
  return Object.fromEntries(Object.entries(s.properties as Record<string, Schema>).map(([k, sub]) => [k, schemaDefaults(sub)]));
}
