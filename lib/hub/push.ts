/**
 * Publishing an adapter to a Hugging Face hub (`slm-train push`): the PEFT adapter folder of a run
 * (or an adapter folder by itself) plus a generated model card README.md — the run's resolved
 * config, its data, and the evaluation table — in one commit, through @huggingface/hub's createRepo
 * and commit (the hub's preupload / LFS batch / commit endpoints; weights go as LFS files).
 *
 * The endpoint and token come from the options or the environment as for downloads
 * (lib/hub/settings.ts): HF_ENDPOINT, HF_TOKEN (a token with write access).
 */
import { existsSync, readFileSync, statSync } from 'node:fs';
import { basename, join, resolve } from 'node:path';
import { commit, createRepo, type CommitOperation } from '@huggingface/hub';
import YAML from 'yaml';
import { SlmError } from '../errors.js';
import { CRITIC_ADAPTER, VALUE_HEAD } from '../engine/adapter.js';
import { readRows } from '../train/run.js';
import { comparisonTable } from '../train/evaluation.js';
import { isHubRef, parseHubRef } from './ref.js';
import { settings, type HubOptions } from './settings.js';

/** The files of a PEFT adapter folder that are published (PPO's value head and separate critic too when there are). */
const ADAPTER_FILES = ['adapter_config.json', 'adapter_model.safetensors', VALUE_HEAD, CRITIC_ADAPTER];

export interface PushOptions extends HubOptions {
  /** OWNER/NAME of the model repository (created when missing). */
  repo: string;
  /** Create the repository private (default: the hub's default, public). */
  private?: boolean;
  /** Branch to commit to (default main; must exist). */
  branch?: string;
  /** Commit title (default "Upload adapter trained with slm-train"). */
  message?: string;
  /** Write the model card and list the files, but upload nothing. */
  dryRun?: boolean;
}

export interface PushResult {
  repo: string;
  url: string;
  commit?: string;
  files: string[];
  card: string;
}

/** What a push publishes: the adapter folder, and the run folder around it when there is one. */
export interface PushSource {
  adapter: string;
  run?: string;
}

/**
 * A run folder (config.yaml + adapter/) or an adapter folder (adapter_config.json); a checkpoint
 * folder (checkpoints/step-N, with adapter/) belongs to the run two levels up.
 */
export function pushSource(path: string): PushSource {
  const dir = resolve(path);
  if (!existsSync(dir))
    throw new SlmError(
      'FILE_NOT_FOUND',
      `push: ${path} does not exist; give a run folder (runs/NAME, with adapter/) or a PEFT adapter folder.`,
    );
  if (existsSync(join(dir, 'adapter_config.json'))) {
    // An adapter inside a run (RUN/adapter or RUN/checkpoints/step-N/adapter): the run gives the card.
    const up = [resolve(dir, '..'), resolve(dir, '..', '..', '..')].find(
      (d) => existsSync(join(d, 'config.yaml')) && existsSync(join(d, 'metrics.jsonl')),
    );
    return up ? { adapter: dir, run: up } : { adapter: dir };
  }
  if (existsSync(join(dir, 'adapter', 'adapter_config.json')))
    return { adapter: join(dir, 'adapter'), run: existsSync(join(dir, 'config.yaml')) ? dir : undefined };
  const hint = existsSync(join(dir, 'config.yaml'))
    ? ' It holds config.yaml but no adapter/: the run has not finished; push one of its checkpoints (checkpoints/step-N/adapter) instead.'
    : '';
  throw new SlmError(
    'ADAPTER_NOT_FOUND',
    `push: ${path} has no adapter_config.json and no adapter/adapter_config.json: give a run folder written by \`slm-train train\` or a PEFT adapter folder.${hint}`,
  );
}

const hubId = (s: unknown): string | undefined => {
  if (typeof s !== 'string' || !s) return undefined;
  if (isHubRef(s)) return parseHubRef(s).repo;
  return /^[A-Za-z0-9][\w.-]*\/[A-Za-z0-9][\w.-]*$/.test(s) && !existsSync(s) ? s : undefined;
};

function lineCount(file: string): number | undefined {
  try {
    if (!statSync(file).isFile() || !/\.jsonl$/i.test(file)) return undefined;
    return readFileSync(file, 'utf8')
      .split('\n')
      .filter((l) => l.trim()).length;
  } catch {
    return undefined;
  }
}

const pct = (x: unknown) => (typeof x === 'number' && Number.isFinite(x) ? (100 * x).toFixed(1) : '');

/** The evaluation table of a run: its evaluations' summaries (RUN/evals/*), else the eval rows of metrics.jsonl. */
export function runEvalTable(run: string): string | undefined {
  const table = comparisonTable(join(run, 'evals'));
  if (table.split('\n').length > 2) return table;
  const rows = readRows(join(run, 'metrics.jsonl')).filter((r) => r.kind === 'eval');
  if (!rows.length) return undefined;
  return [
    '| step | accuracy % | EM % | F1 % | answered % | avg turns |',
    '|---:|---:|---:|---:|---:|---:|',
    ...rows.map(
      (r) =>
        `| ${r.step} | ${pct(r.eval_accuracy)} | ${pct(r.eval_em)} | ${pct(r.eval_f1)} | ${pct(r.eval_answered)} | ${typeof r.eval_avg_turns === 'number' ? r.eval_avg_turns.toFixed(2) : ''} |`,
    ),
  ].join('\n');
}

/**
 * The model card (README.md) of an adapter: hub metadata (base_model, library_name: peft, tags,
 * datasets), what was trained, the data, the evaluation table, the resolved config, and how to load it.
 */
export function modelCard(src: PushSource, repo: string): string {
  const adapterCfg = JSON.parse(readFileSync(join(src.adapter, 'adapter_config.json'), 'utf8')) as Record<string, unknown>;
  const cfgText = src.run ? readFileSync(join(src.run, 'config.yaml'), 'utf8') : undefined;
  const cfg = (cfgText ? YAML.parse(cfgText) : {}) as { stage?: string; model?: { path?: string }; data?: Record<string, unknown> };
  const metrics = src.run ? readRows(join(src.run, 'metrics.jsonl')) : [];
  const steps = metrics.filter((r) => r.kind !== 'eval' && typeof r.step === 'number').reduce((m, r) => Math.max(m, r.step as number), 0);
  const base = hubId(cfg.model?.path) ?? hubId(adapterCfg.base_model_name_or_path);
  const baseText = String(cfg.model?.path ?? adapterCfg.base_model_name_or_path ?? 'unknown');
  const data = Object.entries(cfg.data ?? {}).filter(
    ([k, v]) => ['sft', 'questions', 'eval_questions', 'corpus', 'index'].includes(k) && typeof v === 'string',
  ) as Array<[string, string]>;
  const datasets = [...new Set(data.map(([, v]) => hubId(v)).filter((x): x is string => !!x))];
  const meta: Record<string, unknown> = {
    ...(base ? { base_model: base } : {}),
    library_name: 'peft',
    pipeline_tag: 'text-generation',
    tags: ['slm-train', 'lora', ...(cfg.stage ? [cfg.stage] : [])],
    ...(datasets.length ? { datasets } : {}),
  };
  const out: string[] = ['---', YAML.stringify(meta).trimEnd(), '---', '', `# ${repo.split('/')[1] ?? repo}`, ''];
  out.push(
    `A LoRA adapter (PEFT format: r=${adapterCfg.r}, lora_alpha=${adapterCfg.lora_alpha}, target_modules ${JSON.stringify(adapterCfg.target_modules)}) for \`${baseText}\`, trained with [slm-train](https://www.npmjs.com/package/slm-train)${cfg.stage ? ` (stage \`${cfg.stage}\`${steps ? `, ${steps} steps` : ''})` : ''}.`,
    '',
  );
  out.push('## Data', '');
  if (data.length)
    for (const [k, v] of data) {
      const n = hubId(v) ? undefined : lineCount(v);
      out.push(
        `- \`data.${k}\`: ${hubId(v) ? `[${v}](https://huggingface.co/datasets/${hubId(v)})` : `\`${basename(v)}\``}${n !== undefined ? ` (${n} rows)` : ''}`,
      );
    }
  else out.push('Not recorded (the adapter was pushed without its run folder).');
  out.push('', '## Evaluation', '');
  out.push(
    (src.run && runEvalTable(src.run)) || 'No evaluation was recorded in the run (set `train.eval_every`, or run `slm-train eval`).',
  );
  out.push(
    '',
    '## Usage',
    '',
    '```python',
    'from peft import AutoPeftModelForCausalLM',
    `model = AutoPeftModelForCausalLM.from_pretrained("${repo}")`,
    '```',
    '',
  );
  out.push(
    'Or with slm-train: `slm-train generate --model BASE --adapter hf:' +
      repo +
      ' --prompt "..."`; serve it with vLLM by `--enable-lora --lora-modules name=' +
      repo +
      '`, or merge it first with `slm-train export --merged`.',
    '',
  );
  if (cfgText)
    out.push(
      '## Training configuration',
      '',
      'The resolved config of the run (`config.yaml`; local paths as they were on the training machine):',
      '',
      '```yaml',
      cfgText.trimEnd(),
      '```',
      '',
    );
  return out.join('\n');
}

/** Uploads the adapter and its model card to `o.repo` on the hub, creating the repository if needed. */
export async function pushAdapter(path: string, opts: PushOptions): Promise<PushResult> {
  if (!/^[A-Za-z0-9][\w.-]*\/[A-Za-z0-9][\w.-]*$/.test(opts.repo))
    throw new SlmError(
      'ARGUMENT_INVALID',
      `push: --repo must be OWNER/NAME (the repository's address on the hub), found ${JSON.stringify(opts.repo)}.`,
    );
  const src = pushSource(path);
  const card = modelCard(src, opts.repo);
  const files = ADAPTER_FILES.filter((f) => existsSync(join(src.adapter, f)));
  if (!files.includes('adapter_model.safetensors'))
    throw new SlmError('ADAPTER_NOT_FOUND', `push: ${src.adapter} has no adapter_model.safetensors.`);
  const extra = src.run ? ['config.yaml', 'metrics.jsonl'].filter((f) => existsSync(join(src.run!, f))) : [];
  const s = settings(opts);
  const url = `${s.endpoint}/${opts.repo}`;
  const all = [...files, ...extra.map((f) => `training/${f}`), 'README.md'];
  if (opts.dryRun) return { repo: opts.repo, url, files: all, card };
  if (s.offline)
    throw new SlmError(
      'HUB_UNREACHABLE',
      'push: HF_HUB_OFFLINE is set: uploading needs the network. Unset it (or use --dry-run to only write the card).',
    );
  if (!s.token)
    throw new SlmError(
      'HUB_AUTH_REQUIRED',
      `push: uploading to ${s.endpoint} needs an access token with write access: set HF_TOKEN (https://huggingface.co/settings/tokens).`,
    );
  const creds = { hubUrl: s.endpoint, accessToken: s.token };
  const fail = (e: unknown, what: string): SlmError => {
    const status = (e as { statusCode?: number }).statusCode;
    if (status === 401 || status === 403)
      return new SlmError(
        'HUB_AUTH_REQUIRED',
        `push: ${what}: the hub at ${s.endpoint} answered ${status}: the token in HF_TOKEN has no write access to ${opts.repo} (create one with the "write" role).`,
        { status },
      );
    if (typeof status === 'number')
      return new SlmError('HUB_UPLOAD_FAILED', `push: ${what}: the hub at ${s.endpoint} answered ${status} (${(e as Error).message}).`, {
        status,
      });
    const c = (e as { cause?: { code?: string } }).cause;
    return new SlmError(
      'HUB_UNREACHABLE',
      `push: ${what}: could not reach the hub at ${s.endpoint} (${c?.code ?? (e as Error).message}). Check the network and HF_ENDPOINT.`,
    );
  };
  try {
    await createRepo({
      repo: { type: 'model', name: opts.repo },
      ...(opts.private !== undefined ? { private: opts.private } : {}),
      ...creds,
    });
  } catch (e) {
    // 409: it exists already (a later push of the same repository).
    if ((e as { statusCode?: number }).statusCode !== 409) throw fail(e, `creating ${opts.repo}`);
  }
  const blob = (file: string) => new Blob([readFileSync(file)]);
  const operations: CommitOperation[] = [
    ...files.map((f) => ({ operation: 'addOrUpdate' as const, path: f, content: blob(join(src.adapter, f)) })),
    ...extra.map((f) => ({ operation: 'addOrUpdate' as const, path: `training/${f}`, content: blob(join(src.run!, f)) })),
    { operation: 'addOrUpdate' as const, path: 'README.md', content: new Blob([card]) },
  ];
  try {
    const r = await commit({
      repo: { type: 'model', name: opts.repo },
      operations,
      title: opts.message ?? 'Upload adapter trained with slm-train',
      ...(opts.branch ? { branch: opts.branch } : {}),
      ...creds,
    });
    s.log(`hub: pushed ${all.length} files to ${url}`);
    return { repo: opts.repo, url, commit: r?.commit.oid, files: all, card };
  } catch (e) {
    throw fail(e, `uploading to ${opts.repo}`);
  }
}
