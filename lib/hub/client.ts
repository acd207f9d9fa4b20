/**
 * Requests to the hub through `@huggingface/hub` (repository info, file listing, file download):
 * retries with backoff on network errors, 429 and 5xx, deadlines for the headers and for each next
 * byte, errors that say what to do. A file is written to `<blob>.incomplete` and renamed into place
 * only once its size and hash (sha256 of LFS files, the git blob id of others) match the listing,
 * so a partial download is never taken for a file; a dropped connection resumes with a Range
 * request, within the run (a few attempts with backoff) and in the next run.
 */
import { createHash } from 'node:crypto';
import {
  createReadStream,
  createWriteStream,
  existsSync,
  mkdirSync,
  renameSync,
  statSync,
  symlinkSync,
  copyFileSync,
  unlinkSync,
  lstatSync,
} from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { Readable } from 'node:stream';
import { datasetInfo, downloadFile, listFiles, modelInfo, type ListFileEntry } from '@huggingface/hub';
import { SlmError } from '../errors.js';
import { withLock } from './cache.js';
import type { HubRef, RepoKind } from './ref.js';
import type { Settings } from './settings.js';
import { retryClock } from '../util/http-retry.js';

/** A full commit id: a revision that needs no lookup. */
export const COMMIT = /^[0-9a-f]{40}$/;

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

/** One repository on the hub, at the endpoint and with the token of the settings. */
export class Client {
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
        `${this.ref.text}: ${what}: the hub answered ${status} for ${url}: the repository does not exist, is private, or is gated. ${this.s.token ? 'The token in HF_TOKEN has no access: request access on the repository page, or use a token that has it.' : "Set HF_TOKEN to an access token with read access (https://huggingface.co/settings/tokens), after accepting the repository's terms if it is gated."}`,
        { url, status },
      );
    if (typeof status === 'number')
      return new SlmError(
        'HUB_DOWNLOAD_FAILED',
        `${this.ref.text}: ${what}: the hub answered ${status} for ${url} (${(e as Error).message}). Try again later.`,
        { url, status },
      );
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
    const info = (await this.retrying(what, () => (this.kind === 'dataset' ? datasetInfo(params) : modelInfo(params)))) as {
      sha?: unknown;
    };
    if (typeof info.sha !== 'string' || !COMMIT.test(info.sha))
      throw new SlmError(
        'HUB_DOWNLOAD_FAILED',
        `${this.ref.text}: ${what}: the hub at ${this.s.endpoint} answered without a commit id (sha); is HF_ENDPOINT a Hugging Face hub?`,
      );
    return info.sha;
  }

  async list(sha: string): Promise<ListFileEntry[]> {
    return this.retrying('listing the repository files', async () => {
      const out: ListFileEntry[] = [];
      for await (const f of listFiles({ repo: this.name, revision: sha, recursive: true, ...this.creds }))
        if (f.type === 'file') out.push(f);
      return out;
    });
  }

  /** The snapshot path of one file, downloading its blob if the cache lacks it. */
  async ensure(storage: string, sha: string, entry: ListFileEntry): Promise<string> {
    const pointer = join(storage, 'snapshots', sha, entry.path);
    if (existsSync(pointer)) return pointer;
    const etag = entry.lfs?.oid ?? entry.oid;
    if (!etag || !/^[0-9a-f]{40,64}$/.test(etag))
      throw new SlmError(
        'HUB_DOWNLOAD_FAILED',
        `${this.ref.text}: the listing of ${entry.path} carries no content hash (oid), so the download could not be checked.`,
      );
    const blob = join(storage, 'blobs', etag);
    if (!existsSync(blob))
      await withLock(
        `${blob}.lock`,
        () => existsSync(blob),
        this.s.log,
        () => this.download(entry, sha, blob, etag),
      );
    mkdirSync(dirname(pointer), { recursive: true });
    if (lstatSync(pointer, { throwIfNoEntry: false })) unlinkSync(pointer); // a dangling link
    try {
      symlinkSync(relative(dirname(pointer), blob), pointer);
    } catch {
      copyFileSync(blob, pointer);
    }
    return pointer;
  }

  private async download(entry: ListFileEntry, sha: string, blob: string, etag: string): Promise<void> {
    const part = `${blob}.incomplete`;
    const size = entry.lfs?.size ?? entry.size;
    const what = `downloading ${entry.path}`;
    let lastError: unknown;
    for (let attempt = 1; attempt <= this.s.attempts; attempt++) {
      const have = statSync(part, { throwIfNoEntry: false })?.size ?? 0;
      if (have > size) unlinkSync(part);
      const offset = have > size ? 0 : have;
      if (attempt === 1)
        this.s.log(
          `hub: ${this.ref.text}: ${entry.path} (${bytes(size)}${offset ? `, resuming at ${bytes(offset)}` : ''}) from ${this.s.endpoint}`,
        );
      else this.s.log(`hub: ${entry.path}: try ${attempt} of ${this.s.attempts} at ${bytes(offset)} (${cause(lastError)})`);
      try {
        if (offset < size) await this.fetchInto(entry, sha, part, offset);
        const got = statSync(part, { throwIfNoEntry: false })?.size ?? 0;
        if (got !== size) throw new Error(`received ${got} of ${size} bytes`);
        const hash = await fileHash(part, etag.length === 64 ? 'sha256' : 'git', size);
        if (hash !== etag) {
          unlinkSync(part);
          throw new SlmError(
            'HUB_DOWNLOAD_FAILED',
            `${this.ref.text}: ${entry.path} arrived with hash ${hash}, not the ${etag} the hub lists; the file was discarded. Try again; if it persists, the endpoint (${this.s.endpoint}) serves altered files.`,
          );
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
      { url: this.where(), file: entry.path },
    );
  }

  /** Streams the file from `offset` onto the end of `part`, abandoning it when no byte comes for stallMs. */
  private async fetchInto(entry: ListFileEntry, sha: string, part: string, offset: number): Promise<void> {
    const stall = new AbortController();
    const blob = await downloadFile({
      repo: this.name,
      path: entry.path,
      revision: sha,
      ...this.creds,
      fetch: this.guardedFetch(stall.signal),
      xet: false,
    });
    if (!blob)
      throw new SlmError(
        'HUB_NOT_FOUND',
        `${this.ref.text}: ${entry.path} is listed in ${this.ref.repo}@${sha} but the hub has no such file (404).`,
      );
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
