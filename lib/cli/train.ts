/**
 * `slm-train train --config FILE [key=value ...] [--resume]` and
 * `slm-train eval --config FILE [key=value ...] [--adapter DIR] [--label NAME]`.
 */
import type { CommandModule } from 'yargs';
import { loadConfig, missingFiles } from '../config/load.js';
import type { ResolvedConfig } from '../config/types.js';
import { SlmError } from '../errors.js';
import { checkRequiredIsolation, detectIsolation, filesystemLine } from '../sandbox/isolation.js';
import { evalFromConfig } from '../train/evaluation.js';
import { trainFromConfig } from '../train/session.js';
import { progressLog } from '../util/progress.js';
import { print } from './common.js';
import { launchWorkers } from '../distributed/launch.js';

interface Args {
  config: string;
  overrides?: string[];
  resume?: boolean;
  allowScheduleChange?: boolean;
  adapter?: string;
  label?: string;
  nproc?: number;
  json?: boolean;
}

// Log lines and progress bars on stderr (lines above a live bar on a terminal); stdout stays for the result.
const log = progressLog(process.stderr, '[slm-train] ');
const progress = { stream: process.stderr };

/** Files the command reads: SFT training reads data.sft only; RL and eval read everything but it. */
function load(args: Args, command: 'train' | 'eval'): ResolvedConfig {
  const cfg = loadConfig(args.config, (args.overrides ?? []).map(String));
  const sftOnly = command === 'train' && cfg.stage === 'sft';
  const unused = (key: string) => (sftOnly ? key !== 'data.sft' && key !== 'model.path' && key !== 'model.adapter' : key === 'data.sft');
  // data.index may be a folder still to be built from data.corpus.
  const missing = missingFiles(cfg).filter((m) => !unused(m.slice(0, m.indexOf(':'))) && !(m.startsWith('data.index:') && cfg.data.corpus));
  if (missing.length)
    throw new SlmError(
      'FILE_NOT_FOUND',
      `the config names files that do not exist: ${missing.join('; ')}. Fix the paths in ${args.config} or override them (e.g. data.questions=path/to/questions.jsonl).`,
    );
  return cfg;
}

/**
 * Before a run whose episodes execute programs: says what a program can read at the isolation level
 * this machine gives, and refuses to start below sandbox.require_isolation
 * (SANDBOX_ISOLATION_INSUFFICIENT) before anything is loaded.
 */
async function sandboxPreflight(cfg: ResolvedConfig, command: 'train' | 'eval', say: (line: string) => void = log): Promise<void> {
  const runsPrograms = cfg.protocol.kind === 'code' && (command === 'eval' || cfg.stage !== 'sft' || cfg.train.eval_every > 0);
  if (!runsPrograms) return;
  const sb = cfg.sandbox;
  if (sb.kind !== 'python') {
    say('sandbox: quickjs (WebAssembly): a program can read no file at all');
    return;
  }
  const iso = await detectIsolation();
  say(`sandbox: isolation ${filesystemLine(iso)}`);
  checkRequiredIsolation(iso, sb.require_isolation, 'sandbox.require_isolation');
}

export const trainCommand: CommandModule<object, Args> = {
  command: 'train [overrides..]',
  describe: 'run the stage named in the config (sft, grpo, rloo, ppo, rft); key=value overrides with dotted paths',
  builder: (yargs) =>
    yargs
      .positional('overrides', { type: 'string', array: true, describe: 'key=value overrides, e.g. optim.lr=5e-5 rollout.k=8' })
      .option('config', { type: 'string', demandOption: true, describe: 'YAML config (see configs/)' })
      .option('resume', { type: 'boolean', describe: 'continue the run from its newest complete checkpoint' })
      .option('allow-schedule-change', {
        type: 'boolean',
        describe:
          "with --resume: continue even though the learning-rate schedule (step total, optim.lr, schedule, warm-up) differs from the checkpoint's",
      })
      .option('nproc', { type: 'number', describe: 'worker processes on this node, one per device (data-parallel; see README "Scaling")' })
      .option('json', { type: 'boolean', describe: 'print the result as JSON' }) as never,
  handler: async (args) => {
    const cfg = load(args, 'train');
    await sandboxPreflight(cfg, 'train');
    if (await launchWorkers(cfg.distributed, { nproc: args.nproc, log })) return;
    const r = await trainFromConfig(cfg, {
      resume: args.resume,
      allowScheduleChange: args.allowScheduleChange,
      log,
      progress,
      overrides: args.overrides,
      configFile: args.config,
    });
    if (args.json) print(JSON.stringify(r));
    else print(`${r.stage}: ${r.steps} steps; run ${r.dir}; adapter ${r.adapter}`);
  },
};

export const evalCommand: CommandModule<object, Args> = {
  command: 'eval [overrides..]',
  describe: 'evaluate the model (with an adapter) on the configured split; prints and saves a comparison table',
  builder: (yargs) =>
    yargs
      .positional('overrides', { type: 'string', array: true, describe: 'key=value overrides, e.g. eval.max_questions=50' })
      .option('config', { type: 'string', demandOption: true, describe: 'YAML config (see configs/)' })
      .option('adapter', {
        type: 'string',
        describe: 'a PEFT adapter folder (default: model.adapter of the config; none = the base model)',
      })
      .option('label', { type: 'string', describe: 'name of this evaluation in the comparison table (default: base, or the adapter run)' })
      .option('json', { type: 'boolean', describe: 'print the summary as JSON' }) as never,
  handler: async (args) => {
    const cfg = load(args, 'eval');
    await sandboxPreflight(cfg, 'eval');
    const r = await evalFromConfig(cfg, { adapter: args.adapter, label: args.label, log, progress });
    if (args.json) print(JSON.stringify(r.summary));
    else print(`${r.table}\n\nsaved: ${r.dir}/summary.json, ${r.dir}/trajectories.jsonl`);
  },
};
