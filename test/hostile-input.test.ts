// Hostile and careless input outside the servers (issue 33): each mistake is a coded error that says
// what was expected, not a silent misbehaviour.
import { mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { configFromObject, loadConfig } from '../lib/config/index.js';
import { Corpus } from '../lib/retrieval/corpus.js';
import { SearchIndex } from '../lib/retrieval/index.js';
import { parseJudgeConfig } from '../lib/rewards/config.js';
import { resolveLimits } from '../lib/sandbox/job.js';
import { createSandbox } from '../lib/sandbox/index.js';
import { openIndex } from '../lib/train/environment.js';
import { ChatTemplate, type ChatMessage } from '../lib/model/chat.js';
import { initModel } from '../lib/model/init.js';
import { runCli } from './helpers/cli.js';

const dir = t.testdir();
const sftConfig = join(dir, 'sft.yaml');
writeFileSync(sftConfig, `stage: sft\nmodel:\n  path: /m\ndata:\n  sft: /d.jsonl\n`);

t.test('timeouts have an upper bound (24 h): Node timers past 2^31 - 1 ms fire at once', async (t) => {
  // Row 4: sandbox.timeout_s=3000000 set every program's timer to 1 ms.
  t.throws(() => loadConfig(sftConfig, ['sandbox.timeout_s=3000000']), {
    code: 'CONFIG_INVALID',
    message: /sandbox\.timeout_s: expected a number > 0 and <= 86400, found 3000000/,
  });
  for (const key of ['retrieval.timeout_s', 'rollout.openai.timeout_s', 'distributed.timeout_s'])
    t.throws(
      () => loadConfig(sftConfig, [`${key}=1e12`]),
      { code: 'CONFIG_INVALID', message: new RegExp(`${key.replace(/\./g, '\\.')}: expected a number > 0 and <= 86400`) },
      key,
    );
  t.equal(loadConfig(sftConfig, ['sandbox.timeout_s=86400']).sandbox.timeout_s, 86400, '24 h itself is accepted');
  t.throws(() => parseJudgeConfig({ backend: 'openai', base_url: 'http://x', timeout_s: 3e6 }), {
    code: 'CONFIG_INVALID',
    message: /timeout_s/,
  });

  // The library: a sandbox refuses such a limit instead of timing every program out.
  t.throws(() => resolveLimits({ timeoutMs: 2_200_000_000 }), {
    code: 'ARGUMENT_INVALID',
    message: /timeoutMs of at most 86400000 \(24 h\) but received 2200000000/,
  });
  const sb = await createSandbox({ kind: 'quickjs', timeoutMs: 1000 });
  t.teardown(() => sb.close());
  await t.rejects(sb.run('1', { timeoutMs: 2_200_000_000 }), { code: 'ARGUMENT_INVALID' });

  // The CLI: `exec --timeout-s 2200000`.
  writeFileSync(join(dir, 'corpus.jsonl'), JSON.stringify({ id: 'p1', title: 'T', content: 'text' }) + '\n');
  const r = runCli(['exec', '--corpus', join(dir, 'corpus.jsonl'), '--sandbox', 'quickjs', '--timeout-s', '2200000', '-'], {
    input: 'print(1)',
  });
  t.equal(r.code, 2, r.stderr);
  t.match(r.stderr, /error ARGUMENT_INVALID: --timeout-s expects a positive number of seconds, at most 86400 \(24 h\), found 2200000/);
  t.notMatch(r.stderr, /TimeoutOverflowWarning/);
});

t.test('YAML aliases are bounded: an alias bomb is CONFIG_INVALID, not an internal error', async (t) => {
  // Row 11: nine levels of nine aliases, 9^9 copies of "lol" once expanded.
  const levels = 'abcdefghi'.split('');
  const bomb = levels
    .map(
      (n, i) =>
        `${n}: &${n} [${Array(9)
          .fill(i ? `*${levels[i - 1]}` : '"lol"')
          .join(',')}]`,
    )
    .join('\n');
  writeFileSync(join(dir, 'bomb.yaml'), `stage: sft\nmodel:\n  path: /m\n${bomb}\n`);
  t.throws(() => loadConfig(join(dir, 'bomb.yaml')), {
    code: 'CONFIG_INVALID',
    message: /bomb\.yaml: its aliases \(\*name\) expand to too many copies/,
  });
  const r = runCli(['train', '--config', join(dir, 'bomb.yaml')]);
  t.equal(r.code, 2);
  t.match(r.stderr, /error CONFIG_INVALID: .*bomb\.yaml: its aliases/);
  t.notMatch(r.stderr, /internal error/);

  writeFileSync(join(dir, 'unresolved.yaml'), `stage: sft\nmodel:\n  path: *nowhere\n`);
  t.throws(() => loadConfig(join(dir, 'unresolved.yaml')), {
    code: 'CONFIG_INVALID',
    message: /Unresolved alias.*nowhere; define each anchor/,
  });

  // Ordinary use of anchors still works.
  writeFileSync(
    join(dir, 'anchors.yaml'),
    `stage: sft\nmodel:\n  path: /m\ndata:\n  sft: /d.jsonl\nrollout:\n  top_p: &p 0.9\neval:\n  top_p: *p\n`,
  );
  t.equal(loadConfig(join(dir, 'anchors.yaml')).eval.top_p, 0.9, 'an alias of an anchor');
});

t.test('outputs stay in their folder and overwrite nothing slm-train did not write', async (t) => {
  // Row 13: run.name=../../../../tmp/x wrote the run outside run.dir.
  for (const name of ['../../../../tmp/x', 'a/b', '..', '.', 'a\\b'])
    t.throws(
      () => loadConfig(sftConfig, [`run.name=${name}`]),
      {
        code: 'CONFIG_INVALID',
        message: /run\.name: expected a plain folder name \(no \/, \\ or NUL, not \. or \.\.\): the run is written to run\.dir\/run\.name/,
      },
      name,
    );
  t.equal(loadConfig(sftConfig, ['run.name=my-run.2']).run.name, 'my-run.2', 'a plain name is fine');

  // Row 13: data.index= a folder of someone else's files had its pages.json and vectors.f32 overwritten.
  const corpus = join(dir, 'index-corpus.jsonl');
  writeFileSync(corpus, JSON.stringify({ id: 'p1', title: 'Hamlet', content: 'A play by Shakespeare.' }) + '\n');
  const theirs = join(dir, 'theirs');
  mkdirSync(theirs);
  writeFileSync(join(theirs, 'pages.json'), 'their pages');
  writeFileSync(join(theirs, 'vectors.f32'), 'their vectors');
  const untouched = () =>
    t.same(
      [readFileSync(join(theirs, 'pages.json'), 'utf8'), readFileSync(join(theirs, 'vectors.f32'), 'utf8'), readdirSync(theirs).sort()],
      ['their pages', 'their vectors', ['pages.json', 'vectors.f32']],
      'their files are as they were',
    );
  const refused = {
    code: 'INDEX_INVALID',
    message:
      /theirs holds files but no index written by slm-train \(no manifest\.json of format slm-train-index\); writing the index there would overwrite its files/,
  };
  const cfg = configFromObject({
    stage: 'eval',
    model: { path: '/m' },
    data: { questions: '/q.jsonl', corpus, index: theirs },
    retrieval: { kind: 'bm25' },
  });
  await t.rejects(openIndex(cfg), refused, 'training with data.index');
  untouched();
  const idx = await SearchIndex.build(await Corpus.load(corpus), { kind: 'bm25' });
  t.throws(() => idx.save(theirs), refused, 'SearchIndex.save');
  const r = runCli(['index', '--corpus', corpus, '--out', theirs, '--kind', 'bm25']);
  t.equal(r.code, 2);
  t.match(r.stderr, /error INDEX_INVALID: .*theirs holds files but no index written by slm-train/);
  untouched();

  // A new folder, an empty one and an index of ours are written.
  const ours = join(dir, 'ours');
  idx.save(ours);
  idx.save(ours);
  mkdirSync(join(dir, 'empty'));
  idx.save(join(dir, 'empty'));
  t.equal((await SearchIndex.load(ours)).corpus.pages.length, 1);
  t.notOk(readdirSync(ours).includes('.slm-train-index-writing'), 'the in-progress mark is gone once saved');
  // A folder another rank is saving the same index into (its in-progress mark, no manifest yet).
  const saving = join(dir, 'saving');
  mkdirSync(saving);
  writeFileSync(join(saving, '.slm-train-index-writing'), '');
  writeFileSync(join(saving, 'vectors.f32'), '');
  idx.save(saving);
  t.equal((await SearchIndex.load(saving)).corpus.pages.length, 1);
});

t.test('chat templates render within a time and size budget: a huge loop is CHAT_TEMPLATE_ERROR, not a hang', async (t) => {
  // Row 10: a 1e8 x 1e8 loop made `generate` hang and grow to 3.3 GB in 7 s.
  const bomb = '{% for i in range(100000000) %}{% for j in range(100000000) %}x{% endfor %}{% endfor %}';
  const msgs: ChatMessage[] = [{ role: 'user', content: 'hi' }];
  const stopped = (why: RegExp) => ({
    code: 'CHAT_TEMPLATE_ERROR',
    message: new RegExp(
      `The chat template from bomb was stopped while rendering 1 message\\(s\\): ${why.source}.*Expected a template that renders a conversation in well under`,
    ),
  });
  let t0 = performance.now();
  t.throws(() => new ChatTemplate(bomb, 'bomb').render(msgs), stopped(/range\(\) of 100000000 items is past its budget of 65536/));
  // The refusal names range()'s item budget: the list was never built (tests assert no timings; the time is for the log).
  t.comment(`refused after ${(performance.now() - t0).toFixed(0)} ms`);
  // Nested loops of allowed lengths: the time budget.
  t0 = performance.now();
  const slow = '{% for i in range(60000) %}{% for j in range(60000) %}{% endfor %}{% endfor %}';
  t.throws(
    () => new ChatTemplate(slow, 'bomb').render(msgs, { budget: { timeMs: 300 } }),
    stopped(/it ran past its time budget of 300 ms/),
  );
  t.comment(`stopped after ${(performance.now() - t0).toFixed(0)} ms`);
  // A string doubled in a loop, and text piled up by a loop: the size budgets.
  const doubling = "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}";
  t.throws(
    () => new ChatTemplate(doubling, 'bomb').render(msgs),
    stopped(/it made a string of \d+ characters, past its budget of 16777216/),
  );
  const pile = '{% for i in range(60000) %}{{ messages[0].content ~ i }}{% endfor %}';
  // A generous time budget here, so that the size budget is what stops it on a loaded machine too.
  t.throws(
    () =>
      new ChatTemplate(pile, 'bomb').render([{ role: 'user', content: 'y'.repeat(4096) }] as ChatMessage[], {
        budget: { timeMs: 120_000 },
      }),
    stopped(/it made more than 134217728 characters of text in all/),
  );
  const lists = '{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}';
  t.throws(() => new ChatTemplate(lists, 'bomb').render(msgs), stopped(/it made a list of 131072 items, past its budget of 65536/));
  // Ordinary templates are unchanged: globals (range, raise_exception, strftime_now, none) work as before.
  t.equal(
    new ChatTemplate(
      "{% for i in range(3) %}{{ i }}{% endfor %}|{{ range(1, 7, 2) | join(',') }}|{{ range(3, 0, -1) | join(',') }}|{{ none is none }}|{{ strftime_now('%Y') }}",
    ).render(msgs),
    `012|1,3,5|3,2,1|true|${new Date().getFullYear()}`,
  );
  t.throws(() => new ChatTemplate("{{ raise_exception('no tools') }}").render(msgs), {
    code: 'CHAT_TEMPLATE_ERROR',
    message: /failed while rendering 1 message\(s\): no tools/,
  });

  // The CLI: `generate` with such a template in the model folder ends with the coded error.
  const model = join(dir, 'bomb-model');
  initModel({ preset: 'tiny', out: model, seed: 1 });
  writeFileSync(join(model, 'chat_template.jinja'), bomb);
  t0 = performance.now();
  const r = runCli(['generate', '--model', model, '--prompt', 'hi', '--max-new-tokens', '2'], { timeout: 60_000 });
  t.equal(r.code, 2, r.stderr);
  t.match(
    r.stderr,
    /error CHAT_TEMPLATE_ERROR: The chat template from .*chat_template\.jinja was stopped while rendering 1 message\(s\): range\(\) of 100000000 items/,
  );
  // Not a hang: exit code 2 means it ended by itself (runCli's 60 s timeout would leave no code).
  t.comment(`ended after ${(performance.now() - t0).toFixed(0)} ms`);
});

t.test('tool calls are capped: 64 KiB of arguments per call, refused ones not kept; calls past the limit not recorded', async (t) => {
  // Row 2: 16 MB arguments 1,000 times were all kept in `calls` (host RSS 2.1-2.5 GB, then 'Invalid string length').
  const seen: number[] = [];
  const tools = { search_pages: (q: string) => (seen.push(q.length), []), view_sections: () => [], read_section: () => '' };
  for (const kind of ['quickjs', 'python'] as const) {
    const sb = await createSandbox({ kind, tools, size: 1, timeoutMs: 120_000, memoryMb: 256 });
    t.teardown(() => sb.close());
    seen.length = 0;
    // 16 MiB and 100,000 characters, 20 times each, then one call at the limit.
    const code =
      kind === 'quickjs'
        ? "let err = ''; for (const n of [16 << 20, 100000]) { const big = 'Z'.repeat(n); for (let i = 0; i < 20; i++) { try { search_pages(big) } catch (e) { err += String(e) + '|' } } } search_pages('Z'.repeat(65536)); print(new Set(err.split('|')).size, err.split('|')[0])"
        : "err = ''\nfor n in (16 << 20, 100000):\n    big = 'Z' * n\n    for i in range(20):\n        try:\n            search_pages(big)\n        except ValueError as e:\n            err += 'ValueError: ' + str(e) + '|'\nsearch_pages('Z' * 65536)\nparts = err.split('|')\nprint(len(set(parts)), parts[0])";
    const r = await sb.run(code);
    t.equal(r.error, null, `${kind}: ${r.error}`);
    t.match(
      r.stdout,
      /^2 (ValueError|Error): the arguments of search_pages\(\) are too large: at most 65536 characters per call, found more than 65536; pass a shorter query or id\n$/,
      `${kind}: every oversized call was refused with the same error`,
    );
    t.same(seen, [65536], `${kind}: only the call within the limit reached the tool`);
    // The host records each refusal it saw without its arguments (Python refuses 16 MiB in the program's process, unsent).
    const refused = kind === 'quickjs' ? 40 : 20;
    t.equal(r.calls.length, refused + 1);
    t.same(
      r.calls.slice(0, refused).map((c) => [c.ok, c.args.length]),
      Array.from({ length: refused }, () => [false, 0]),
      `${kind}: refused arguments are not kept`,
    );
    t.same([r.calls[refused].ok, (r.calls[refused].args[0] as string).length], [true, 65536]);
    // Calls past the limit are refused; the first refusal is recorded, none after it.
    const loop =
      kind === 'quickjs'
        ? "for (let i = 0; i < 5000; i++) { try { search_pages('x') } catch (e) {} } print('done')"
        : "for i in range(5000):\n    try:\n        search_pages('x')\n    except RuntimeError:\n        pass\nprint('done')";
    const l = await sb.run(loop, { maxCalls: 5 });
    t.equal(l.stdout, 'done\n', l.error ?? '');
    t.same(
      l.calls.map((c) => c.ok),
      [true, true, true, true, true, false],
      `${kind}: at most maxCalls + 1 records`,
    );
  }
});
