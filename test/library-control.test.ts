// Control from code (issue 36, item 6): trainFromConfig's `onStep` gets each step's metrics row as it
// is logged, and its `signal` stops the run at the end of the step during which it is aborted,
// rejecting with the signal's reason (`resume: true` then continues); chat / chatStream (text in,
// text out, an async iterator of pieces) and evalFromConfig take a signal too.
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import {
  chat,
  chatStream,
  configFromObject,
  evalFromConfig,
  initModel,
  loadAgent,
  trainFromConfig,
  trainSteps,
  type StepMetrics,
} from '../lib/index.js';

const dir = t.testdir();

t.before(() => {
  initModel({ preset: 'tiny', out: join(dir, 'model'), seed: 1 });
  const rows = Array.from({ length: 4 }, (_, i) => ({
    messages: [
      { role: 'user', content: `Q${i}?` },
      { role: 'assistant', content: `A${i}.` },
    ],
  }));
  writeFileSync(join(dir, 'sft.jsonl'), rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
});

const cfg = () =>
  configFromObject(
    {
      stage: 'sft',
      model: { path: 'model' },
      data: { sft: 'sft.jsonl' },
      lora: { r: 2, alpha: 4 },
      train: { steps: 4, batch_size: 1, checkpoint_every: 1 },
      run: { dir: 'runs', name: 'ctl' },
    },
    { baseDir: dir },
  );

t.test('onStep events and an AbortSignal on trainFromConfig', async (t) => {
  const ac = new AbortController();
  const seen: StepMetrics[] = [];
  await t.rejects(
    trainFromConfig(cfg(), {
      signal: ac.signal,
      onStep: (row) => {
        seen.push(row);
        if (row.step === 2) ac.abort();
      },
    }),
    { name: 'AbortError' },
    'aborted during step 2: rejects with the AbortError',
  );
  t.same(
    seen.map((r) => r.step),
    [1, 2],
    'one event per step, stopped after step 2',
  );
  t.ok(
    seen.every((r) => r.stage === 'sft' && typeof r.loss === 'number' && typeof r.lr === 'number'),
    'the metrics row (stage, loss, lr, ...)',
  );
  const logged = readFileSync(join(dir, 'runs', 'ctl', 'metrics.jsonl'), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as Record<string, unknown>);
  t.same(
    logged.map(({ time: _t, ...r }) => r),
    seen.map((r) => JSON.parse(JSON.stringify(r))),
    'the events are the rows of metrics.jsonl',
  );

  const rest: number[] = [];
  const r = await trainFromConfig(cfg(), { resume: true, onStep: (row) => void rest.push(row.step) });
  t.equal(r.steps, 4);
  t.same(rest, [2, 3, 4], 'resumed from step 1 (step 2 was aborted before its checkpoint)');

  const pre = new AbortController();
  pre.abort(new Error('not now'));
  await t.rejects(
    trainFromConfig(cfg(), { signal: pre.signal }),
    { message: 'not now' },
    'an aborted signal stops it before anything loads',
  );
});

t.test('chat and chatStream: text in, text out; a stream of pieces; an AbortSignal', async (t) => {
  const agent = await loadAgent(cfg());
  t.teardown(() => agent.model.dispose());
  const messages = [{ role: 'user' as const, content: 'Hello?' }];
  const reply = await chat(agent, messages, { maxNewTokens: 12, greedy: true });
  t.type(reply.text, 'string');
  t.ok(reply.tokens.length >= 1 && reply.tokens.length <= 12, `${reply.tokens.length} tokens`);
  t.equal(
    reply.text,
    agent.tokenizer.decode(Array.from(reply.tokens)).replace(/<\|im_end\|>$/, ''),
    'the text is the decoded tokens (stop text left out)',
  );
  const pieces: string[] = [];
  const it = chatStream(agent, messages, { maxNewTokens: 12, greedy: true });
  let r = await it.next();
  while (!r.done) {
    pieces.push(r.value);
    r = await it.next();
  }
  t.equal(pieces.join(''), reply.text, 'the pieces make the same (greedy) reply');
  t.same(Array.from(r.value.tokens), Array.from(reply.tokens));
  // Tokens that arrive while the loop body runs come out together (one piece): on a loaded machine all
  // 12 may be sampled before the loop first runs. Delivered one event-loop turn apart, each is a piece.
  const live = agent.model.generateStream.bind(agent.model);
  agent.model.generateStream = (req) => {
    const events: Parameters<NonNullable<typeof req.onToken>>[0][] = [];
    return live({ ...req, onToken: (ev) => events.push(ev) }).then(async (out) => {
      for (const ev of events) {
        req.onToken?.(ev);
        await new Promise((r) => setImmediate(r));
      }
      return out;
    });
  };
  const apart: string[] = [];
  try {
    for await (const p of chatStream(agent, messages, { maxNewTokens: 12, greedy: true })) apart.push(p);
  } finally {
    agent.model.generateStream = live;
  }
  t.equal(apart.join(''), reply.text, 'tokens delivered apart: the same reply');
  t.ok(apart.length > 1 || reply.tokens.length <= 1, `tokens delivered apart: streamed in ${apart.length} pieces`);

  const ac = new AbortController();
  const got: string[] = [];
  await t.rejects(
    (async () => {
      for await (const p of chatStream(agent, messages, { maxNewTokens: 200, temperature: 1, seed: 3, signal: ac.signal })) {
        got.push(p);
        ac.abort();
      }
    })(),
    { name: 'AbortError' },
    'aborting the signal ends the stream with an AbortError',
  );
  t.ok(got.length >= 1 && got.length < 200, `stopped early (${got.length} pieces)`);
  // Breaking out of the loop cancels the row (the native call's result says so).
  const orig = agent.model.generateStream.bind(agent.model);
  let res: ReturnType<typeof orig> | undefined;
  agent.model.generateStream = (req) => (res = orig(req));
  for await (const _p of chatStream(agent, messages, { maxNewTokens: 200, temperature: 1, seed: 3 })) break;
  agent.model.generateStream = orig;
  const out = await res!;
  t.equal(out.finishReasons[0], 'cancelled', `break cancels generation (${out.tokens[0]!.length} of 200 tokens)`);
  const pre = new AbortController();
  pre.abort();
  await t.rejects(chat(agent, messages, { signal: pre.signal }), { name: 'AbortError' });
});

t.test('evalFromConfig takes an AbortSignal', async (t) => {
  writeFileSync(
    join(dir, 'questions.jsonl'),
    ['{"question": "What is 1+1?", "answer": "2"}', '{"question": "What is 2+2?", "answer": "4"}'].join('\n') + '\n',
  );
  const ev = configFromObject(
    {
      stage: 'eval',
      model: { path: 'model' },
      data: { questions: 'questions.jsonl' },
      protocol: { kind: 'direct', max_new_tokens: 3 },
      eval: { split: 'all' },
      run: { dir: 'runs' },
    },
    { baseDir: dir },
  );
  const ok = await evalFromConfig(ev, { label: 'whole' });
  t.equal(ok.summary.questions, 2, 'without a signal it evaluates both');
  const ac = new AbortController();
  await t.rejects(
    evalFromConfig(ev, { label: 'stopped', signal: ac.signal, log: (l) => /^eval stopped: /.test(l) && ac.abort() }),
    { name: 'AbortError' },
    'aborted as it starts: rejects at the end of the first turn',
  );
  t.notOk(existsSync(join(dir, 'runs', 'evals', 'stopped', 'trajectories.jsonl')), 'no trajectories written for the unfinished batch');
  const pre = new AbortController();
  pre.abort();
  await t.rejects(evalFromConfig(ev, { signal: pre.signal }), { name: 'AbortError' }, 'an aborted signal: before anything loads');
});

t.test('trainSteps: the steps as an async iterator, the result as its return value', async (t) => {
  const c = configFromObject(
    {
      stage: 'sft',
      model: { path: 'model' },
      data: { sft: 'sft.jsonl' },
      lora: { r: 2, alpha: 4 },
      train: { steps: 3, batch_size: 1 },
      run: { dir: 'runs', name: 'iter' },
    },
    { baseDir: dir },
  );
  const it = trainSteps(c);
  const steps: number[] = [];
  let r = await it.next();
  while (!r.done) {
    steps.push(r.value.step);
    t.type(r.value.loss, 'number');
    r = await it.next();
  }
  t.same(steps, [1, 2, 3]);
  t.match(r.value, { stage: 'sft', steps: 3 });
  // An error of the run is thrown from the iterator (here: the run folder exists).
  await t.rejects(
    (async () => {
      for await (const _s of trainSteps(c));
    })(),
    { code: 'RUN_EXISTS' },
  );
});
