// Shared prefixes in generate (issue 19, item 1): rows with identical prompts prefill them once and
// the prefix common to every distinct prompt (a system prompt) is prefilled once at batch 1. The
// outputs must equal the unshared path's (sharePrefix: false): the same greedy tokens, the same
// sampled tokens under the same row seeds, log-probs within 1e-5, the same finish reasons, with
// repeated prompts of different lengths mixed with unique ones, rows stopping early (stop token,
// stop string, per-row limits), a LoRA adapter on, and the streaming path; and the prefill must
// compute fewer tokens than the prompts hold when prompts repeat.
import t, { type Test } from 'tap';
import { Model } from '../lib/engine/model.js';
import { native } from '../lib/engine/runtime.js';
import { fixture } from './helpers/shared.js';

const dir = fixture('qwen3', 'tiny-qwen3-f32');
const SYS = [151, 33, 402, 87, 19, 260, 311, 45, 98, 7, 188, 230];
const q1 = [204, 125, 373, 399, 458];
const q2 = [457, 205, 161, 125, 489, 119, 182, 259, 322];
const q3 = [17, 300];
const I = (a: number[]) => Int32Array.from(a);
// Repeated prompts of three lengths, a unique one, and the bare system prompt (shorter than the
// others: the shared prefix must leave it a token of its own).
const shared = [
  I([...SYS, ...q1]),
  I([...SYS, ...q2]),
  I([...SYS, ...q1]),
  I([...SYS, ...q3]),
  I([...SYS, ...q2]),
  I([...SYS, ...q1]),
  I(SYS),
  I([...SYS, 5, ...q3]),
];
// Nothing common to all prompts (one starts elsewhere): only the repeated prompts are shared.
const mixed = [I([...SYS, ...q1]), I(q2), I([...SYS, ...q1]), I(q3), I(q2), I([...SYS, ...q1])];

/** P + sum over distinct prompts of (length - P), P = the common prefix leaving each distinct prompt one token. */
function expectedPrefill(ps: Int32Array[]): number {
  const u = [...new Map(ps.map((p) => [p.join(','), p])).values()];
  let P = 0;
  if (u.length > 1) {
    P = u[0].length - 1;
    for (const p of u.slice(1)) {
      const n = Math.min(P, p.length - 1);
      let i = 0;
      while (i < n && p[i] === u[0][i]) i++;
      P = i;
    }
  }
  return P + u.reduce((s, p) => s + p.length - P, 0);
}

function maxDiff(a: Float32Array[], b: Float32Array[]): number {
  let d = 0;
  a.forEach((r, i) => r.forEach((x, j) => (d = Math.max(d, Math.abs(x - b[i][j])))));
  return d;
}

async function compare(t: Test, m: Model, req: Parameters<Model['generate']>[0], what: string) {
  const on = await m.generate({ ...req, sharePrefix: true });
  const off = await m.generate({ ...req, sharePrefix: false });
  t.same(
    on.tokens.map((x) => Array.from(x)),
    off.tokens.map((x) => Array.from(x)),
    `${what}: the same tokens shared and unshared`,
  );
  t.same(on.finishReasons, off.finishReasons, `${what}: the same finish reasons`);
  const d = maxDiff(on.logprobs, off.logprobs);
  t.ok(d <= 1e-5, `${what}: log-probs within 1e-5 (${d.toExponential(2)})`);
  const requested = req.prompts.reduce((s, p) => s + p.length, 0);
  t.equal(off.prefillTokensRequested, requested);
  t.equal(off.prefillTokens, requested, `${what}: unshared prefill computes every prompt token (${requested})`);
  t.equal(on.prefillTokensRequested, requested);
  t.equal(on.prefillTokens, expectedPrefill(req.prompts), `${what}: shared prefill computes ${on.prefillTokens} of ${requested} tokens`);
  return { on, off };
}

t.test('greedy and sampled rows: shared prefill equals the unshared path', async (t) => {
  const m = await Model.load(dir);
  t.teardown(() => m.dispose());
  for (const [name, prompts] of [
    ['system prompt shared', shared],
    ['no common prefix', mixed],
  ] as const) {
    const { on } = await compare(t, m, { prompts, maxNewTokens: 10, greedy: true }, `${name}, greedy`);
    t.ok(
      on.prefillTokens < on.prefillTokensRequested,
      `${name}: fewer prefill tokens computed (${on.prefillTokens}) than requested (${on.prefillTokensRequested})`,
    );
    if (name === 'no common prefix')
      t.equal(
        on.prefillTokens,
        [...new Set(prompts.map((p) => p.join(',')))].reduce((s, k) => s + k.split(',').length, 0),
        'each distinct prompt once',
      );
    // Sampled rows (a greedy row among them), one seed per row: the K samples of a prompt differ.
    const temperature = prompts.map((_, i) => (i === 1 ? 0 : 1.1));
    const rowSeeds = prompts.map((_, i) => 100 + i);
    const s = await compare(t, m, { prompts, maxNewTokens: 12, temperature, rowSeeds }, `${name}, sampled`);
    t.notSame(Array.from(s.on.tokens[0]), Array.from(s.on.tokens[2]), 'two samples of one prompt differ (own seeds)');
    await compare(t, m, { prompts, maxNewTokens: 12, temperature: 0.9, seed: 5, topK: 20, topP: 0.9 }, `${name}, sampled with (seed, row)`);
  }
});

t.test(
  "with the CPU kernels off (ATen's path, the one other devices take), the shared prefix is put before every row's keys",
  async (t) => {
    const m = await Model.load(dir);
    t.teardown(() => m.dispose());
    const a = native();
    a.setCpuKernels(false);
    t.teardown(() => a.setCpuKernels(true));
    await compare(t, m, { prompts: shared, maxNewTokens: 10, greedy: true }, 'kernels off, greedy');
    await compare(
      t,
      m,
      { prompts: shared, maxNewTokens: 12, temperature: 1.1, rowSeeds: shared.map((_, i) => 100 + i) },
      'kernels off, sampled',
    );
  },
);

t.test('rows that stop early: stop tokens, stop strings, max tokens', async (t) => {
  const m = await Model.load(dir);
  t.teardown(() => m.dispose());
  const free = await m.generate({ prompts: shared, maxNewTokens: 12, greedy: true, sharePrefix: false });
  // A token that row 0 emits at step 2 and row 1 does not emit early: some rows stop, others run on.
  const stop = free.tokens[0][2];
  const { on } = await compare(t, m, { prompts: shared, maxNewTokens: 12, greedy: true, stopTokenIds: [stop] }, 'stop token');
  t.ok(
    on.finishReasons.includes('stop_token') && on.finishReasons.includes('length'),
    `some rows stop on the token, others at the limit (${on.finishReasons.join(', ')})`,
  );
  t.ok(Math.min(...on.tokens.map((x) => x.length)) < 12, 'a row stopped early');
  const s = await compare(
    t,
    m,
    {
      prompts: mixed,
      maxNewTokens: 16,
      temperature: 1,
      rowSeeds: mixed.map((_, i) => i * 7 + 1),
      stopTokenIds: [free.tokens[1][0], free.tokens[3][1]],
    },
    'sampled, stop tokens',
  );
  t.ok(s.on.tokens.every((x) => x.length >= 1));
  // Stop strings on the decoded bytes (a vocabulary of "<id>" strings): ends a row inside its output.
  m.setVocab(Array.from({ length: m.vocabSize }, (_, i) => new TextEncoder().encode(`<${i}>`)));
  const ss = await compare(
    t,
    m,
    { prompts: shared, maxNewTokens: 12, greedy: true, stopStrings: [`<${free.tokens[1][3]}><`, `${free.tokens[6][1]}>`] },
    'stop strings',
  );
  t.ok(ss.on.finishReasons.includes('stop_string'), `a row stops on a string (${ss.on.finishReasons.join(', ')})`);
  // Per-row limits (the streaming path): rows of one prompt stop at different lengths.
  const rowMaxNewTokens = shared.map((_, i) => 1 + ((i * 5) % 12));
  const req = {
    prompts: shared,
    maxNewTokens: 12,
    temperature: 1,
    rowSeeds: shared.map((_, i) => 40 + i),
    rowMaxNewTokens,
    topLogprobs: 3,
  };
  const a = await m.generateStream({ ...req, sharePrefix: true });
  const b = await m.generateStream({ ...req, sharePrefix: false });
  t.same(
    a.tokens.map((x) => Array.from(x)),
    b.tokens.map((x) => Array.from(x)),
    'row limits: the same tokens',
  );
  t.same(
    a.tokens.map((x) => x.length),
    rowMaxNewTokens,
    'every row at its own limit',
  );
  t.ok(maxDiff(a.logprobs, b.logprobs) <= 1e-5, 'row limits: log-probs within 1e-5');
  t.ok(
    maxDiff(
      a.topLogprobs!.map((x) => x.logprobs),
      b.topLogprobs!.map((x) => x.logprobs),
    ) <= 1e-5,
    'top log-probs within 1e-5',
  );
  t.same(
    a.topLogprobs!.map((x) => Array.from(x.ids)),
    b.topLogprobs!.map((x) => Array.from(x.ids)),
    'the same top ids',
  );
  t.ok(
    a.prefillTokens < a.prefillTokensRequested && b.prefillTokens === b.prefillTokensRequested,
    `streamed prefill tokens ${a.prefillTokens} shared / ${b.prefillTokens} unshared`,
  );
});

t.test('streamed tokens equal shared generate, and a cancelled row leaves its copies running', async (t) => {
  const m = await Model.load(dir);
  t.teardown(() => m.dispose());
  // Row 2 is cancelled on its first token; 40 steps leave the event loop time to deliver it before
  // the row could end by length (with 10 the test raced a fast machine).
  const req = { prompts: shared, maxNewTokens: 40, temperature: 1, rowSeeds: shared.map((_, i) => 9 + i) };
  const plain = await m.generate({ ...req, sharePrefix: false });
  const seen: number[][] = shared.map(() => []);
  const ac = new AbortController();
  const s = await m.generateStream({
    ...req,
    sharePrefix: true,
    signals: shared.map((_, i) => (i === 2 ? ac.signal : undefined)),
    onToken: (e) => {
      seen[e.row].push(e.token);
      if (e.row === 2 && seen[2].length === 1) ac.abort();
    },
  });
  t.equal(s.finishReasons[2], 'cancelled');
  t.ok(
    s.prefillTokens < s.prefillTokensRequested,
    `the stream shared its prefill (${s.prefillTokens} of ${s.prefillTokensRequested} tokens)`,
  );
  for (let i = 0; i < shared.length; i++) {
    if (i === 2) {
      t.same(
        Array.from(s.tokens[2]),
        Array.from(plain.tokens[2]).slice(0, s.tokens[2].length),
        'the cancelled row: a prefix of its tokens',
      );
      continue;
    }
    t.same(Array.from(s.tokens[i]), Array.from(plain.tokens[i]), `row ${i}: streamed shared = unshared generate`);
    t.same(seen[i], Array.from(s.tokens[i]), `row ${i}: every token reported`);
  }
});

t.test('with a LoRA adapter on, shared prefill equals the unshared path', async (t) => {
  const m = await Model.load(dir);
  t.teardown(() => m.dispose());
  const base = await m.generate({ prompts: shared, maxNewTokens: 8, greedy: true });
  m.attachLora(
    {
      r: 4,
      alpha: 8,
      dropout: 0,
      rslora: false,
      targets: ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'],
    } as never,
    3,
  );
  for (const [name, v] of Object.entries(m.trainable()))
    if (name.endsWith('lora_B.weight'))
      m.setTrainable(
        name,
        v.map((_, i) => Math.sin(i + name.length) * 0.2),
      );
  const { on } = await compare(t, m, { prompts: shared, maxNewTokens: 8, greedy: true }, 'LoRA, greedy');
  t.not(
    maxDiff(
      on.logprobs.map((x, i) => x.subarray(0, Math.min(x.length, base.logprobs[i].length))),
      base.logprobs.map((x, i) => x.subarray(0, Math.min(x.length, on.logprobs[i].length))),
    ),
    0,
    'the adapter changes the outputs',
  );
  await compare(t, m, { prompts: mixed, maxNewTokens: 8, temperature: 1, rowSeeds: mixed.map((_, i) => i + 3) }, 'LoRA, sampled');
});
