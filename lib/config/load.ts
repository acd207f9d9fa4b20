/**
 * Loading a training config: YAML file -> `key=value` overrides -> defaults and validation (ajv
 * against lib/config/schema.ts) -> cross-key checks -> derived defaults -> absolute paths.
 *
 * Precedence: schema defaults < the file < overrides, later overrides winning over earlier ones.
 * Paths (lib/config/schema.ts PATH_KEYS) written in the file are relative to the file's folder;
 * paths given as overrides are relative to the working directory, as any other command-line path.
 * Every problem is reported at once in one SlmError: CONFIG_UNKNOWN_KEY when all of them are unknown
 * keys, CONFIG_INVALID otherwise. Nothing here checks that data files exist (`missingFiles` does):
 * a config is valid on any machine.
 */
import { existsSync, mkdirSync, readFileSync, renameSync, statSync, writeFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { basename, dirname, extname, join, resolve } from 'node:path';
import { Ajv, type ValidateFunction } from 'ajv';
import YAML from 'yaml';
import { SlmError } from '../errors.js';
import { CONFIG_SCHEMA, PATH_KEYS } from './schema.js';
import { schemaVersion } from './schema-extend.js';
import { applyOverrides, parseOverrides } from './overrides.js';
import { describeValue, dotted, fail, isObj, problemsFromAjv, props, type Obj, type Problem, type Schema } from './problems.js';
import { isHubRef } from '../hub/ref.js';
import { isChatTemplateName } from '../model/chat-templates.js';
import { groupSizeProblem, klDefaults, klProblem } from '../train/rl/algorithm.js';
import { algorithmOf, algorithms } from '../train/rl/registry.js';

const groupBaselines = () =>
  algorithms()
    .filter((a) => a.groupBaseline)
    .map((a) => a.name);
import type { ResolvedConfig } from './types.js';

export interface LoadOptions {
  /** Folder that override paths are relative to (default: process.cwd()). */
  cwd?: string;
}

let validator: { fn: ValidateFunction; version: number } | undefined;
function compiled(): ValidateFunction {
  // Recompiled when an algorithm registered since (lib/train/rl/registry.ts) added keys.
  if (validator?.version !== schemaVersion())
    validator = {
      fn: new Ajv({ useDefaults: true, allErrors: true, strict: true, allowUnionTypes: true }).compile(CONFIG_SCHEMA),
      version: schemaVersion(),
    };
  return validator.fn;
}

// ---------------------------------------------------------------------------------------------
// Validation

function crossChecks(cfg: ResolvedConfig): Problem[] {
  const p: Problem[] = [];
  // The run folder is run.dir/run.name: a name with a separator or '..' would put it elsewhere.
  const rn = cfg.run.name;
  if (rn !== null && (rn === '' || rn === '.' || rn === '..' || /[/\\\0]/.test(rn)))
    p.push({
      path: ['run', 'name'],
      message: `expected a plain folder name (no /, \\ or NUL, not . or ..): the run is written to run.dir/run.name, found ${describeValue(rn)}; put the folder's parent in run.dir`,
    });
  const a = cfg.algorithm as Omit<ResolvedConfig['algorithm'], 'kind' | 'kl_in' | 'kl_estimator'> & {
    kind: string | null;
    kl_in: string | null;
    kl_estimator: string | null;
  };
  if (a.kind !== null && cfg.stage !== 'eval' && a.kind !== cfg.stage)
    p.push({
      path: ['algorithm', 'kind'],
      message: `${JSON.stringify(a.kind)} does not match stage ${JSON.stringify(cfg.stage)}; leave algorithm.kind out (it follows the stage) or make them equal`,
    });
  const temp = cfg.rollout.temperature;
  if (Array.isArray(temp) && temp[0] > temp[1])
    p.push({ path: ['rollout', 'temperature'], message: `expected [lo, hi] with lo <= hi, found [${temp.join(', ')}]` });
  const topP = cfg.rollout.top_p;
  if (Array.isArray(topP) && topP[0] > topP[1])
    p.push({ path: ['rollout', 'top_p'], message: `expected [lo, hi] with lo <= hi, found [${topP.join(', ')}]` });
  if (cfg.stage === 'sft' && cfg.data.sft === null)
    p.push({ path: ['data', 'sft'], message: 'missing; the sft stage needs chat-format JSONL trajectories ({messages: [...]} rows)' });
  if (cfg.stage !== 'sft') {
    if (cfg.data.questions === null)
      p.push({ path: ['data', 'questions'], message: `missing; the ${cfg.stage} stage needs question rows {question, answer}` });
    if (cfg.protocol.kind !== 'direct' && cfg.retrieval.kind !== 'http' && cfg.data.corpus === null && cfg.data.index === null)
      p.push({
        path: ['data', 'corpus'],
        message: `missing; the ${cfg.protocol.kind} protocol searches a corpus: set data.corpus or data.index (or retrieval.kind: http with retrieval.url)`,
      });
  }
  if (cfg.retrieval.kind === 'http') {
    if (cfg.retrieval.url === null)
      p.push({
        path: ['retrieval', 'url'],
        message:
          'missing; retrieval.kind: http needs the server, e.g. http://127.0.0.1:8000/retrieve (`slm-train serve-retriever --index DIR --port 8000`)',
      });
    if (cfg.protocol.kind === 'code')
      p.push({
        path: ['retrieval', 'kind'],
        message:
          "http serves passages for the tags protocol; the code protocol's search_pages/view_sections/read_section need a local index (retrieval.kind hybrid, dense or bm25)",
      });
  }
  if (isHubRef(cfg.data.index))
    p.push({
      path: ['data', 'index'],
      message: `a local folder (written by \`slm-train index\`), found the hub reference ${JSON.stringify(cfg.data.index)}; put a hub dataset in data.corpus and the index is built from it`,
    });
  if (cfg.protocol.prompts_from_sft) {
    if (cfg.data.sft === null)
      p.push({ path: ['data', 'sft'], message: 'missing; protocol.prompts_from_sft takes the prompts from the conversations of data.sft' });
    for (const k of ['system_prompt', 'final_turn_notice'] as const)
      if (cfg.protocol[k] !== null)
        p.push({ path: ['protocol', k], message: `set, but protocol.prompts_from_sft takes it from data.sft; set one or the other` });
  }
  if (cfg.protocol.max_observation_tokens !== null && cfg.protocol.kind === 'code')
    p.push({
      path: ['protocol', 'max_observation_tokens'],
      message:
        "cuts the tags protocol's inline <information> replies (Search-R1's max_obs_length); the code protocol cuts program output with tool_output_chars; set it to null",
    });
  if (cfg.data.eval_questions !== null && cfg.eval.split === 'all')
    p.push({
      path: ['eval', 'split'],
      message: 'with data.eval_questions a split names one file: eval (data.eval_questions) or train (data.questions), found "all"',
    });
  if (cfg.algorithm.overlong.buffer >= cfg.protocol.max_new_tokens)
    p.push({
      path: ['algorithm', 'overlong', 'buffer'],
      message: `the over-length buffer is the last tokens before protocol.max_new_tokens (${cfg.protocol.max_new_tokens}): expected fewer, found ${cfg.algorithm.overlong.buffer}`,
    });
  // Turn 1 sampled at another temperature than the episode's: the sampler's log-probs of its tokens are not the training forward's.
  if (cfg.rollout.first_turn_temperature !== null && cfg.algorithm.old_logprobs === 'sampler')
    p.push({
      path: ['rollout', 'first_turn_temperature'],
      message: `turn 1 then samples at ${cfg.rollout.first_turn_temperature} and later turns at the rollout's own temperature, but the training forward scores a whole episode at the rollout's: the sampler's log-probs of turn 1 would not match it. Set algorithm.old_logprobs: recompute (or forward)`,
    });
  if (cfg.algorithm.loss_temperature !== null && cfg.algorithm.old_logprobs === 'sampler')
    p.push({
      path: ['algorithm', 'loss_temperature'],
      message: `the loss then scores tokens at temperature ${cfg.algorithm.loss_temperature}, but the sampler's log-probs are at each episode's sampling temperature; set algorithm.old_logprobs: recompute (or forward)`,
    });
  // 'forward': the ratio against the training forward's own log-probs is 1 in every pass; a second
  // pass would train off-policy with no correction.
  if (cfg.algorithm.old_logprobs === 'forward' && cfg.algorithm.inner_epochs !== 1)
    p.push({
      path: ['algorithm', 'old_logprobs'],
      message: `forward takes the training forward's own log-probs as the old ones, so the ratio is 1 in every pass and a second pass would train off-policy uncorrected: expected inner_epochs 1, found ${cfg.algorithm.inner_epochs}; use recompute for several passes`,
    });
  if (cfg.rollout.first_turn_top_p !== null && cfg.rollout.first_turn_temperature === null)
    p.push({
      path: ['rollout', 'first_turn_top_p'],
      message: "set, but rollout.first_turn_temperature is null (turn 1 then samples at the rollout's own draws); set both or neither",
    });
  if (
    cfg.optim.schedule !== 'constant' &&
    cfg.train.steps !== null &&
    cfg.optim.critic_warmup_steps !== null &&
    cfg.optim.critic_warmup_steps >= cfg.train.steps
  )
    p.push({
      path: ['optim', 'critic_warmup_steps'],
      message: `expected fewer warm-up steps than train.steps (${cfg.train.steps}) for a ${cfg.optim.schedule} schedule, found ${cfg.optim.critic_warmup_steps}`,
    });
  if (cfg.optim.schedule !== 'constant' && cfg.train.steps !== null && cfg.optim.warmup_steps >= cfg.train.steps)
    p.push({
      path: ['optim', 'warmup_steps'],
      message: `expected fewer warm-up steps than train.steps (${cfg.train.steps}) for a ${cfg.optim.schedule} schedule, found ${cfg.optim.warmup_steps}`,
    });
  return [...p, ...algorithmChecks(cfg)];
}

/**
 * The checks the RL algorithms' definitions give (lib/train/rl/algorithm.ts): by algorithm.kind, where
 * the KL goes and the loss normalisations it has; by the stage, the group size it needs, what only a
 * group baseline has (dynamic sampling, old_logprobs: forward), and its own checks.
 */
function algorithmChecks(cfg: ResolvedConfig): Problem[] {
  const p: Problem[] = [];
  const a = cfg.algorithm as Omit<ResolvedConfig['algorithm'], 'kl_in' | 'kl_estimator'> & {
    kl_in: 'loss' | 'reward' | null;
    kl_estimator: 'k1' | 'k2' | 'k3' | null;
  };
  const kind = algorithmOf(a.kind ?? (cfg.stage === 'eval' ? 'grpo' : cfg.stage));
  if (kind) {
    const { klIn, klEstimator } = klDefaults(kind, a);
    const kl = klProblem(kind, klIn, klEstimator, a.kl_coef);
    if (kl) p.push(kl);
    if (!kind.lossNorms.includes(a.loss_norm))
      p.push({
        path: ['algorithm', 'loss_norm'],
        message: `${kind.name.toUpperCase()} takes ${kind.lossNorms.join(' or ')}, found ${JSON.stringify(a.loss_norm)} (turn is the reference code-search system's GRPO normalisation)`,
      });
  }
  const stage = algorithmOf(cfg.stage);
  const group = stage?.groupBaseline ?? cfg.stage === 'eval';
  if (cfg.rollout.dynamic_sampling.enabled && !group)
    p.push({
      path: ['rollout', 'dynamic_sampling', 'enabled'],
      message: `dynamic sampling keeps groups whose rewards differ: ${groupBaselines()
        .map((n) => n.toUpperCase())
        .join(' and ')} only, found stage ${cfg.stage}`,
    });
  if (cfg.algorithm.old_logprobs === 'forward' && !group)
    p.push({
      path: ['algorithm', 'old_logprobs'],
      message: `forward is the group policy-gradient update's (${groupBaselines().join(' or ')}), found ${cfg.stage}; use sampler or recompute`,
    });
  if (!stage) return p;
  const k = groupSizeProblem(stage, cfg.rollout.k);
  if (k) p.push(k);
  return [...p, ...(stage.validate?.(cfg) ?? [])];
}

/** A copy with keys in schema order (then any loosely typed extras), so written configs read like the schema. */
function ordered(value: unknown, schema: Schema | undefined): unknown {
  if (Array.isArray(value)) return value.map((x) => ordered(x, schema?.items as Schema | undefined));
  if (!isObj(value)) return value;
  const p = props(schema) ?? {};
  const out: Obj = {};
  for (const k of Object.keys(p)) if (k in value) out[k] = ordered(value[k], p[k]);
  for (const k of Object.keys(value)) if (!(k in out)) out[k] = value[k];
  return out;
}

/** Fills the defaults that depend on other keys (see lib/config/schema.ts). */
function derive(cfg: ResolvedConfig, name: string | null): ResolvedConfig {
  const a = cfg.algorithm as unknown as Record<string, unknown>;
  if (a.kind === null) a.kind = cfg.stage === 'eval' ? 'grpo' : cfg.stage;
  // Where the KL goes, and its estimator: the algorithm's defaults (sft: the loss's).
  const kl = klDefaults(algorithmOf(a.kind as string) ?? { kl: { defaultIn: 'loss' } }, cfg.algorithm);
  a.kl_in = kl.klIn;
  a.kl_estimator = kl.klEstimator;
  if (a.clip_high === null) a.clip_high = a.clip_low;
  const pr = cfg.protocol as unknown as Record<string, unknown>;
  if (pr.max_turns_eval === null) pr.max_turns_eval = cfg.protocol.max_turns;
  if (cfg.run.name === null && name) cfg.run.name = name;
  return cfg;
}

/**
 * Validates a config object (defaults filled in a copy), checks the keys that depend on each other
 * and fills the derived defaults. `where` names the source in messages (a file, "command line").
 * Paths are left as they are.
 */
export function validateConfig(obj: unknown, where: string, opts: { name?: string; fromCli?: Iterable<string> } = {}): ResolvedConfig {
  const fromCli = new Set(opts.fromCli ?? []);
  if (!isObj(obj))
    fail(where, [{ path: [], message: `expected a mapping of sections (stage, model, lora, ...), found ${describeValue(obj)}` }]);
  const data = structuredClone(obj);
  const validate = compiled();
  if (!validate(data)) fail(where, problemsFromAjv(validate.errors ?? [], data), fromCli);
  const c = data as unknown as ResolvedConfig;
  const problems = crossChecks(c);
  if (problems.length) fail(where, problems, fromCli);
  return ordered(derive(c, opts.name ?? null), CONFIG_SCHEMA) as ResolvedConfig;
}

// ---------------------------------------------------------------------------------------------
// Files

function expandHome(p: string): string {
  return p === '~' ? homedir() : p.startsWith('~/') ? join(homedir(), p.slice(2)) : p;
}

/** A local path (hf:OWNER/NAME hub references are neither made absolute nor checked for existence). */
function isPathValue(key: string, v: unknown): v is string {
  return (
    typeof v === 'string' &&
    v !== '' &&
    !isHubRef(v) &&
    !(key === 'retrieval.embedder' && v === 'hashing') &&
    !(key === 'model.chat_template' && isChatTemplateName(v))
  );
}

/** Makes the path keys of a raw config absolute against `base` (in place; non-strings untouched). */
function resolvePathKeys(obj: Obj, base: string, only?: (key: string) => boolean): void {
  for (const key of PATH_KEYS) {
    if (only && !only(key)) continue;
    const [sec, k] = key.split('.');
    const s = obj[sec];
    if (isObj(s) && isPathValue(key, s[k])) s[k] = resolve(base, expandHome(s[k] as string));
  }
}

/** How far a config's aliases may expand (yaml's maxAliasCount, its default): a real config uses a few. */
const MAX_YAML_ALIAS_COUNT = 100;

/** Reads a YAML config file into a plain object, with line and column on syntax errors. */
export function readConfigFile(file: string): Obj {
  if (!existsSync(file)) throw new SlmError('FILE_NOT_FOUND', `config file ${file} does not exist.`);
  if (statSync(file).isDirectory()) throw new SlmError('CONFIG_INVALID', `${file} is a folder; expected a YAML config file.`);
  const doc = YAML.parseDocument(readFileSync(file, 'utf8'));
  if (doc.errors.length) {
    const lines = doc.errors.map((e) => {
      const at = e.linePos?.[0];
      return `${file}${at ? `:${at.line}:${at.col}` : ''}: ${e.message.split('\n')[0]}`;
    });
    throw new SlmError('CONFIG_INVALID', `${file} is not valid YAML:\n  ${lines.join('\n  ')}`);
  }
  let v: unknown;
  try {
    v = doc.toJS({ maxAliasCount: MAX_YAML_ALIAS_COUNT });
  } catch (e) {
    // yaml throws a ReferenceError for an alias without its anchor and for aliases that expand past
    // maxAliasCount (a "billion laughs" file would otherwise take all memory).
    if (!(e instanceof ReferenceError)) throw e;
    const excessive = /excessive alias count/i.test(e.message);
    throw new SlmError(
      'CONFIG_INVALID',
      excessive
        ? `${file}: its aliases (*name) expand to too many copies of their anchors (&name): more than ${MAX_YAML_ALIAS_COUNT}, which only a file built to exhaust memory needs. Write the values out, or use fewer nested aliases.`
        : `${file}: ${e.message}; define each anchor (&name) before its aliases (*name).`,
    );
  }
  if (!isObj(v)) fail(file, [{ path: [], message: `expected a mapping of sections (stage, model, lora, ...), found ${describeValue(v)}` }]);
  return v;
}

/**
 * `slm-train train --config FILE [key=value ...]`: the file, the overrides, defaults, validation;
 * paths made absolute (file paths against the file's folder, override paths against opts.cwd);
 * run.name defaults to the file's name without extension.
 */
export function loadConfig(file: string, overrides: readonly string[] = [], opts: LoadOptions = {}): ResolvedConfig {
  const cwd = opts.cwd ?? process.cwd();
  const abs = resolve(cwd, file);
  const raw = readConfigFile(abs);
  resolvePathKeys(raw, dirname(abs));
  const ov = parseOverrides(overrides);
  const merged = applyOverrides(raw, ov);
  const cliKeys = new Set(ov.map((o) => o.path.join('.')));
  resolvePathKeys(merged, cwd, (k) => cliKeys.has(k));
  const cfg = validateConfig(merged, file, { name: basename(abs, extname(abs)), fromCli: ov.map((o) => dotted(o.path)) });
  cfg.run.dir = resolve(cwd, expandHome(cfg.run.dir));
  return cfg;
}

/**
 * A config built in code (the library's way to what `loadConfig` reads from a file): the same
 * validation and defaults; relative paths (and run.dir, default "runs") are resolved against
 * `baseDir` (default: the working directory). run.name defaults to `name`, else the stage.
 */
export function configFromObject(obj: unknown, opts: { baseDir?: string; name?: string } = {}): ResolvedConfig {
  const base = resolve(opts.baseDir ?? process.cwd());
  let raw: unknown = obj;
  if (isObj(obj)) {
    try {
      raw = structuredClone(obj);
    } catch (e) {
      throw new SlmError(
        'CONFIG_INVALID',
        `config object: expected plain data (numbers, strings, lists, objects) as YAML would give, but it holds a value that cannot be copied (${(e as Error).message}). Pass reward functions and tools as the stage's { reward, tools } options instead.`,
      );
    }
  }
  if (isObj(raw)) resolvePathKeys(raw, base);
  const cfg = validateConfig(raw, 'config object', { name: opts.name });
  cfg.run.dir = resolve(base, expandHome(cfg.run.dir));
  return cfg;
}

/** The run folder a config writes into: run.dir/run.name. */
export function runDir(cfg: ResolvedConfig): string {
  return join(cfg.run.dir, cfg.run.name ?? cfg.stage);
}

/** Paths in the config that do not exist on this machine ("data.sft: /x/y.jsonl"). */
export function missingFiles(cfg: ResolvedConfig): string[] {
  const out: string[] = [];
  for (const key of PATH_KEYS) {
    const [sec, k] = key.split('.');
    const v = (cfg as unknown as Record<string, Obj>)[sec][k];
    if (isPathValue(key, v) && !existsSync(v)) out.push(`${key}: ${v}`);
  }
  return out;
}

/** The resolved config as YAML, with a header saying where it came from. */
export function configToYaml(cfg: ResolvedConfig, source?: { file?: string; overrides?: readonly string[] }): string {
  const head = ['# The resolved slm-train config of this run: defaults filled, paths absolute.'];
  if (source?.file) head.push(`# from: ${source.file}`);
  if (source?.overrides?.length) head.push(`# overrides: ${source.overrides.join(' ')}`);
  const doc = new YAML.Document(cfg);
  // Short lists of scalars on one line: temperature: [0.7, 1.15], targets: [q_proj, k_proj].
  YAML.visit(doc, {
    Seq(_, node) {
      if (node.items.every((i) => YAML.isScalar(i))) node.flow = true;
    },
  });
  return head.join('\n') + '\n' + doc.toString({ lineWidth: 0, flowCollectionPadding: false });
}

/** Writes `config.yaml` into a run folder atomically (temp file + rename); returns its path. */
export function writeResolvedConfig(cfg: ResolvedConfig, dir: string, source?: { file?: string; overrides?: readonly string[] }): string {
  mkdirSync(dir, { recursive: true });
  const file = join(dir, 'config.yaml');
  const tmp = `${file}.tmp-${process.pid}`;
  writeFileSync(tmp, configToYaml(cfg, source));
  renameSync(tmp, file);
  return file;
}
