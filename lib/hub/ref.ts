/**
 * `hf:` references to Hugging Face hub repositories, and which of a repository's files they mean.
 * Pure functions (no network, no files): lib/hub/download.ts fetches what these select.
 *
 *   hf:OWNER/NAME[@REVISION][/PATH][:SPLIT]
 *
 * - a model (`--model`, `model.path`, `--adapter`, an embedder): the files of the repository's root
 *   (or of PATH, a subfolder) that a model folder needs: JSON (config, tokenizer, index), the chat
 *   template, tokenizer text files, and the safetensors weights (only the shards the index names);
 * - a dataset (`--corpus`, `--questions`, `data.*`): PATH a data file (`data/test.parquet`) or a
 *   folder (a dataset config) to look in; SPLIT picks the files named for that split the way the
 *   `datasets` library does (`train.parquet`, `data/test-00000-of-00001.parquet`, `nq_dev.jsonl`);
 *   without SPLIT: the only data file, else the `train` split.
 */
import { SlmError } from '../errors.js';

export type RepoKind = 'model' | 'dataset';

export interface HubRef {
  /** OWNER/NAME */
  repo: string;
  /** Branch, tag or commit; "main" when not given. */
  revision: string;
  /** A file or folder inside the repository ("" for the root). */
  path: string;
  split?: string;
  /** The reference as written, for messages. */
  text: string;
}

const HUB_PREFIX = 'hf:';

export function isHubRef(s: unknown): s is string {
  return typeof s === 'string' && s.startsWith(HUB_PREFIX);
}

const NAME = /^[A-Za-z0-9][\w.-]*$/;

export function parseHubRef(text: string): HubRef {
  const bad = (why: string): never => {
    throw new SlmError(
      'ARGUMENT_INVALID',
      `${JSON.stringify(text)} is not a hub reference: ${why}. Expected hf:OWNER/NAME[@REVISION][/PATH][:SPLIT], e.g. hf:Qwen/Qwen3-0.6B or hf:PeterJinGo/nq_hotpotqa_train:test.`,
    );
  };
  if (!isHubRef(text)) bad('it does not start with hf:');
  let rest = text.slice(HUB_PREFIX.length);
  let split: string | undefined;
  const colon = rest.lastIndexOf(':');
  if (colon >= 0) {
    split = rest.slice(colon + 1);
    rest = rest.slice(0, colon);
    if (!/^[\w.-]+$/.test(split)) bad(`the split ${JSON.stringify(split)} is not a name`);
  }
  const parts = rest.split('/');
  if (parts.length < 2) bad('the repository needs an owner and a name');
  const owner = parts[0];
  let name = parts[1];
  let revision = 'main';
  const at = name.indexOf('@');
  if (at >= 0) {
    revision = name.slice(at + 1);
    name = name.slice(0, at);
    if (!/^[\w.-]+$/.test(revision)) bad(`the revision ${JSON.stringify(revision)} is not a branch, tag or commit name`);
  }
  if (!NAME.test(owner) || !NAME.test(name)) bad(`${JSON.stringify(`${owner}/${name}`)} is not a repository name`);
  const path = parts
    .slice(2)
    .filter((p) => p !== '')
    .join('/');
  if (path.split('/').some((p) => p === '..' || p === '.')) bad('the path inside the repository may not contain . or ..');
  return { repo: `${owner}/${name}`, revision, path, ...(split !== undefined ? { split } : {}), text };
}

/** What a repository file looks like to the selectors (listFiles' entries). */
export interface RepoFile {
  path: string;
  size: number;
}

// ---------------------------------------------------------------------------------------------
// Datasets

export const DATA_EXTENSIONS = ['.parquet', '.jsonl', '.json'] as const;
/** JSON files that describe a dataset rather than hold its rows (`datasets`' metadata, save_to_disk state). */
const METADATA = new Set(['dataset_info.json', 'dataset_infos.json', 'dataset_dict.json', 'state.json', 'config.json']);
const KNOWN_SPLITS = ['train', 'test', 'validation', 'valid', 'dev', 'eval'];

function dataExt(path: string): string | undefined {
  const base = path.slice(path.lastIndexOf('/') + 1).toLowerCase();
  if (METADATA.has(base) || base.startsWith('.')) return undefined;
  return DATA_EXTENSIONS.find((e) => base.endsWith(e));
}

/** Whether a file path names the split, delimited as the `datasets` library's default patterns delimit it. */
export function pathHasSplit(path: string, split: string): boolean {
  const esc = split.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  return new RegExp(`(^|[-._ /0-9])${esc}([-._ /0-9]|$)`, 'i').test(path);
}

function under(path: string, folder: string): boolean {
  return folder === '' || path.startsWith(folder + '/');
}

/**
 * The data files of `ref` among the repository's files, in name order (shards in sequence), all of
 * one format (Parquet preferred). Throws HUB_NOT_FOUND, naming what the repository holds, when
 * nothing fits.
 */
export function selectDataFiles(ref: HubRef, files: readonly RepoFile[]): string[] {
  const exact = files.find((f) => f.path === ref.path);
  if (exact) {
    if (!dataExt(exact.path))
      throw new SlmError('HUB_NOT_FOUND', `${ref.text}: ${exact.path} is not a data file; expected ${DATA_EXTENSIONS.join(', ')}.`);
    return [exact.path];
  }
  const data = files.filter((f) => under(f.path, ref.path) && dataExt(f.path)).map((f) => f.path);
  const listing = () => {
    const shown = files
      .slice(0, 12)
      .map((f) => f.path)
      .join(', ');
    return files.length ? `it holds ${shown}${files.length > 12 ? `, ... (${files.length} files)` : ''}` : 'it holds no files';
  };
  if (!data.length)
    throw new SlmError(
      'HUB_NOT_FOUND',
      `${ref.text}: no ${DATA_EXTENSIONS.join('/')} files${ref.path ? ` under ${ref.path}/` : ''} in dataset ${ref.repo}@${ref.revision}; ${listing()}. Name a file or folder: hf:${ref.repo}/PATH.`,
    );
  let chosen: string[];
  if (ref.split !== undefined) {
    chosen = data.filter((p) => pathHasSplit(p.slice(ref.path ? ref.path.length + 1 : 0), ref.split!));
    if (!chosen.length) {
      const splits = KNOWN_SPLITS.filter((s) => data.some((p) => pathHasSplit(p, s)));
      throw new SlmError(
        'HUB_NOT_FOUND',
        `${ref.text}: no data file of split "${ref.split}" in dataset ${ref.repo}@${ref.revision}${splits.length ? `; its splits: ${splits.join(', ')}` : ''}; data files: ${data.slice(0, 12).join(', ')}. Use hf:${ref.repo}:SPLIT or hf:${ref.repo}/PATH.`,
      );
    }
  } else {
    const named = KNOWN_SPLITS.filter((s) => data.some((p) => pathHasSplit(p, s)));
    if (data.length === 1 || !named.length) chosen = data;
    else if (named.includes('train')) chosen = data.filter((p) => pathHasSplit(p, 'train'));
    else
      throw new SlmError(
        'HUB_NOT_FOUND',
        `${ref.text}: dataset ${ref.repo} has the splits ${named.join(', ')} and no train split; choose one: hf:${ref.repo}:${named[0]}.`,
      );
  }
  for (const ext of DATA_EXTENSIONS) {
    const same = chosen.filter((p) => dataExt(p) === ext);
    if (same.length) return same.sort();
  }
  return chosen.sort();
}

// ---------------------------------------------------------------------------------------------
// Models

/** Root files a model (or PEFT adapter) folder is read from; weights other than safetensors are skipped. */
const MODEL_FILE = /\.(json|jinja|txt|model|safetensors)$/i;

/**
 * The files of a model folder (`ref.path` its subfolder): configs, tokenizer, chat template and
 * safetensors. `shards`: the files model.safetensors.index.json names, once it has been read
 * (undefined before: then every safetensors file counts, see modelFilesAfterIndex).
 */
export function selectModelFiles(ref: HubRef, files: readonly RepoFile[], shards?: ReadonlySet<string>): string[] {
  const prefix = ref.path ? ref.path + '/' : '';
  const out = files
    .map((f) => f.path)
    .filter((p) => p.startsWith(prefix) && !p.slice(prefix.length).includes('/') && MODEL_FILE.test(p))
    .filter((p) => {
      if (!shards || !p.endsWith('.safetensors')) return true;
      const base = p.slice(prefix.length);
      // With an index, its shards; other safetensors (adapter, value head) are not model weights.
      return shards.has(base) || !/^model[-.]/.test(base);
    });
  if (!out.some((p) => p === `${prefix}config.json` || p === `${prefix}adapter_config.json`)) {
    const weights = files.filter((f) => /\.(bin|pt|pth|gguf|onnx)$/i.test(f.path)).map((f) => f.path);
    throw new SlmError(
      'HUB_NOT_FOUND',
      `${ref.text}: ${ref.repo}@${ref.revision}${ref.path ? ` (folder ${ref.path})` : ''} has no config.json (nor adapter_config.json), so it is not a model folder${weights.length ? ` (it holds ${weights.slice(0, 4).join(', ')})` : ''}. Expected a Hugging Face model: config.json, tokenizer files and *.safetensors.`,
    );
  }
  return out.sort();
}

export const INDEX_FILE = 'model.safetensors.index.json';

/** The shard file names of a safetensors index's weight_map. */
export function indexShards(indexJson: string, where: string): Set<string> {
  try {
    const map = (JSON.parse(indexJson) as { weight_map?: Record<string, string> }).weight_map;
    if (map && typeof map === 'object') return new Set(Object.values(map));
  } catch {
    /* reported below */
  }
  throw new SlmError('WEIGHTS_CORRUPT', `${where} is not a safetensors index (expected JSON with a "weight_map" of tensor -> shard file).`);
}
