/**
 * Downloads from the Hugging Face hub for `hf:` references (lib/hub/ref.ts), with the maintained
 * client `@huggingface/hub` (repository info, file listing, file download), into the hub's own cache
 * layout, shared with Python's huggingface_hub:
 *
 *   $HF_HUB_CACHE (or $HF_HOME/hub, or ~/.cache/huggingface/hub)/
 *     models--OWNER--NAME/ (datasets--OWNER--NAME/)
 *       refs/main                      the commit `main` resolved to
 *       blobs/<sha256 or git oid>      file contents (.incomplete while downloading, .lock while owned)
 *       snapshots/<commit>/<path>      symlinks to the blobs: a model folder / the data files
 *       .slm-train/<key>.json          which snapshot files a reference selected (for offline re-runs)
 *
 * - A file is written to `<blob>.incomplete` and renamed into place only once its size and hash
 *   (sha256 of LFS files, the git blob id of others) match the listing, so a partial download is
 *   never taken for a file. A dropped connection resumes with a Range request, within the run (a few
 *   attempts with backoff) and in the next run.
 * - Once a reference has been fully downloaded, using it again makes no request at all (its
 *   selection and commit are remembered); pin a commit with `@REVISION`, or delete the repository's
 *   cache folder, to pick up a newer `main`.
 * - HF_ENDPOINT sets the hub (as for huggingface_hub), HF_TOKEN authenticates, HF_HUB_OFFLINE=1
 *   never touches the network, HF_HUB_ETAG_TIMEOUT (10 s) bounds waiting for an answer and
 *   HF_HUB_DOWNLOAD_TIMEOUT (10 s) waiting for the next bytes of a file.
 */
import { createHash } from 'node:crypto';
import { createReadStream, createWriteStream, existsSync, mkdirSync, openSync, closeSync, readFileSync, renameSync, statSync, symlinkSync, copyFileSync, unlinkSync, writeFileSync, writeSync, lstatSync } from 'node:fs';
import { homedir } from 'node:os';
import { dirname, join, relative } from 'node:path';
import { Readable } from 'node:stream';
import { datasetInfo, downloadFile, listFiles, modelInfo, type ListFileEntry } from '@huggingface/hub';
import { isSlmError, SlmError } from '../errors.js';
import { INDEX_FILE, indexShards, isHubRef, parseHubRef, selectDataFiles, selectModelFiles, type HubRef, type RepoKind } from './ref.js';
import { retryClock } from '../util/http-retry.js';

export interface HubOptions {
  /** The hub's address (default: $HF_ENDPOINT, else https://huggingface.co). */
  endpoint?: string;
  /** Access token (default: $HF_TOKEN). */
  token?: string;
  /** The cache folder (default: $HF_HUB_CACHE, $HF_HOME/hub, $XDG_CACHE_HOME/huggingface/hub or ~/.cache/huggingface/hub). */
  cacheDir?: string;
  /** Never make a request (default: $HF_HUB_OFFLINE is 1/true/yes). */
  offline?: boolean;
  /** Seconds to wait for a response's headers (default: $HF_HUB_ETAG_TIMEOUT, else 10). */
  timeoutS?: number;
  /** Seconds without a byte before a download is abandoned and retried (default: $HF_HUB_DOWNLOAD_TIMEOUT, else 10). */
  stallS?: number;
  /** Tries per file before giving up (the partial file is kept for the next run). Default 5. */
  attempts?: number;
  /** Progress lines (default: stderr). */
  log?: (line: string) => void;
}

interface Settings {
  endpoint: string;
  token?: string;
  cacheDir: string;
  offline: boolean;
  timeoutMs: number;
  stallMs: number;
  attempts: number;
  log: (line: string) => void;
}

const envNumber = (name: string, dflt: number) => {
  const v = Number(process.env[name]);
  return Number.isFinite(v) && v > 0 ? v : dflt;
};

function hubCacheDir(): string {
  const env = process.env;
  if (env.HF_HUB_CACHE) return env.HF_HUB_CACHE;
  if (env.HF_HOME) return join(env.HF_HOME, 'hub');
  return join(env.XDG_CACHE_HOME || join(homedir(), '.cache'), 'huggingface', 'hub');
}

function settings(o: HubOptions): Settings {
  const token = o.token ?? (process.env.HF_TOKEN || undefined);
  if (token !== undefined && !token.startsWith('hf_'))
    throw new SlmError('HUB_AUTH_REQUIRED', `HF_TOKEN does not look like a Hugging Face access token (expected "hf_..." , found a value starting ${JSON.stringify(token.slice(0, 3))}). Create one at https://huggingface.co/settings/tokens, or unset HF_TOKEN for public repositories.`);
  return {
    endpoint: (o.endpoint ?? (process.env.HF_ENDPOINT || 'https://huggingface.co')).replace(/\/+$/, ''),
    token,
    cacheDir: o.cacheDir ?? hubCacheDir(),
    offline: o.offline ?? /^(1|true|yes|on)$/i.test(process.env.HF_HUB_OFFLINE ?? ''),
    timeoutMs: 1000 * (o.timeoutS ?? envNumber('HF_HUB_ETAG_TIMEOUT', 10)),
    stallMs: 1000 * (o.stallS ?? envNumber('HF_HUB_DOWNLOAD_TIMEOUT', 10)),
    attempts: Math.max(1, o.attempts ?? 5),
    log: o.log ?? ((s) => process.stderr.write(`[slm-train] ${s}\n`)),
  };
}

// ---------------------------------------------------------------------------------------------
// Public entry points

/** A model folder: the path itself, or for `hf:OWNER/NAME` the downloaded snapshot folder. */
export async function localModelDir(pathOrRef: string, o: HubOptions = {}): Promise<string> {
  if (!isHubRef(pathOrRef)) return pathOrRef;
  const ref = parseHubRef(pathOrRef);
  const { root } = await fetchInCache(ref, 'model', settings(o));
  return ref.path ? join(root, ref.path) : root;
}

/** The local files of a data source: `[path]`, or for `hf:OWNER/NAME[:split]` its downloaded data files. */
export async function localDataFiles(pathOrRef: string, o: HubOptions = {}): Promise<string[]> {
  if (!isHubRef(pathOrRef)) return [pathOrRef];
  const { root, files } = await fetchInCache(parseHubRef(pathOrRef), 'dataset', settings(o));
  return files.map((f) => join(root, f));
}

/** fetchSnapshot, with the cache's file-system failures (no permission, no space, ...) said as such. */
async function fetchInCache(ref: HubRef, kind: RepoKind, s: Settings): Promise<{ root: string; files: string[] }> {
  try {
    return await fetchSnapshot(ref, kind, s);
  } catch (e) {
    throw hubCacheError(e, s.cacheDir, ref.text) ?? e;
  }
}

const NO_PERMISSION = 'Make it writable by this user, or point HF_HUB_CACHE (or HF_HOME) at a folder you can write.';
const CACHE_ERRNO: Record<string, string> = {
  EACCES: NO_PERMISSION,
  EPERM: NO_PERMISSION,
  EROFS: 'It is on a read-only file system; point HF_HUB_CACHE (or HF_HOME) at a writable folder.',
  ENOSPC: 'The disk is full: free space there, or point HF_HUB_CACHE (or HF_HOME) at a disk with room; the partial file is kept and the next run resumes it.',
  EDQUOT: 'The disk quota is used up: free space, or point HF_HUB_CACHE (or HF_HOME) at another disk; the partial file is kept and the next run resumes it.',
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
  return new SlmError('HUB_CACHE_UNWRITABLE', `${what}: the Hugging Face cache at ${cacheDir} could not be written (${err.code}${op ? ` on ${op}` : ''}). ${hint}`, { cacheDir, errno: err.code });
}

/** `hf:OWNER/NAME` -> "OWNER/NAME" (a display name), anything else -> undefined. */
export function hubRepoName(s: string): string | undefined {
  return isHubRef(s) ? parseHubRef(s).repo : undefined;
}

// ---------------------------------------------------------------------------------------------
// Snapshots

const COMMIT = /^[0-9a-f]{40}$/;

function storageDir(s: Settings, kind: RepoKind, repo: string): string {
  return join(s.cacheDir, `${kind}s--${repo.split('/').join('--')}`);
}

function manifestPath(storage: string, kind: RepoKind, ref: HubRef): string {
  const key = createHash('sha256').update(JSON.stringify([kind, ref.revision, ref.path, ref.split ?? null])).digest('hex').slice(0, 16);
  return join(storage, '.slm-train', `${key}.json`);
}

/** The snapshot of a completed earlier download of the same reference, when every file is still there. */
function cachedSnapshot(storage: string, kind: RepoKind, ref: HubRef): { root: string; files: string[] } | undefined {
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

async function fetchSnapshot(ref: HubRef, kind: RepoKind, s: Settings): Promise<{ root: string; files: string[] }> {
  const storage = storageDir(s, kind, ref.repo);
  const cached = cachedSnapshot(storage, kind, ref);
  if (cached) return cached;
  if (s.offline)
    throw new SlmError('HUB_UNREACHABLE', `${ref.text} is not in the cache (${storage}) and HF_HUB_OFFLINE is set, so it cannot be downloaded. Unset HF_HUB_OFFLINE, or download it once on a machine with access to ${s.endpoint}.`);
  const client = new Client(ref, kind, s);
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

function writeAtomic(file: string, text: string): void {
  mkdirSync(dirname(file), { recursive: true });
  const tmp = `${file}.tmp-${process.pid}`;
  writeFileSync(tmp, text);
  renameSync(tmp, file);
}

// ---------------------------------------------------------------------------------------------
// Requests

const sleep = (ms: number) => retryClock.sleep(ms);

class RangeIgnored extends Error {}

/** Network failures, timeouts, 429 and 5xx are worth another try; 4xx answers are not. */
function retryable(e: unknown): boolean {
  const status = (e as { statusCode?: number }).statusCode;
  if (typeof status === 'number') return status === 429 || status >= 500;
  return !(e instanceof SlmError);
}

function cause(e: unknown): string {
  const err = e as Error & { cause?: { code?: string; message?: string } };
  const c = err?.cause;
  if (c?.code) return `${c.code}${c.message && !c.message.includes(c.code) ? ` ${c.message}` : ''}`;
  return c?.message ? `${err.message}: ${c.message}` : String(err?.message ?? e);
}

class Client {
  private readonly name: { type: RepoKind; name: string };
  private readonly creds: { hubUrl: string; accessToken?: string; fetch: typeof fetch };

  constructor(
    private readonly ref: HubRef,
    private readonly kind: RepoKind,
    private readonly s: Settings,
  ) {
    this.name = { type: kind, name: ref.repo };
    this.creds = { hubUrl: s.endpoint, ...(s.token ? { accessToken: s.token } : {}), fetch: this.guardedFetch() };
  }

  /** fetch with a deadline for the response headers; a Range request answered with the whole file is refused. */
  private guardedFetch(body?: AbortSignal): typeof fetch {
    const ms = this.s.timeoutMs;
    return (async (url: string | URL | Request, init: RequestInit = {}) => {
      const deadline = new AbortController();
      const timer = setTimeout(() => deadline.abort(new Error(`no answer within ${ms / 1000} s`)), ms);
      try {
        const signals = [deadline.signal, ...(body ? [body] : []), ...(init.signal ? [init.signal] : [])];
        const r = await fetch(url, { ...init, signal: AbortSignal.any(signals) });
        const range = new Headers(init.headers).get('range');
        if (range && !/^bytes=0-/.test(range) && r.status === 200) {
          await r.body?.cancel();
          throw new RangeIgnored('the server sent the whole file instead of the requested range');
        }
        return r;
      } catch (e) {
        if (deadline.signal.aborted) throw deadline.signal.reason;
        throw e;
      } finally {
        clearTimeout(timer);
      }
    }) as typeof fetch;
  }

  private where(): string {
    return `${this.s.endpoint}/${this.kind === 'dataset' ? 'datasets/' : ''}${this.ref.repo}`;
  }

  /** An SlmError for a failed request: what was asked, what came back, what to do. */
  private fail(e: unknown, what: string): SlmError {
    if (e instanceof SlmError) return e;
    const status = (e as { statusCode?: number }).statusCode;
    const url = (e as { url?: string }).url ?? this.where();
    const kindName = this.kind === 'dataset' ? 'dataset' : 'model';
    if (status === 404)
      return new SlmError(
        'HUB_NOT_FOUND',
        `${this.ref.text}: ${what}: the hub answered 404 Not Found for ${url}. Check the ${kindName} repository name${this.ref.revision !== 'main' ? ` and the revision "${this.ref.revision}"` : ''} (hf:OWNER/NAME, as in the address https://huggingface.co/${this.kind === 'dataset' ? 'datasets/' : ''}OWNER/NAME)${this.kind === 'dataset' ? '' : '; a dataset belongs in --corpus/--questions, not --model'}.`,
        { url, status },
      );
    if (status === 401 || status === 403)
      return new SlmError(
        'HUB_AUTH_REQUIRED',
        `${this.ref.text}: ${what}: the hub answered ${status} for ${url}: the repository does not exist, is private, or is gated. ${this.s.token ? 'The token in HF_TOKEN has no access: request access on the repository page, or use a token that has it.' : 'Set HF_TOKEN to an access token with read access (https://huggingface.co/settings/tokens), after accepting the repository\'s terms if it is gated.'}`,
        { url, status },
      );
    if (typeof status === 'number')
      return new SlmError('HUB_DOWNLOAD_FAILED', `${this.ref.text}: ${what}: the hub answered ${status} for ${url} (${(e as Error).message}). Try again later.`, { url, status });
    return new SlmError(
      'HUB_UNREACHABLE',
      `${this.ref.text}: ${what}: could not reach the hub at ${this.s.endpoint} (${cause(e)}). Check the network and HF_ENDPOINT${process.env.HF_ENDPOINT ? ` (set to ${process.env.HF_ENDPOINT})` : ''}; files downloaded before are used without the network (HF_HUB_OFFLINE=1).`,
      { url: this.where() },
    );
  }

  /** Retries `fn` on network errors, 429 and 5xx; `what` names the request in the error. */
  private async retrying<T>(what: string, fn: () => Promise<T>): Promise<T> {
    for (let attempt = 1; ; attempt++) {
      try {
        return await fn();
      } catch (e) {
        if (attempt >= this.s.attempts || !retryable(e)) throw this.fail(e, what);
        await sleep(Math.min(5000, 250 * 2 ** (attempt - 1)));
      }
    }
  }

  /** The commit the reference's revision points to. */
  async commit(): Promise<string> {
    const what = `looking up revision "${this.ref.revision}"`;
    const params = { name: this.ref.repo, revision: this.ref.revision, additionalFields: ['sha'] as never[], ...this.creds };
    const info = (await this.retrying(what, () => (this.kind === 'dataset' ? datasetInfo(params) : modelInfo(params)))) as { sha?: unknown };
    if (typeof info.sha !== 'string' || !COMMIT.test(info.sha))
      throw new SlmError('HUB_DOWNLOAD_FAILED', `${this.ref.text}: ${what}: the hub at ${this.s.endpoint} answered without a commit id (sha); is HF_ENDPOINT a Hugging Face hub?`);
    return info.sha;
  }

  async list(sha: string): Promise<ListFileEntry[]> {
    return this.retrying('listing the repository files', async () => {
      const out: ListFileEntry[] = [];
      for await (const f of listFiles({ repo: this.name, revision: sha, recursive: true, ...this.creds })) if (f.type === 'file') out.push(f);
      return out;
    });
  }

  /** The snapshot path of one file, downloading its blob if the cache lacks it. */
  async ensure(storage: string, sha: string, f: ListFileEntry): Promise<string> {
    const pointer = join(storage, 'snapshots', sha, f.path);
    if (existsSync(pointer)) return pointer;
    const etag = f.lfs?.oid ?? f.oid;
    if (!etag || !/^[0-9a-f]{40,64}$/.test(etag))
      throw new SlmError('HUB_DOWNLOAD_FAILED', `${this.ref.text}: the listing of ${f.path} carries no content hash (oid), so the download could not be checked.`);
    const blob = join(storage, 'blobs', etag);
    if (!existsSync(blob)) await withLock(`${blob}.lock`, () => existsSync(blob), this.s.log, () => this.download(f, sha, blob, etag));
    mkdirSync(dirname(pointer), { recursive: true });
    if (lstatSync(pointer, { throwIfNoEntry: false })) unlinkSync(pointer); // a dangling link
    try {
      symlinkSync(relative(dirname(pointer), blob), pointer);
    } catch {
      copyFileSync(blob, pointer);
    }
    return pointer;
  }

  private async download(f: ListFileEntry, sha: string, blob: string, etag: string): Promise<void> {
    const part = `${blob}.incomplete`;
    const size = f.lfs?.size ?? f.size;
    const what = `downloading ${f.path}`;
    let lastError: unknown;
    for (let attempt = 1; attempt <= this.s.attempts; attempt++) {
      const have = statSync(part, { throwIfNoEntry: false })?.size ?? 0;
      if (have > size) unlinkSync(part);
      const offset = have > size ? 0 : have;
      if (attempt === 1) this.s.log(`hub: ${this.ref.text}: ${f.path} (${bytes(size)}${offset ? `, resuming at ${bytes(offset)}` : ''}) from ${this.s.endpoint}`);
      else this.s.log(`hub: ${f.path}: try ${attempt} of ${this.s.attempts} at ${bytes(offset)} (${cause(lastError)})`);
      try {
        if (offset < size) await this.fetchInto(f, sha, part, offset);
        const got = statSync(part, { throwIfNoEntry: false })?.size ?? 0;
        if (got !== size) throw new Error(`received ${got} of ${size} bytes`);
        const hash = await fileHash(part, etag.length === 64 ? 'sha256' : 'git', size);
        if (hash !== etag) {
          unlinkSync(part);
          throw new SlmError('HUB_DOWNLOAD_FAILED', `${this.ref.text}: ${f.path} arrived with hash ${hash}, not the ${etag} the hub lists; the file was discarded. Try again; if it persists, the endpoint (${this.s.endpoint}) serves altered files.`);
        }
        renameSync(part, blob);
        return;
      } catch (e) {
        if (e instanceof RangeIgnored && existsSync(part)) unlinkSync(part);
        if (!retryable(e)) throw this.fail(e, what);
        lastError = e;
        if (attempt < this.s.attempts) await sleep(Math.min(5000, 250 * 2 ** (attempt - 1)));
      }
    }
    const kept = statSync(part, { throwIfNoEntry: false })?.size ?? 0;
    throw new SlmError(
      'HUB_DOWNLOAD_FAILED',
      `${this.ref.text}: ${what} from ${this.s.endpoint} failed ${this.s.attempts} times (last: ${cause(lastError)}). ${kept ? `The ${bytes(kept)} received are kept in ${part}; running again resumes from there.` : 'Run again to retry.'}`,
      { url: this.where(), file: f.path },
    );
  }

  /** Streams the file from `offset` onto the end of `part`, abandoning it when no byte comes for stallMs. */
  private async fetchInto(f: ListFileEntry, sha: string, part: string, offset: number): Promise<void> {
    const stall = new AbortController();
    const blob = await downloadFile({ repo: this.name, path: f.path, revision: sha, ...this.creds, fetch: this.guardedFetch(stall.signal), xet: false });
    if (!blob) throw new SlmError('HUB_NOT_FOUND', `${this.ref.text}: ${f.path} is listed in ${this.ref.repo}@${sha} but the hub has no such file (404).`);
    mkdirSync(dirname(part), { recursive: true });
    const out = createWriteStream(part, { flags: 'a' });
    let timer: NodeJS.Timeout | undefined;
    const arm = () => {
      clearTimeout(timer);
      timer = setTimeout(() => stall.abort(new Error(`no data for ${this.s.stallMs / 1000} s`)), this.s.stallMs);
    };
    try {
      arm();
      for await (const chunk of Readable.fromWeb((offset ? blob.slice(offset) : blob).stream() as never)) {
        arm();
        if (!out.write(chunk)) await new Promise<void>((r) => out.once('drain', () => r()));
      }
      if (stall.signal.aborted) throw stall.signal.reason;
    } catch (e) {
      // WebBlob.stream() aborts with a message string; give back the real reason when we know it.
      throw stall.signal.aborted ? stall.signal.reason : typeof e === 'string' ? new Error(e) : e;
    } finally {
      clearTimeout(timer);
      await new Promise<void>((r) => out.end(() => r()));
    }
  }
}

/** sha256 (LFS files) or the git blob id (sha1 of "blob <size>\0" + contents) of a file. */
function fileHash(file: string, kind: 'sha256' | 'git', size: number): Promise<string> {
  const h = createHash(kind === 'sha256' ? 'sha256' : 'sha1');
  if (kind === 'git') h.update(`blob ${size}\0`);
  return new Promise((resolve, reject) => {
    createReadStream(file)
      .on('data', (c) => h.update(c))
      .on('error', reject)
      .on('end', () => resolve(h.digest('hex')));
  });
}

function bytes(n: number): string {
  if (n < 1024) return `${n} B`;
  const units = ['KiB', 'MiB', 'GiB', 'TiB'];
  let v = n;
  let i = -1;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v.toFixed(1)} ${units[i]}`;
}

/**
 * Runs `fn` holding `lock` (a file with our pid), so that two processes (e.g. the ranks of a
 * distributed run) never write the same blob; a lock whose process is gone is taken over; returns
 * early when `done()` becomes true while waiting.
 */
async function withLock(lock: string, done: () => boolean, log: (s: string) => void, fn: () => Promise<void>): Promise<void> {
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
