// Datasets and models from the Hugging Face hub (issue 6, item 4): `hf:OWNER/NAME[:split]` for
// --questions/--corpus/data.*, `hf:OWNER/NAME` for --model/--adapter/model.path, downloaded with
// @huggingface/hub into the hub cache layout, once. Every request goes to a stand-in hub on loopback
// (test/helpers/hub-server.ts) that serves real files: a Search-R1-layout Parquet written here, a
// corpus JSONL, and the tiny checkpoints of ../shared/fixtures.
import { existsSync, lstatSync, readFileSync, readlinkSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { recordWaits } from './helpers/waits.js';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import t from 'tap';
import { hubCacheError, localDataFiles, localModelDir } from '../lib/hub/download.js';
import { SlmError } from '../lib/errors.js';
import { parseHubRef, pathHasSplit, selectDataFiles, selectModelFiles } from '../lib/hub/ref.js';
import { loadConfig, missingFiles } from '../lib/config/load.js';
import { Corpus } from '../lib/retrieval/corpus.js';
import { loadQuestions } from '../lib/train/data.js';
import { runCliAsync } from './helpers/cli.js';
import { FakeHub } from './helpers/hub-server.js';
import { freePort } from '../lib/distributed/launch.js';
import { fixture } from './helpers/shared.js';
import { writeParquet } from './helpers/parquet.js';

const tmp = t.testdir();
const QUESTIONS = {
  train: [
    { question: 'who wrote hamlet', golden_answers: ['Shakespeare', 'William Shakespeare'], data_source: 'nq' },
    { question: 'what is the capital of france', golden_answers: ['Paris'], data_source: 'hotpotqa' },
    { question: 'how many legs has a spider', golden_answers: ['8', 'eight'], data_source: 'nq' },
  ],
  test: [{ question: 'who painted the mona lisa', golden_answers: ['Leonardo da Vinci', 'Leonardo'], data_source: 'triviaqa' }],
};
const PAGES = [
  { id: 'p1', title: 'Hamlet', content: 'Hamlet is a tragedy.\n\n## Author\nWilliam Shakespeare wrote it around 1600.' },
  { id: 'p2', title: 'Paris', content: 'Paris is the capital of France.' },
];

function parquet(rows: Array<Record<string, unknown>>, name: string): Buffer {
  const file = join(tmp, name);
  writeParquet(file, rows);
  return readFileSync(file);
}

const fx = (dir: string, ...names: string[]) => Object.fromEntries(names.map((n) => [n, readFileSync(fixture('qwen3', dir, n))]));
const TRAIN = 'data/train-00000-of-00001.parquet';
const TEST = 'data/test-00000-of-00001.parquet';

const hub = new FakeHub();
const files = {
  [TRAIN]: parquet(QUESTIONS.train, 'train.parquet'),
  [TEST]: parquet(QUESTIONS.test, 'test.parquet'),
  'README.md': Buffer.from('# questions\n'),
};
const nqSha = hub.add({ kind: 'dataset', name: 'sr1/nq', files });
hub.add({
  kind: 'dataset',
  name: 'sr1/wiki',
  files: {
    'corpus.jsonl': Buffer.from(PAGES.map((p) => JSON.stringify(p)).join('\n') + '\n'),
    '.gitattributes': Buffer.from('*.jsonl filter=lfs\n'),
  },
});
hub.add({
  kind: 'model',
  name: 'tiny/qwen3',
  files: {
    ...fx('tiny-qwen3-f32', 'config.json', 'model.safetensors'),
    'README.md': Buffer.from('tiny'),
    'pytorch_model.bin': Buffer.from('not read'),
  },
});
hub.add({
  kind: 'model',
  name: 'tiny/sharded',
  files: {
    ...fx(
      'tiny-qwen3-bf16-sharded',
      'config.json',
      'model.safetensors.index.json',
      'model-00001-of-00002.safetensors',
      'model-00002-of-00002.safetensors',
    ),
    'onnx/model.onnx': Buffer.from('x'),
  },
});
hub.add({ kind: 'model', name: 'tiny/lora', files: fx('tiny-lora', 'adapter_config.json', 'adapter_model.safetensors') });
hub.add({ kind: 'model', name: 'gated/qwen3', files: fx('tiny-qwen3-f32', 'config.json', 'model.safetensors') });
hub.gated.set('model:gated/qwen3', 'hf_granted');

let cacheN = 0;
const freshCache = () => join(tmp, `cache-${++cacheN}`);

t.before(async () => {
  await hub.start();
  // The library's defaults come from the environment, as for a user: HF_ENDPOINT and HF_HUB_CACHE.
  process.env.HF_ENDPOINT = hub.url;
  process.env.HF_HUB_CACHE = join(tmp, 'env-cache');
  delete process.env.HF_TOKEN;
  delete process.env.HF_HUB_OFFLINE;
});
t.teardown(() => hub.stop());

t.test('hf: references parse into repo, revision, path and split; the split picks files as `datasets` does', async (t) => {
  t.match(parseHubRef('hf:PeterJinGo/nq_hotpotqa_train:test'), {
    repo: 'PeterJinGo/nq_hotpotqa_train',
    revision: 'main',
    path: '',
    split: 'test',
  });
  t.match(parseHubRef('hf:Qwen/Qwen3-0.6B@abc123/sub/dir'), {
    repo: 'Qwen/Qwen3-0.6B',
    revision: 'abc123',
    path: 'sub/dir',
    split: undefined,
  });
  for (const bad of ['hf:onlyname', 'hf:a/b/../c', 'hf:a/b:te st', 'hf:/b'])
    t.throws(() => parseHubRef(bad), { code: 'ARGUMENT_INVALID', message: /hf:OWNER\/NAME/ }, bad);
  t.ok(pathHasSplit('data/train-00000-of-00002.parquet', 'train'));
  t.ok(pathHasSplit('nq_dev.jsonl', 'dev'));
  t.notOk(pathHasSplit('contest.parquet', 'test'));
  const listing = [TRAIN, TEST, 'README.md', 'data/train.jsonl'].map((path) => ({ path, size: 1 }));
  t.same(selectDataFiles(parseHubRef('hf:a/b'), listing), [TRAIN], 'no split: train; Parquet preferred over JSONL');
  t.same(selectDataFiles(parseHubRef('hf:a/b:test'), listing), [TEST]);
  t.same(selectDataFiles(parseHubRef('hf:a/b/data/train.jsonl'), listing), ['data/train.jsonl'], 'a file path');
  t.throws(() => selectDataFiles(parseHubRef('hf:a/b:validation'), listing), {
    code: 'HUB_NOT_FOUND',
    message: /no data file of split "validation".*its splits: train, test/,
  });
  const model = [
    'config.json',
    'model.safetensors.index.json',
    'model-00001-of-00002.safetensors',
    'model-00002-of-00002.safetensors',
    'model.safetensors',
    'pytorch_model.bin',
    'onnx/model.onnx',
    'README.md',
    'tokenizer.json',
    'chat_template.jinja',
  ].map((path) => ({ path, size: 1 }));
  t.same(
    selectModelFiles(parseHubRef('hf:a/b'), model, new Set(['model-00001-of-00002.safetensors', 'model-00002-of-00002.safetensors'])),
    [
      'chat_template.jinja',
      'config.json',
      'model-00001-of-00002.safetensors',
      'model-00002-of-00002.safetensors',
      'model.safetensors.index.json',
      'tokenizer.json',
    ],
  );
  t.throws(() => selectModelFiles(parseHubRef('hf:a/b'), [{ path: 'pytorch_model.bin', size: 1 }]), {
    code: 'HUB_NOT_FOUND',
    message: /no config\.json.*pytorch_model\.bin/,
  });
});

t.test('questions (Search-R1 Parquet) and a corpus from hf:, downloaded once: the second load makes no request', async (t) => {
  const before = hub.requests.length;
  const qs = await loadQuestions('hf:sr1/nq:test');
  t.same(
    qs.map((q) => ({ question: q.question, golds: q.golds, data_source: q.data_source })),
    QUESTIONS.test.map((r) => ({ question: r.question, golds: r.golden_answers, data_source: r.data_source })),
  );
  const train = await loadQuestions('hf:sr1/nq');
  t.same(
    train.map((q) => q.question),
    QUESTIONS.train.map((q) => q.question),
    'no split: the train split',
  );
  const corpus = await Corpus.load('hf:sr1/wiki');
  t.same(corpus.pages, PAGES);
  t.ok(hub.requests.length > before, 'the first loads asked the hub');
  t.equal(hub.downloads('README.md').length, 0, 'files that are not data are not downloaded');
  const n = hub.requests.length;
  t.equal(hub.downloads(TEST).length > 0, true);
  t.same(
    (await loadQuestions('hf:sr1/nq:test')).map((q) => q.question),
    [QUESTIONS.test[0].question],
  );
  t.same((await Corpus.load('hf:sr1/wiki')).pages, PAGES);
  t.equal(hub.requests.length, n, 'loading again makes no request at all');

  // The cache is the hub's layout: refs/main -> commit, snapshot links into blobs named by the sha256.
  const storage = join(process.env.HF_HUB_CACHE!, 'datasets--sr1--nq');
  t.equal(readFileSync(join(storage, 'refs', 'main'), 'utf8'), nqSha);
  const link = join(storage, 'snapshots', nqSha, TEST);
  t.ok(lstatSync(link).isSymbolicLink());
  t.match(readlinkSync(link), /^\.\.\/\.\.\/\.\.\/blobs\/[0-9a-f]{64}$/);
  t.same(readFileSync(link), files[TEST]);
});

t.test('a connection dropped halfway through a file: the retry resumes with a Range request and the file is exact', async (t) => {
  const cacheDir = freshCache();
  hub.dropNext.set(TRAIN, 1);
  const logs: string[] = [];
  const [local] = await localDataFiles('hf:sr1/nq:train', { cacheDir, log: (s) => logs.push(s) });
  t.same(readFileSync(local), files[TRAIN]);
  const gets = hub.downloads(TRAIN).filter((r) => r.range !== 'bytes=0-0');
  const half = files[TRAIN].length >> 1;
  t.match(gets.at(-1), { range: `bytes=${half}-${files[TRAIN].length - 1}` }, 'the second try asked for the rest only');
  t.match(logs.join('\n'), /try 2 of 5 at /);
  const blobs = readdirSync(join(cacheDir, 'datasets--sr1--nq', 'blobs'));
  t.notOk(
    blobs.some((b) => b.endsWith('.incomplete') || b.endsWith('.lock')),
    'nothing partial left behind',
  );
});

t.test(
  'altered bytes (hash unlike the listing): HUB_DOWNLOAD_FAILED and nothing kept, for LFS (sha256) and git (blob id) files',
  async (t) => {
    for (const [ref, path, storage] of [
      ['hf:tiny/qwen3', 'model.safetensors', 'models--tiny--qwen3'],
      ['hf:sr1/wiki', 'corpus.jsonl', 'datasets--sr1--wiki'],
    ] as const) {
      const cacheDir = freshCache();
      hub.alter.add(path);
      try {
        const load: Promise<unknown> =
          ref === 'hf:tiny/qwen3' ? localModelDir(ref, { cacheDir, log: () => {} }) : localDataFiles(ref, { cacheDir, log: () => {} });
        await t.rejects(
          load,
          {
            code: 'HUB_DOWNLOAD_FAILED',
            message: new RegExp(`${path} arrived with hash [0-9a-f]+, not the [0-9a-f]+ the hub lists; the file was discarded`),
          },
          `${ref}: ${path}`,
        );
      } finally {
        hub.alter.delete(path);
      }
      const blobs = join(cacheDir, storage, 'blobs');
      const left = existsSync(blobs) ? readdirSync(blobs) : [];
      const size =
        ref === 'hf:tiny/qwen3'
          ? readFileSync(fixture('qwen3', 'tiny-qwen3-f32', path)).length
          : Buffer.from(PAGES.map((p) => JSON.stringify(p)).join('\n') + '\n').length;
      t.notOk(
        left.some((b) => statSync(join(blobs, b)).size === size),
        `${ref}: no blob of the altered file is kept (blobs: ${left.join(', ') || 'none'})`,
      );
      t.notOk(
        left.some((b) => b.endsWith('.incomplete')),
        `${ref}: no partial file left to resume from`,
      );
      // and the hub serving the right bytes again, the same cache takes the file
      const ok =
        ref === 'hf:tiny/qwen3'
          ? [join(await localModelDir(ref, { cacheDir, log: () => {} }), path)]
          : await localDataFiles(ref, { cacheDir, log: () => {} });
      t.ok(
        ok.some((f) => f.endsWith(path) && readFileSync(f).length > 0),
        `${ref}: then downloads`,
      );
    }
  },
);

t.test(
  'a gated repository: 401 without a token and 403 with one without access give HUB_AUTH_REQUIRED saying what to do; the granted token downloads',
  async (t) => {
    const cacheDir = freshCache();
    await t.rejects(localModelDir('hf:gated/qwen3', { cacheDir, log: () => {} }), {
      code: 'HUB_AUTH_REQUIRED',
      message: /hf:gated\/qwen3: .*answered 401 .*Set HF_TOKEN to an access token with read access/,
    });
    await t.rejects(localModelDir('hf:gated/qwen3', { cacheDir, token: 'hf_other', log: () => {} }), {
      code: 'HUB_AUTH_REQUIRED',
      message: /answered 403 .*The token in HF_TOKEN has no access: request access on the repository page/,
    });
    const dir = await localModelDir('hf:gated/qwen3', { cacheDir, token: 'hf_granted', log: () => {} });
    t.same(
      readFileSync(join(dir, 'model.safetensors')),
      readFileSync(fixture('qwen3', 'tiny-qwen3-f32', 'model.safetensors')),
      'the granted token gets the exact file',
    );
  },
);

t.test('a download that keeps failing is not taken for a file; the next run resumes it', async (t) => {
  const cacheDir = freshCache();
  hub.dropNext.set(TEST, 1);
  await t.rejects(localDataFiles('hf:sr1/nq:test', { cacheDir, attempts: 1, log: () => {} }), {
    code: 'HUB_DOWNLOAD_FAILED',
    message: /failed 1 times.*kept in .*\.incomplete; running again resumes/s,
  });
  const storage = join(cacheDir, 'datasets--sr1--nq');
  t.notOk(existsSync(join(storage, 'snapshots', nqSha, TEST)), 'no snapshot file for a partial download');
  const partial = readdirSync(join(storage, 'blobs')).filter((b) => b.endsWith('.incomplete'));
  t.equal(partial.length, 1);
  t.equal(statSync(join(storage, 'blobs', partial[0])).size, files[TEST].length >> 1);
  const n = hub.downloads(TEST).length;
  const [local] = await localDataFiles('hf:sr1/nq:test', { cacheDir, attempts: 1, log: () => {} });
  t.same(readFileSync(local), files[TEST]);
  t.match(
    hub
      .downloads(TEST)
      .slice(n)
      .filter((r) => r.range !== 'bytes=0-0'),
    [{ range: `bytes=${files[TEST].length >> 1}-${files[TEST].length - 1}` }],
  );
});

t.test('a repository that does not exist: HUB_NOT_FOUND with the URL tried and what to check', async (t) => {
  await t.rejects(localModelDir('hf:nobody/missing', { cacheDir: freshCache() }), {
    code: 'HUB_NOT_FOUND',
    message: new RegExp(`404 Not Found for ${hub.url}/api/models/nobody/missing/revision/main.*Check the model repository name`),
  });
  await t.rejects(loadQuestions('hf:nobody/missing:test'), { code: 'HUB_NOT_FOUND', message: /api\/datasets\/nobody\/missing/ });
  await t.rejects(loadQuestions('hf:sr1/nq:validation'), { code: 'HUB_NOT_FOUND', message: /split "validation".*its splits: train, test/ });
  await t.rejects(localModelDir('hf:sr1/nq@v9', { cacheDir: freshCache() }), { code: 'HUB_NOT_FOUND', message: /revision "v9"/ });
});

t.test('a hub cache that cannot be written: HUB_CACHE_UNWRITABLE naming the cache and what to do', async (t) => {
  // As root every folder is writable, so the test uses a cache path under a file (ENOTDIR), which
  // fails the same way for everyone.
  const file = join(tmp, 'not-a-folder');
  writeFileSync(file, 'x');
  const cacheDir = join(file, 'hub');
  await t.rejects(localModelDir('hf:tiny/qwen3', { cacheDir }), {
    code: 'HUB_CACHE_UNWRITABLE',
    message: new RegExp(
      `hf:tiny/qwen3: the Hugging Face cache at ${cacheDir} could not be written \\(ENOTDIR on mkdir .*\\)\\. Part of that path is a file.*HF_HUB_CACHE`,
    ),
  });
  // The other errno codes people meet (no permission, a full disk) map the same way, each with its hint.
  const errno = (code: string) => Object.assign(new Error(`${code}: failed`), { code, syscall: 'write', path: '/cache/x.incomplete' });
  t.match(
    hubCacheError(errno('EACCES'), '/cache', 'hf:a/b')?.message,
    /^hf:a\/b: the Hugging Face cache at \/cache could not be written \(EACCES on write \/cache\/x\.incomplete\)\. Make it writable/,
  );
  t.match(hubCacheError(errno('ENOSPC'), '/cache', 'hf:a/b'), {
    code: 'HUB_CACHE_UNWRITABLE',
    message: /disk is full.*next run resumes it/,
    details: { errno: 'ENOSPC', cacheDir: '/cache' },
  });
  t.equal(hubCacheError(errno('ECONNRESET'), '/cache', 'hf:a/b'), undefined, 'not a cache problem');
  t.equal(hubCacheError(new SlmError('HUB_NOT_FOUND', 'x'), '/cache', 'hf:a/b'), undefined, 'slm-train errors pass as they are');
});

t.test('an unreachable endpoint fails fast with HUB_UNREACHABLE; a silent one after the timeout, not a hang', async (t) => {
  const port = await freePort();
  const waits = recordWaits(t);
  await t.rejects(localDataFiles('hf:sr1/nq', { endpoint: `http://127.0.0.1:${port}`, cacheDir: freshCache(), attempts: 2 }), {
    code: 'HUB_UNREACHABLE',
    message: new RegExp(`could not reach the hub at http://127.0.0.1:${port} \\(ECONNREFUSED.*HF_ENDPOINT`),
  });
  t.equal(waits.length, 1, 'attempts 2: one wait between them');
  const silent = createServer(() => {}); // accepts, never answers
  await new Promise<void>((r) => silent.listen(0, '127.0.0.1', () => r()));
  t.teardown(() => {
    silent.closeAllConnections();
    silent.close();
  });
  waits.length = 0;
  await t.rejects(
    localModelDir('hf:tiny/qwen3', {
      endpoint: `http://127.0.0.1:${(silent.address() as AddressInfo).port}`,
      cacheDir: freshCache(),
      timeoutS: 0.5,
      attempts: 2,
    }),
    {
      code: 'HUB_UNREACHABLE',
      message: /no answer within 0.5 s/,
    },
  );
  t.equal(waits.length, 1, `attempts 2: gave up after one wait (${waits.join(', ')} ms)`);
});

t.test('HF_TOKEN is sent as a bearer token; HF_HUB_OFFLINE uses the cache and never the network', async (t) => {
  const cacheDir = freshCache();
  const n = hub.requests.length;
  await localDataFiles('hf:sr1/wiki', { cacheDir, token: 'hf_secret' });
  t.ok(hub.requests.slice(n).every((r) => r.auth === 'Bearer hf_secret'));
  await t.rejects(localDataFiles('hf:sr1/wiki', { cacheDir, token: 'not-a-token' }), {
    code: 'HUB_AUTH_REQUIRED',
    message: /expected "hf_\.\.\."/,
  });
  const m = hub.requests.length;
  t.same(await localDataFiles('hf:sr1/wiki', { cacheDir, offline: true }), [
    join(
      cacheDir,
      'datasets--sr1--wiki',
      'snapshots',
      readFileSync(join(cacheDir, 'datasets--sr1--wiki', 'refs', 'main'), 'utf8'),
      'corpus.jsonl',
    ),
  ]);
  await t.rejects(localDataFiles('hf:sr1/nq', { cacheDir, offline: true }), {
    code: 'HUB_UNREACHABLE',
    message: /not in the cache.*HF_HUB_OFFLINE/,
  });
  t.equal(hub.requests.length, m);
});

t.test('config paths: hf: references stay as written (not made absolute, not reported missing)', async (t) => {
  const file = join(tmp, 'eval.yaml');
  writeFileSync(file, 'stage: eval\nmodel:\n  path: hf:tiny/qwen3\ndata:\n  questions: hf:sr1/nq:test\n  corpus: hf:sr1/wiki\n');
  const cfg = loadConfig(file);
  t.equal(cfg.model.path, 'hf:tiny/qwen3');
  t.equal(cfg.data.questions, 'hf:sr1/nq:test');
  t.same(missingFiles(cfg), []);
  t.throws(() => loadConfig(file, ['data.index=hf:sr1/wiki']), { code: 'CONFIG_INVALID', message: /data\.index/ });
});

t.test('--model hf: and --adapter hf: give the logits of the local folders; sharded weights come with their index', async (t) => {
  const env = { HF_ENDPOINT: hub.url, HF_HUB_CACHE: freshCache() };
  const ids = '1,5,9,13,2';
  const local = await runCliAsync([
    'logits',
    '--model',
    fixture('qwen3', 'tiny-qwen3-f32'),
    '--adapter',
    fixture('qwen3', 'tiny-lora'),
    '--ids',
    ids,
    '--json',
  ]);
  t.equal(local.code, 0, local.stderr);
  const before = hub.requests.length;
  const remote = await runCliAsync(['logits', '--model', 'hf:tiny/qwen3', '--adapter', 'hf:tiny/lora', '--ids', ids, '--json'], { env });
  t.equal(remote.code, 0, remote.stderr);
  t.equal(remote.stdout, local.stdout, 'identical logits');
  t.match(remote.stderr, /hub: hf:tiny\/qwen3: model\.safetensors/);
  t.equal(hub.downloads('pytorch_model.bin').length + hub.downloads('README.md').length, 0, 'only what a model folder needs');
  const n = hub.requests.length;
  t.ok(n > before);
  const again = await runCliAsync(['logits', '--model', 'hf:tiny/qwen3', '--adapter', 'hf:tiny/lora', '--ids', ids, '--json'], { env });
  t.equal(again.stdout, local.stdout);
  t.equal(hub.requests.length, n, 'the second run makes no request');

  const sharded = await runCliAsync(
    ['generate', '--model', 'hf:tiny/sharded', '--ids', ids, '--greedy', '--max-new-tokens', '4', '--json'],
    { env },
  );
  const shardedLocal = await runCliAsync([
    'generate',
    '--model',
    fixture('qwen3', 'tiny-qwen3-bf16-sharded'),
    '--ids',
    ids,
    '--greedy',
    '--max-new-tokens',
    '4',
    '--json',
  ]);
  t.equal(sharded.code, 0, sharded.stderr);
  t.same(JSON.parse(sharded.stdout).ids, JSON.parse(shardedLocal.stdout).ids);
  t.equal(hub.downloads('onnx/model.onnx').length, 0);

  const missing = await runCliAsync(['logits', '--model', 'hf:nobody/missing', '--ids', ids, '--json'], { env });
  t.equal(missing.code, 2);
  t.match(missing.stderr, /^slm-train: error HUB_NOT_FOUND: hf:nobody\/missing: .*404 Not Found/m);
  t.notMatch(missing.stderr, /^\s+at /m, 'no stack trace');
});
