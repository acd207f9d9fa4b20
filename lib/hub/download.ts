/**
 * Downloads from the Hugging Face hub for `hf:` references (lib/hub/ref.ts), with the maintained
 * client `@huggingface/hub` (repository info, file listing, file download), into the hub's own cache
 * layout, shared with Python's huggingface_hub (lib/hub/cache.ts).
 *
 * - Once a reference has been fully downloaded, using it again makes no request at all (its
 *   selection and commit are remembered); pin a commit with `@REVISION`, or delete the repository's
 *   cache folder, to pick up a newer `main`.
 * - The requests, and files checked and resumed when a download breaks: lib/hub/client.ts; the
 *   options and environment variables (HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE, ...): lib/hub/settings.ts.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { isSlmError, SlmError } from '../errors.js';
import { cachedSnapshot, manifestPath, storageDir, writeAtomic } from './cache.js';
import { Client, COMMIT } from './client.js';
import { INDEX_FILE, indexShards, isHubRef, parseHubRef, selectDataFiles, selectModelFiles, type HubRef, type RepoKind } from './ref.js';
import { type HubOptions, settings, type Settings } from './settings.js';

export type { HubOptions };

// ---------------------------------------------------------------------------------------------
// Public entry points

/** A model folder: the path itself, or for `hf:OWNER/NAME` the downloaded snapshot folder. */
export async function localModelDir(pathOrRef: string, opts: HubOptions = {}): Promise<string> {
  if (!isHubRef(pathOrRef)) return pathOrRef;
  const ref = parseHubRef(pathOrRef);
  const { root } = await fetchInCache(ref, 'model', settings(opts));
  return ref.path ? join(root, ref.path) : root;
}

/** The local files of a data source: `[path]`, or for `hf:OWNER/NAME[:split]` its downloaded data files. */
export async function localDataFiles(pathOrRef: string, o: HubOptions = {}): Promise<string[]> {
  if (!isHubRef(pathOrRef)) return [pathOrRef];
  const { root, files } = await fetchInCache(parseHubRef(pathOrRef), 'dataset', settings(o));
  return files.map((f) => join(root, f));
}

/** fetchSnapshot, with the cache's file-system failures (no permission, no space, ...) said as such. */
async function fetchInCache(ref: HubRef, kind: RepoKind, settings: Settings): Promise<{ root: string; files: string[] }> {
  try {
    return await fetchSnapshot(ref, kind, settings);
  } catch (e) {
    throw hubCacheError(e, settings.cacheDir, ref.text) ?? e;
  }
}

const NO_PERMISSION = 'Make it writable by this user, or point HF_HUB_CACHE (or HF_HOME) at a folder you can write.';
const CACHE_ERRNO: Record<string, string> = {
  EACCES: NO_PERMISSION,
  EPERM: NO_PERMISSION,
  EROFS: 'It is on a read-only file system; point HF_HUB_CACHE (or HF_HOME) at a writable folder.',
  ENOSPC:
    'The disk is full: free space there, or point HF_HUB_CACHE (or HF_HOME) at a disk with room; the partial file is kept and the next run resumes it.',
  EDQUOT:
    'The disk quota is used up: free space, or point HF_HUB_CACHE (or HF_HOME) at another disk; the partial file is kept and the next run resumes it.',
  ENOTDIR: 'Part of that path is a file, not a folder; point HF_HUB_CACHE (or HF_HOME) at a folder.',
};

/**
 * HUB_CACHE_UNWRITABLE for a file-system error of the hub cache (a Node error with an errno code
 * such as EACCES or ENOSPC), naming the cache, the operation and what to do; undefined for anything
 * else (SlmErrors and other failures pass as they are).
 */
export function hubCacheError(e: unknown, cacheDir: string, what: string): SlmError | undefined {
  if (isSlmError(e)) return undefined;
  const err = e as NodeJS.ErrnoException;
  const hint = typeof err?.code === 'string' ? CACHE_ERRNO[err.code] : undefined;
  if (!hint) return undefined;
  const op = [err.syscall, err.path].filter(Boolean).join(' ');
  return new SlmError(
    'HUB_CACHE_UNWRITABLE',
    `${what}: the Hugging Face cache at ${cacheDir} could not be written (${err.code}${op ? ` on ${op}` : ''}). ${hint}`,
    { cacheDir, errno: err.code },
  );
}

/** `hf:OWNER/NAME` -> "OWNER/NAME" (a display name), anything else -> undefined. */
export function hubRepoName(s: string): string | undefined {
  return isHubRef(s) ? parseHubRef(s).repo : undefined;
}

// ---------------------------------------------------------------------------------------------
// Snapshots

async function fetchSnapshot(ref: HubRef, kind: RepoKind, settings: Settings): Promise<{ root: string; files: string[] }> {
  const storage = storageDir(settings, kind, ref.repo);
  const cached = cachedSnapshot(storage, kind, ref);
  if (cached) return cached;
  if (settings.offline)
    throw new SlmError(
      'HUB_UNREACHABLE',
      `${ref.text} is not in the cache (${storage}) and HF_HUB_OFFLINE is set, so it cannot be downloaded. Unset HF_HUB_OFFLINE, or download it once on a machine with access to ${settings.endpoint}.`,
    );
  const client = new Client(ref, kind, settings);
  const sha = COMMIT.test(ref.revision) ? ref.revision : await client.commit();
  const listing = await client.list(sha);
  let files: string[];
  if (kind === 'dataset') files = selectDataFiles(ref, listing);
  else {
    files = selectModelFiles(ref, listing);
    const index = ref.path ? `${ref.path}/${INDEX_FILE}` : INDEX_FILE;
    if (files.includes(index)) {
      const local = await client.ensure(storage, sha, listing.find((f) => f.path === index)!);
      files = selectModelFiles(ref, listing, indexShards(readFileSync(local, 'utf8'), `${ref.text}: ${index}`));
    }
  }
  const byPath = new Map(listing.map((f) => [f.path, f]));
  for (const f of files) await client.ensure(storage, sha, byPath.get(f)!);
  if (!COMMIT.test(ref.revision)) writeAtomic(join(storage, 'refs', ref.revision), sha);
  writeAtomic(manifestPath(storage, kind, ref), JSON.stringify({ ref: ref.text, revision: ref.revision, sha, files }) + '\n');
  return { root: join(storage, 'snapshots', sha), files };
}
