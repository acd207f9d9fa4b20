// rollout.engine openai (issue 8, item 3): generation on OpenAI-compatible servers with the adapter
// loaded at run time through vLLM's /v1/load_lora_adapter, against `slm-train serve`'s server on
// loopback: token ids come back exact (greedy rows equal the trainer's own engine with the same
// adapter), a loaded adapter changes the replies and an unloaded one is gone, requests spread over
// several servers and survive a dead one, a silent server gives ROLLOUT_SERVER_UNAVAILABLE in
// bounded time, and log-probs are recomputed by the trainer's engine.
import { createServer } from 'node:http';
import { join } from 'node:path';
import { recordWaits } from './helpers/waits.js';
import t from 'tap';
import { Model } from '../lib/engine/model.js';
import { OpenAIRollout, recomputeLogprobs } from '../lib/engine/openai-rollout.js';
import { ChatFormatter } from '../lib/model/chat.js';
import { initModel } from '../lib/model/init.js';
import { loadTokenizer } from '../lib/model/tokenizer.js';
import { OpenAIServer } from '../lib/serve/server.js';
import { freePort } from '../lib/distributed/launch.js';

const root = t.testdir();
const dir = join(root, 'model');
initModel({ preset: 'tiny', out: dir, seed: 6, embedStd: 0.3 });
const lora = { r: 4, alpha: 8, dropout: 0, rslora: false, targets: ['q_proj', 'v_proj', 'down_proj'] };

async function serve(t: { teardown(f: () => unknown): void }) {
  const model = await Model.load(dir);
  const tok = loadTokenizer(dir);
  model.setVocab(tok.tokenBytes());
  const server = new OpenAIServer({ model, tokenizer: tok, formatter: ChatFormatter.forModel(dir), name: 'tiny', port: 0 });
  const port = await server.listen();
  t.teardown(async () => {
    await server.close();
    model.dispose();
  });
  return { server, url: `http://127.0.0.1:${port}`, tok };
}

const prompts = [
  [5, 9, 33, 2],
  [40, 41, 42],
  [7, 7, 100, 12, 3],
].map((p) => Int32Array.from(p));

t.test('greedy rows through the server equal the engine, before and after the adapter is loaded', async (t) => {
  const a = await serve(t);
  const b = await serve(t);
  const trainer = await Model.load(dir);
  t.teardown(() => trainer.dispose());
  trainer.setVocab(a.tok.tokenBytes());
  trainer.attachLora(lora as never, 3);
  const remote = new OpenAIRollout({
    urls: [a.url, b.url + '/v1'],
    model: null,
    timeoutS: 30,
    retries: 1,
    concurrency: 4,
    stopTokenIds: a.tok.stopTokenIds,
    adapterDir: join(root, 'adapters'),
    name: 'run',
  });
  const req = { prompts, maxNewTokens: 10, greedy: true, stopTokenIds: a.tok.stopTokenIds };
  const local = async () => (await trainer.generate(req)).tokens.map((x) => Array.from(x));
  const viaServer = async () => (await remote.generate(req)).tokens.map((x) => Array.from(x));
  // B = 0: the fresh adapter is the base model.
  t.same(await viaServer(), await local(), 'base model: server ids = engine ids');
  const base = await viaServer();
  for (const [k, v] of Object.entries(trainer.trainable()))
    if (k.includes('lora_B'))
      trainer.setTrainable(
        k,
        v.map((_, i) => 4 * Math.sin(i + k.length)),
      );
  const name = await remote.syncAdapter(trainer);
  t.equal(name, 'run-v1');
  t.same([...a.server.adapters.keys()], ['run-v1'], 'server a loaded it');
  t.same([...b.server.adapters.keys()], ['run-v1'], 'server b loaded it');
  const tuned = await viaServer();
  t.same(tuned, await local(), 'with the adapter: server ids = engine ids (the adapter is in use)');
  t.not(JSON.stringify(tuned), JSON.stringify(base), 'and the adapter changed the replies');
  t.ok(
    (remote.sent.get(a.url) ?? 0) > 1 && (remote.sent.get(b.url) ?? 0) > 1,
    `requests spread over both servers (${[...remote.sent.values()].join(', ')})`,
  );
  await remote.syncAdapter(trainer);
  t.same([...a.server.adapters.keys()], ['run-v2'], 'the next step replaces the previous adapter');
  const gone = await fetch(`${a.url}/v1/completions`, {
    method: 'POST',
    body: JSON.stringify({ model: 'run-v1', prompt: [1, 2], max_tokens: 2 }),
  });
  t.equal(gone.status, 404, 'a request naming an unloaded adapter is a 404 (as vLLM answers an unknown model)');
  const dup = await fetch(`${a.url}/v1/load_lora_adapter`, {
    method: 'POST',
    body: JSON.stringify({ lora_name: 'run-v2', lora_path: join(root, 'adapters', 'run-v2') }),
  });
  t.equal(dup.status, 400, 'loading a name twice is refused (as vLLM does)');
  const bad = await fetch(`${a.url}/v1/load_lora_adapter`, {
    method: 'POST',
    body: JSON.stringify({ lora_name: 'x', lora_path: join(root, 'nothing') }),
  });
  t.equal(bad.status, 400, 'a folder without an adapter is refused');
  t.match(await bad.text(), /nothing/);
  const un = await fetch(`${a.url}/v1/unload_lora_adapter`, { method: 'POST', body: JSON.stringify({ lora_name: 'nope' }) });
  t.equal(un.status, 404);

  // Log-probs for the loss come from the trainer's engine, 0 off the mask.
  const ids = Int32Array.from([...prompts[0], ...tuned[0]]);
  const mask = Uint8Array.from(ids, (_, i) => (i >= prompts[0].length ? 1 : 0));
  const [ep] = await recomputeLogprobs(trainer, [{ ids, lossMask: mask, logprobs: new Float32Array(ids.length), temperature: 1 }]);
  const want = (await trainer.sequenceLogprobs([ids], 1))[0];
  // The masked pass projects only the trained rows through the vocabulary head (ATen's gemm, as all
  // teacher-forced passes), the full pass every row; BLAS's reduction order can depend on the row count
  // (OpenBLAS's AVX2 sgemm does: 2 float32 ulps at |x| ~ 4 measured), so equal within 1e-5, and exactly 0
  // off the mask.
  const gap = Math.max(...Array.from(want, (x, i) => (mask[i] ? Math.abs(ep.logprobs[i] - x) : 0)));
  t.ok(gap < 1e-5, `log-probs on the mask equal the full pass's within 1e-5 (worst ${gap.toExponential(2)})`);
  t.ok(
    Array.from(ep.logprobs).every((x, i) => mask[i] || x === 0),
    '0 off the mask',
  );
  t.ok(ep.logprobs.some((x) => x < 0));
});

t.test('a dead server is skipped; a silent one fails with ROLLOUT_SERVER_UNAVAILABLE', async (t) => {
  const a = await serve(t);
  const dead = `http://127.0.0.1:${await freePort()}`;
  const remote = new OpenAIRollout({
    urls: [dead, a.url],
    model: 'tiny',
    timeoutS: 5,
    retries: 3,
    concurrency: 2,
    stopTokenIds: a.tok.stopTokenIds,
    adapterDir: join(root, 'ad2'),
    backoffMs: 10,
  });
  const r = await remote.generate({ prompts, maxNewTokens: 4, greedy: true });
  t.equal(r.tokens.length, 3, 'every row answered');
  const silent = createServer(() => {});
  await new Promise<void>((res) => silent.listen(0, '127.0.0.1', () => res()));
  t.teardown(() => silent.closeAllConnections?.() ?? silent.close());
  const s = new OpenAIRollout({
    urls: [`http://127.0.0.1:${(silent.address() as { port: number }).port}`],
    model: 'tiny',
    timeoutS: 0.5,
    retries: 1,
    concurrency: 2,
    stopTokenIds: [],
    adapterDir: join(root, 'ad3'),
    backoffMs: 10,
  });
  const waits = recordWaits(t);
  await t.rejects(s.generate({ prompts: [prompts[0]], maxNewTokens: 2 }), {
    code: 'ROLLOUT_SERVER_UNAVAILABLE',
    message: /no reply within 500 ms/,
  });
  t.equal(waits.length, 1, 'two attempts (retries 1), one wait between them');
  t.throws(
    () => new OpenAIRollout({ urls: [], model: null, timeoutS: 1, retries: 0, concurrency: 1, stopTokenIds: [], adapterDir: root }),
    { code: 'CONFIG_INVALID' },
  );
});

t.test("slm-train train with rollout.engine openai: GRPO rollouts on a loopback server that loads each step's adapter", async (t) => {
  const { copyFileSync, readFileSync, writeFileSync } = await import('node:fs');
  const { syntheticCorpus } = await import('../lib/retrieval/synthetic.js');
  const { runCliAsync } = await import('./helpers/cli.js');
  const { dataFile, fixture, repoRoot } = await import('./helpers/shared.js');
  copyFileSync(fixture('qwen3-tokenizer', 'chat_template.jinja'), join(dir, 'chat_template.jinja'));
  const { pages, questions } = syntheticCorpus({ pages: 20, seed: 4 });
  writeFileSync(join(root, 'corpus.jsonl'), pages.map((p) => JSON.stringify(p)).join('\n') + '\n');
  writeFileSync(
    join(root, 'questions.jsonl'),
    questions
      .slice(0, 10)
      .map((q) => JSON.stringify({ id: q.id, question: q.question, answer: q.answer }))
      .join('\n') + '\n',
  );
  const log: string[] = [];
  const model = await Model.load(dir);
  const tok = loadTokenizer(dir);
  model.setVocab(tok.tokenBytes());
  const server = new OpenAIServer({
    model,
    tokenizer: tok,
    formatter: ChatFormatter.forModel(dir),
    name: 'tiny',
    port: 0,
    log: (l) => log.push(l),
  });
  const url = `http://127.0.0.1:${await server.listen()}`;
  t.teardown(async () => {
    await server.close();
    model.dispose();
  });
  // The config's judge on its own loopback endpoint, grading correct / incorrect alternately so that
  // the groups have variance (the random tiny model answers nothing right).
  let graded = 0;
  const judge = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(
        JSON.stringify({
          choices: [
            {
              index: 0,
              message: { role: 'assistant', content: `{"category": "${graded++ % 2 ? 'incorrect' : 'correct'}", "approach_score": 50}` },
              finish_reason: 'stop',
            },
          ],
        }),
      );
    });
  });
  await new Promise<void>((res) => judge.listen(0, '127.0.0.1', () => res()));
  t.teardown(() => judge.close());
  const judgeUrl = `http://127.0.0.1:${(judge.address() as { port: number }).port}/v1`;
  const runs = join(root, 'runs');
  const r = await runCliAsync(
    [
      'train',
      '--config',
      join(repoRoot, 'configs', 'code-grpo.yaml'),
      `model.path=${dir}`,
      'model.dtype=float32',
      'model.device=cpu',
      `data.questions=${join(root, 'questions.jsonl')}`,
      `data.corpus=${join(root, 'corpus.jsonl')}`,
      `run.dir=${runs}`,
      'lora.r=4',
      'lora.alpha=8',
      'lora.dropout=0',
      'rollout.k=2',
      'rollout.batch_questions=2',
      'protocol.max_new_tokens=12',
      'sandbox.workers=1',
      'train.steps=2',
      `reward.judge.base_url=${judgeUrl}`,
      'reward.judge.model=fake-judge',
      'reward.judge.skip_without_answer=false',
      `data.sft=${dataFile('seed-sft', 'trajectories.jsonl')}`,
      'rollout.engine=openai',
      `rollout.openai.urls=[${url}]`,
      'rollout.openai.timeout_s=60',
      '--json',
    ],
    { cwd: root },
  );
  t.equal(r.code, 0, `train exits 0${r.code ? `\n${r.stderr.slice(-3000)}` : ''}`);
  t.match(
    r.stderr,
    /rollouts: OpenAI-compatible servers http:\/\/127\.0\.0\.1:\d+ \(adapter reloaded after every step; log-probs recomputed here\)/,
  );
  const dirRun = join(runs, 'code-grpo');
  t.match(JSON.parse(r.stdout), { stage: 'grpo', steps: 2, dir: dirRun });
  // Before each step's rollouts the trainer wrote its adapter and the server loaded it (the previous one unloaded).
  const loaded = log.filter((l) => l.startsWith('serve: loaded adapter')).map((l) => l.split(' ')[3]);
  t.same(loaded, ['code-grpo-v1', 'code-grpo-v2'], 'one adapter per step, loaded by the server');
  t.same(log.filter((l) => l.startsWith('serve: unloaded')).length, 1, 'the step-1 adapter was unloaded');
  t.same([...server.adapters.keys()], ['code-grpo-v2']);
  const rows = server.batches.since(0).reduce((a, b) => a + b, 0);
  const traj = readFileSync(join(dirRun, 'trajectories.jsonl'), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l));
  t.equal(traj.length, 8, '2 steps x 2 questions x 2 rollouts');
  const turns = traj.reduce((a, x) => a + x.turns, 0);
  t.ok(rows >= turns, `the server generated every turn (${rows} rows for ${turns} turns)`);
  // Old log-probs (recomputed by the trainer's engine) and the policy being trained agree: ratio 1 in the
  // single inner epoch, as on-policy GRPO has it when the server generated with the current adapter.
  const metrics = readFileSync(join(dirRun, 'metrics.jsonl'), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l));
  t.equal(metrics.length, 2);
  t.ok(
    metrics.some((m) => m.episodes_trained > 0),
    'episodes were trained on',
  );
  for (const m of metrics)
    if (m.episodes_trained > 0) t.ok(Math.abs(m.ratio_mean - 1) < 1e-4, `step ${m.step}: importance ratio ${m.ratio_mean} = 1`);
});
