/**
 * A stand-in Hugging Face hub on loopback for the hub tests: real files served in the hub's URL
 * layout, for the endpoints @huggingface/hub calls —
 *   GET /api/{models,datasets}/OWNER/NAME/revision/REV   {id, sha, ...}
 *   GET /api/{models,datasets}/OWNER/NAME/tree/REV?recursive=true   [{type, path, size, oid, lfs?}]
 *   GET /[datasets/]OWNER/NAME/resolve/REV/PATH   the file (Range -> 206 + Content-Range; ETag,
 *       X-Repo-Commit, Content-Length, Accept-Ranges), 404 + X-Error-Code otherwise
 * — with a log of every request, and faults to inject: drop the connection halfway through a file,
 * serve altered bytes (same length, one byte changed), and gated repositories (401 without a token,
 * 403 with a token that has no access).
 * Uploads, for the endpoints @huggingface/hub's createRepo and commit call (with `writeToken` set,
 * each needs `Authorization: Bearer <writeToken>`, else 401 / 403):
 *   POST /api/repos/create {name, organization, type}   a new empty repository (409 if it exists)
 *   POST /api/models/OWNER/NAME/preupload/REV   {files: [{path, uploadMode: lfs | regular}]}
 *   POST /OWNER/NAME.git/info/lfs/objects/batch   basic transfer: an upload href per object
 *   PUT  /lfs-upload/OID?sig=S   the LFS object (its sha256 must be OID), at the "presigned" href the batch gave
 *   POST /api/models/OWNER/NAME/commit/REV   NDJSON header + file (base64) / lfsFile (oid) lines:
 *        the files replace the repository's, under a new commit id; the commit is logged in `commits`
 */
import { createHash } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface HubRepo {
  kind: 'model' | 'dataset';
  name: string;
  files: Record<string, Buffer>;
}

export interface Served {
  method: string;
  url: string;
  range?: string;
  auth?: string;
}

export class FakeHub {
  readonly requests: Served[] = [];
  /** Paths (repo file paths) whose next full-body GETs send half the bytes and then drop the connection; the count is how many times. */
  readonly dropNext = new Map<string, number>();
  /** Paths whose full-body GETs send altered bytes: the listing's hash no longer matches. */
  readonly alter = new Set<string>();
  /** Gated repositories ("kind:OWNER/NAME") and the one token that has access to them. */
  readonly gated = new Map<string, string>();
  /** When set, the token that uploads need. */
  writeToken?: string;
  /** Every commit made through the upload endpoints. */
  readonly commits: Array<{ repo: string; title: string; files: string[] }> = [];
  /** Every repository created through repos/create, with the visibility asked for (undefined: the hub's default). */
  readonly created: Array<{ name: string; visibility?: string }> = [];
  private lfs = new Map<string, Buffer>();
  private server?: Server;
  private repos = new Map<string, { repo: HubRepo; sha: string }>();
  url = '';

  add(repo: HubRepo): string {
    const sha = createHash('sha1')
      .update(repo.kind + repo.name + Object.keys(repo.files).join())
      .digest('hex');
    this.repos.set(`${repo.kind}:${repo.name}`, { repo, sha });
    return sha;
  }

  /** The files of a repository as the hub holds them now (undefined: no such repository). */
  files(kind: 'model' | 'dataset', name: string): Record<string, Buffer> | undefined {
    return this.repos.get(`${kind}:${name}`)?.repo.files;
  }

  /** Requests whose URL is a file download (resolve/) of `path`. */
  downloads(path: string): Served[] {
    return this.requests.filter((r) => r.url.includes('/resolve/') && r.url.split('?')[0].endsWith('/' + path));
  }

  async start(): Promise<string> {
    this.server = createServer((req, res) => this.handle(req, res));
    await new Promise<void>((r) => this.server!.listen(0, '127.0.0.1', () => r()));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
    return this.url;
  }

  async stop(): Promise<void> {
    this.server?.closeAllConnections();
    await new Promise<void>((r) => this.server?.close(() => r()) ?? r());
  }

  private notFound(res: ServerResponse, code: string, message: string) {
    res.writeHead(404, { 'content-type': 'application/json', 'x-error-code': code });
    res.end(JSON.stringify({ error: message }));
  }

  private signature(oid: string): string {
    return createHash('sha256').update(`presigned:${oid}`).digest('hex').slice(0, 16);
  }

  private json(res: ServerResponse, status: number, body: unknown) {
    res.writeHead(status, { 'content-type': 'application/json' });
    res.end(JSON.stringify(body));
  }

  private upload(req: IncomingMessage, res: ServerResponse, path: string, body: Buffer) {
    // The LFS upload href stands for the hub's presigned storage URL: its signature, not a token, admits it.
    const presigned =
      path.startsWith('/lfs-upload/') &&
      new URL(req.url ?? '/', 'http://x').searchParams.get('sig') === this.signature(path.slice('/lfs-upload/'.length));
    if (!presigned && this.writeToken !== undefined && req.headers.authorization !== `Bearer ${this.writeToken}`)
      return this.json(res, req.headers.authorization ? 403 : 401, {
        error: req.headers.authorization
          ? 'You do not have write access to this repository.'
          : 'Invalid credentials in Authorization header',
      });
    if (path === '/api/repos/create') {
      const b = JSON.parse(body.toString('utf8')) as { name: string; organization?: string; type?: string; visibility?: string };
      const name = `${b.organization}/${b.name}`;
      const kind = b.type === 'dataset' ? 'dataset' : 'model';
      if (this.repos.has(`${kind}:${name}`))
        return this.json(res, 409, { error: 'You already created this model repo', url: `${this.url}/${name}` });
      this.add({ kind, name, files: {} });
      this.created.push({ name, ...(b.visibility ? { visibility: b.visibility } : {}) });
      return this.json(res, 200, { url: `${this.url}/${name}`, name });
    }
    let m = /^\/api\/(models|datasets)\/([^/]+\/[^/]+)\/(preupload|commit)\/([^/]+)$/.exec(path);
    if (m) {
      const key = `${m[1].slice(0, -1)}:${m[2]}`;
      const entry = this.repos.get(key);
      if (!entry) return this.notFound(res, 'RepoNotFound', 'Repository not found');
      if (m[4] !== 'main') return this.notFound(res, 'RevisionNotFound', `Invalid rev id: ${m[4]}`);
      if (m[3] === 'preupload') {
        const b = JSON.parse(body.toString('utf8')) as { files: Array<{ path: string; size: number }> };
        return this.json(res, 200, {
          files: b.files.map((f) => ({
            path: f.path,
            uploadMode: /\.(safetensors|parquet|bin)$/.test(f.path) || f.size > 10 << 20 ? 'lfs' : 'regular',
            shouldIgnore: false,
          })),
        });
      }
      const lines = body
        .toString('utf8')
        .split('\n')
        .filter((l) => l.trim())
        .map((l) => JSON.parse(l) as { key: string; value: Record<string, unknown> });
      const files = { ...entry.repo.files };
      let title = '';
      for (const { key: k, value: v } of lines) {
        if (k === 'header') title = String(v.summary ?? '');
        else if (k === 'file') files[String(v.path)] = Buffer.from(String(v.content), v.encoding === 'base64' ? 'base64' : 'utf8');
        else if (k === 'lfsFile') {
          const blob = this.lfs.get(String(v.oid));
          if (!blob) return this.json(res, 422, { error: `LFS object ${v.oid} of ${v.path} was never uploaded` });
          files[String(v.path)] = blob;
        } else if (k === 'deletedFile') delete files[String(v.path)];
        else return this.json(res, 400, { error: `unknown commit line ${k}` });
      }
      const sha = createHash('sha1')
        .update(JSON.stringify(Object.entries(files).map(([p, b]) => [p, createHash('sha1').update(b).digest('hex')])))
        .update(String(this.commits.length))
        .digest('hex');
      entry.repo.files = files;
      entry.sha = sha;
      this.commits.push({
        repo: m[2],
        title,
        files: lines.filter((l) => l.key === 'file' || l.key === 'lfsFile').map((l) => String(l.value.path)),
      });
      return this.json(res, 200, { success: true, commitOid: sha, commitUrl: `${this.url}/${m[2]}/commit/${sha}` });
    }
    m = /^\/(datasets\/)?([^/]+\/[^/]+)\.git\/info\/lfs\/objects\/batch$/.exec(path);
    if (m) {
      const b = JSON.parse(body.toString('utf8')) as { operation: string; objects: Array<{ oid: string; size: number }> };
      return this.json(res, 200, {
        transfer: 'basic',
        objects: b.objects.map((o) => ({
          oid: o.oid,
          size: o.size,
          ...(this.lfs.has(o.oid) ? {} : { actions: { upload: { href: `${this.url}/lfs-upload/${o.oid}?sig=${this.signature(o.oid)}` } } }),
        })),
      });
    }
    m = /^\/lfs-upload\/([0-9a-f]{64})$/.exec(path);
    if (m && req.method === 'PUT') {
      const got = createHash('sha256').update(body).digest('hex');
      if (got !== m[1]) return this.json(res, 400, { error: `sha256 ${got} does not match ${m[1]}` });
      this.lfs.set(m[1], body);
      return this.json(res, 200, {});
    }
    return this.notFound(res, 'RepoNotFound', 'Repository not found');
  }

  private handle(req: IncomingMessage, res: ServerResponse) {
    const url = req.url ?? '/';
    this.requests.push({
      method: req.method ?? 'GET',
      url,
      ...(req.headers.range ? { range: req.headers.range } : {}),
      ...(req.headers.authorization ? { auth: req.headers.authorization } : {}),
    });
    const path = decodeURIComponent(url.split('?')[0]);
    if (req.method === 'POST' || req.method === 'PUT') {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        try {
          this.upload(req, res, path, Buffer.concat(chunks));
        } catch (e) {
          res.writeHead(400, { 'content-type': 'application/json' });
          res.end(JSON.stringify({ error: String((e as Error).message ?? e) }));
        }
      });
      return;
    }
    // Gated repositories: as the hub, 401 without a token and 403 with one that has no access.
    const gate = /^\/(?:api\/)?(models\/|datasets\/)?([^/]+\/[^/]+)\//.exec(path);
    if (gate) {
      const key = `${gate[1] === 'datasets/' ? 'dataset' : 'model'}:${gate[2]}`;
      const token = this.gated.get(key);
      if (token !== undefined && req.headers.authorization !== `Bearer ${token}`) {
        const status = req.headers.authorization ? 403 : 401;
        res.writeHead(status, { 'content-type': 'application/json', 'x-error-code': status === 401 ? 'GatedRepo' : 'AccessDenied' });
        return res.end(
          JSON.stringify({
            error:
              status === 401
                ? 'Access to this repository is restricted: you must be authenticated.'
                : 'Access to this repository is restricted: your token has no access.',
          }),
        );
      }
    }
    let m = /^\/api\/(models|datasets)\/([^/]+\/[^/]+)\/(revision|tree)\/([^/]+)(?:\/(.*))?$/.exec(path);
    if (m) {
      const entry = this.repos.get(`${m[1].slice(0, -1)}:${m[2]}`);
      if (!entry) return this.notFound(res, 'RepoNotFound', 'Repository not found');
      if (m[4] !== 'main' && m[4] !== entry.sha) return this.notFound(res, 'RevisionNotFound', `Invalid rev id: ${m[4]}`);
      res.setHeader('content-type', 'application/json');
      if (m[3] === 'revision')
        return res.end(
          JSON.stringify({
            _id: entry.sha.slice(0, 24),
            id: m[2],
            sha: entry.sha,
            private: false,
            downloads: 0,
            likes: 0,
            gated: false,
            lastModified: new Date(0).toISOString(),
          }),
        );
      const prefix = m[5] ? m[5] + '/' : '';
      const list = Object.entries(entry.repo.files)
        .filter(([p]) => p.startsWith(prefix))
        .map(([p, buf]) => {
          const oid = createHash('sha1').update(`blob ${buf.length}\0`).update(buf).digest('hex');
          // Weights and data files are LFS files on the hub: sha256 oid in `lfs`.
          const lfs = /\.(safetensors|parquet)$/.test(p)
            ? { oid: createHash('sha256').update(buf).digest('hex'), size: buf.length, pointerSize: 130 }
            : undefined;
          return { type: 'file', path: p, size: buf.length, oid, ...(lfs ? { lfs } : {}) };
        });
      return res.end(JSON.stringify(list));
    }
    m = /^\/(datasets\/)?([^/]+\/[^/]+)\/resolve\/([^/]+)\/(.+)$/.exec(path);
    if (!m) return this.notFound(res, 'RepoNotFound', 'Repository not found');
    const entry = this.repos.get(`${m[1] ? 'dataset' : 'model'}:${m[2]}`);
    if (!entry) return this.notFound(res, 'RepoNotFound', 'Repository not found');
    const file = entry.repo.files[m[4]];
    if (!file) return this.notFound(res, 'EntryNotFound', 'Entry not found');
    const headers = {
      etag: `"${createHash('sha256').update(file).digest('hex')}"`,
      'x-repo-commit': entry.sha,
      'accept-ranges': 'bytes',
      'content-type': 'application/octet-stream',
    };
    const range = /^bytes=(\d+)-(\d*)$/.exec(req.headers.range ?? '');
    if (range) {
      const start = Number(range[1]);
      const end = range[2] ? Math.min(Number(range[2]), file.length - 1) : file.length - 1;
      res.writeHead(206, {
        ...headers,
        'content-range': `bytes ${start}-${end}/${file.length}`,
        'content-length': String(end - start + 1),
      });
      return res.end(file.subarray(start, end + 1));
    }
    res.writeHead(200, { ...headers, 'content-length': String(file.length) });
    if (this.alter.has(m[4])) {
      const bad = Buffer.from(file);
      bad[bad.length >> 1] ^= 0xff;
      return res.end(bad);
    }
    const drops = this.dropNext.get(m[4]) ?? 0;
    if (drops > 0) {
      this.dropNext.set(m[4], drops - 1);
      res.write(file.subarray(0, file.length >> 1), () => setTimeout(() => res.socket?.destroy(), 20));
      return;
    }
    res.end(file);
  }
}
