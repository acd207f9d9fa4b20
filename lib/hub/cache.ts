/**
 * The hub cache's layout on disk (shared with Python's huggingface_hub):
 *
 *   $HF_HUB_CACHE (or $HF_HOME/hub, or ~/.cache/huggingface/hub)/
 *     models--OWNER--NAME/ (datasets--OWNER--NAME/)
 *       refs/main                      the commit `main` resolved to
 *       blobs/<sha256 or git oid>      file contents (.incomplete while downloading, .lock while owned)
 *       snapshots/<commit>/<path>      symlinks to the blobs: a model folder / the data files
 *       .slm-train/<key>.json          which snapshot files a reference selected (for offline re-runs)
 *
 * Here: the paths of that layout, the remembered selections (manifests), atomic small writes, and
 * the lock that keeps two processes from writing the same blob.
 */
import { createHash } from 'node:crypto';
import {
  existsSync,
  mkdirSync,
  openSync,
  closeSync,
  readFileSync,
  renameSync,
  statSync,
  unlinkSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { dirname, join } from 'node:path';
import type { HubRef, RepoKind } from './ref.js';
import type { Settings } from './settings.js';

/** A repository's folder in the cache. */
export function storageDir(s: Settings, kind: RepoKind, repo: string): string {
  return join(s.cacheDir, `${kind}s--${repo.split('/').join('--')}`);
}

/** Where the selection of a reference is remembered. */
export function manifestPath(storage: string, kind: RepoKind, ref: HubRef): string {
  const key = createHash('sha256')
    .update(JSON.stringify([kind, ref.revision, ref.path, ref.split ?? null]))
    .digest('hex')
    .slice(0, 16);
  return join(storage, '.slm-train', `${key}.json`);
}

/** The snapshot of a completed earlier download of the same reference, when every file is still there. */
export function cachedSnapshot(storage: string, kind: RepoKind, ref: HubRef): { root: string; files: string[] } | undefined {
  let m: { sha?: string; files?: string[] };
  try {
    m = JSON.parse(readFileSync(manifestPath(storage, kind, ref), 'utf8'));
  } catch {
    return undefined;
  }
  if (typeof m.sha !== 'string' || !Array.isArray(m.files)) return undefined;
  const root = join(storage, 'snapshots', m.sha);
  return m.files.every((f) => existsSync(join(root, f))) ? { root, files: m.files } : undefined;
}

/** Writes `text` to a temporary file and renames it into place. */
export function writeAtomic(file: string, text: string): void {
  mkdirSync(dirname(file), { recursive: true });
  const tmp = `${file}.tmp-${process.pid}`;
  writeFileSync(tmp, text);
  renameSync(tmp, file);
}

/**
 * Runs `fn` holding `lock` (a file with our pid), so that two processes (e.g. the ranks of a
 * distributed run) never write the same blob; a lock whose process is gone is taken over; returns
 * early when `done()` becomes true while waiting.
 */
export async function withLock(lock: string, done: () => boolean, log: (s: string) => void, fn: () => Promise<void>): Promise<void> {
  mkdirSync(dirname(lock), { recursive: true });
  let told = false;
  for (;;) {
    try {
      const fd = openSync(lock, 'wx');
      writeSync(fd, String(process.pid));
      closeSync(fd);
      break;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
      let text: string;
      try {
        text = readFileSync(lock, 'utf8').trim();
      } catch {
        continue; // released meanwhile
      }
      const pid = Number(text);
      // An empty lock is one being written right now, unless it is old.
      const fresh = text === '' && Date.now() - (statSync(lock, { throwIfNoEntry: false })?.mtimeMs ?? 0) < 5000;
      if (!fresh && !alive(pid)) {
        try {
          unlinkSync(lock);
        } catch {
          /* taken by another waiter */
        }
        continue;
      }
      if (done()) return;
      if (!told) log(`hub: waiting for process ${pid}, which is downloading ${lock.slice(0, -'.lock'.length)}`);
      told = true;
      await new Promise((r) => setTimeout(r, 250)); // polling another process's lock: real time
    }
  }
  try {
    if (!done()) await fn();
  } finally {
    try {
      unlinkSync(lock);
    } catch {
      /* already gone */
    }
  }
}

function alive(pid: number): boolean {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  if (pid === process.pid) return true;
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
}
