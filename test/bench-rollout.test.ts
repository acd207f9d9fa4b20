// `bench rollout`'s generation rooflines (bench/rollout.ts): one generate call's time at the matmul
// rate and the read bandwidth (callRoofline), the read and the rate a run stands at (the harmonic
// means of those measured before and after it), and the plumbing: `slm-train bench rollout --quick
// --out F` on the tiny preset, each run's roofline recomputed from its calls and its own reads and
// matmul rates in the JSON; the rounds of the largest K against K 1 (kRound, summarizeKRounds), and
// --rounds reaching them.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { layerMatmulParams } from '../bench/engine.js';
import { callRoofline, distinctPrefixTokens, kRound, runRoofline, summarizeKRounds, type RoundRun } from '../bench/rollout.js';
import { initModel } from '../lib/model/init.js';
import { runCliAsync } from './helpers/cli.js';

// The weights alone (no KV cache, no attention): the sizes and calls of the first two tests.
const noKv = { kvBytesPerToken: 0, attnFlopsPerToken: 0 };
const noCtx = { promptTokens: 0, kvTokens: 0 };

t.test('a generate call at the rooflines: prefill at the matmul rate, each step after the first at its binding limit', async (t) => {
  const m = { layerParams: 1e6, VH: 2e5, bytesPerParam: 4, ...noKv };
  const lim = { f32: 100, read: 10 }; // GFLOP/s, GB/s
  // Prefill of 50 tokens, 2 rows: (2e6 x 50 + 2 x 2e5 x 2) / 1e11 = 1.008 ms. A step reads 4.8 MB
  // (0.48 ms at 10 GB/s) against 2 x 1.2e6 x 2 FLOPs (0.048 ms): memory bound; 9 steps after the first.
  const c = { rows: 2, prefillTokens: 50, steps: 10, ...noCtx };
  t.ok(Math.abs(callRoofline(c, m, lim) - (1.008e-3 + 9 * 0.48e-3)) < 1e-12, `${callRoofline(c, m, lim)}`);
  // 64 rows: 2 x 1.2e6 x 64 / 1e11 = 1.536 ms per step, above the read's 0.48: compute bound.
  const wide = { rows: 64, prefillTokens: 0, steps: 2, ...noCtx };
  t.ok(Math.abs(callRoofline(wide, m, lim) - (2 * 2e5 * 64) / 1e11 - 1.536e-3) < 1e-12);
  // A faster read lowers only the memory-bound steps.
  t.ok(callRoofline(c, m, { ...lim, read: 20 }) < callRoofline(c, m, lim));
  t.equal(callRoofline(wide, m, { ...lim, read: 20 }), callRoofline(wide, m, lim));
  t.equal(callRoofline({ rows: 1, prefillTokens: 0, steps: 1, ...noCtx }, m, lim), (2 * 2e5) / 1e11, 'one step: the prefill only');
});

t.test("the prompts' distinct prefix tokens: a prefix several prompts share counted once", async (t) => {
  const p = (...ids: number[]) => Int32Array.from(ids);
  t.equal(distinctPrefixTokens([]), 0);
  t.equal(distinctPrefixTokens([p(1, 2, 3)]), 3);
  t.equal(distinctPrefixTokens([p(1, 2, 3), p(1, 2, 3), p(1, 2, 3)]), 3, 'identical prompts (the K samples of a question): once');
  // 1 2 3 / 1 2 4 share "1 2"; 5 shares nothing; 1 2 is a prefix of the others; 2 1 starts elsewhere.
  t.equal(distinctPrefixTokens([p(1, 2, 3), p(1, 2, 4), p(5), p(1, 2), p(2, 1)]), 7);
  t.equal(distinctPrefixTokens([p(7, 7), p(7)]), 2, 'a repeated token deeper in a prompt is a node of its own');
});

t.test("a decode step's KV entries at the read bandwidth and its attention at the matmul rate", async (t) => {
  // 1 kB of keys and values per token, 500 attention FLOPs per query token and key position.
  const m = { layerParams: 1e6, VH: 2e5, bytesPerParam: 4, kvBytesPerToken: 1000, attnFlopsPerToken: 500 };
  const lim = { f32: 100, read: 10 };
  // 2 rows, prompts of 50 tokens each sharing 40 (60 distinct), 3 steps: steps 1 and 2 read the weights
  // (4.8 MB) and 60 + 2s entries (memory bound): 4.862 MB and 4.864 MB at 10 GB/s.
  const c = { rows: 2, prefillTokens: 60, steps: 3, promptTokens: 100, kvTokens: 60 };
  const prefill = (2e6 * 60 + 2 * 2e5 * 2) / 1e11;
  t.ok(Math.abs(callRoofline(c, m, lim) - (prefill + 4.862e-4 + 4.864e-4)) < 1e-12, `${callRoofline(c, m, lim)}`);
  // No sharing (100 distinct): 40 kB more per step; the FLOPs do not change (each row attends to its whole prompt).
  t.ok(Math.abs(callRoofline({ ...c, kvTokens: 100 }, m, lim) - callRoofline(c, m, lim) - 2 * 4e-6) < 1e-12);
  // 64 rows of 100-token prompts, one shared prompt: step 1 computes 2 x 1.2e6 x 64 + 500 x (6400 + 64)
  // FLOPs (1.56832 ms at 100 GFLOP/s; its 4.9 MB read: 0.49 ms): compute bound, and the prompts' length counts.
  const wide = { rows: 64, prefillTokens: 100, steps: 2, promptTokens: 6400, kvTokens: 100 };
  const widePrefill = (2e6 * 100 + 2 * 2e5 * 64) / 1e11;
  t.ok(Math.abs(callRoofline(wide, m, lim) - (widePrefill + 1.56832e-3)) < 1e-12, `${callRoofline(wide, m, lim)}`);
  t.ok(callRoofline({ ...wide, promptTokens: 12800 }, m, lim) > callRoofline(wide, m, lim));
  t.equal(
    callRoofline({ ...wide, kvTokens: 6400 }, m, lim),
    callRoofline(wide, m, lim),
    'compute bound: the shared prompt read once or not, the same',
  );
});

t.test("a run's roofline: its calls at the harmonic means of the reads and of the matmul rates around it", async (t) => {
  const m = { layerParams: 1e6, VH: 2e5, bytesPerParam: 4, kvBytesPerToken: 1000, attnFlopsPerToken: 500 };
  // A memory-bound call (2 rows) and a compute-bound one (64 rows), as K 1 and K 24's decodes.
  const calls = [
    { rows: 2, prefill_tokens: 50, steps: 10, prompt_tokens: 60, kv_tokens: 50 },
    { rows: 64, prefill_tokens: 0, steps: 2, prompt_tokens: 0, kv_tokens: 0 },
  ];
  const run = { calls, read_GBps: [10, 30], matmul_GFLOPs: [50, 150] };
  const at = { read: 15, f32: 75 }; // 2 / (1/10 + 1/30), 2 / (1/50 + 1/150)
  const want = calls.reduce(
    (s, c) =>
      s +
      callRoofline(
        { rows: c.rows, prefillTokens: c.prefill_tokens, steps: c.steps, promptTokens: c.prompt_tokens, kvTokens: c.kv_tokens },
        m,
        at,
      ),
    0,
  );
  t.ok(Math.abs(runRoofline(run, m) - want) < 1e-15, `${runRoofline(run, m)} vs ${want}`);
  // The compute-bound call follows the run's own rates: twice the rate, half its time.
  const wide = { calls: [calls[1]], read_GBps: [10, 30] };
  t.ok(
    Math.abs(runRoofline({ ...wide, matmul_GFLOPs: [100, 300] }, m) * 2 - runRoofline({ ...wide, matmul_GFLOPs: [50, 150] }, m)) < 1e-15,
  );
  // ... and the memory-bound steps the run's own reads.
  const narrow = { calls: [{ rows: 2, prefill_tokens: 0, steps: 11, prompt_tokens: 0, kv_tokens: 0 }], matmul_GFLOPs: [50, 150] };
  const prefillOnly = runRoofline({ ...narrow, calls: [{ ...narrow.calls[0], steps: 1 }], read_GBps: [10, 30] }, m);
  // Steps 1-10 read the weights and 2s generated tokens' entries: 10 x 4.8 MB + 1 kB x 2 x 55.
  t.ok(Math.abs(runRoofline({ ...narrow, read_GBps: [10, 30] }, m) - prefillOnly - (10 * 4.8e6 + 1000 * 110) / 15e9) < 1e-15);
});

t.test('K against K 1 rounds: each round its own quotient, flagged when the read moved, the median over the steady ones', async (t) => {
  const rr = (k: number, rollouts: number, per: number, roof: number, reads: number[]): RoundRun => ({
    k,
    rollouts,
    per_rollout_s: per,
    generation_roofline_s: roof,
    read_GBps: reads,
    matmul_GFLOPs: [200, 200],
    calls: [],
  });
  // K 1: 2 rollouts, 1.6 s each, roofline 2.4 s (1.2 per rollout); K 24: 48 rollouts, 0.33 s each,
  // roofline 11.52 s (0.24 per rollout). Measured 0.34 / 1.6 = 0.2125, at the rooflines 0.2: 1.0625.
  const a = kRound('k', rr(1, 2, 1.6, 2.4, [36, 35]), rr(24, 48, 0.34, 11.52, [35, 34]));
  t.equal(a.measured, 0.2125);
  t.equal(a.at_rooflines, 0.2);
  t.equal(a.over_rooflines, 1.0625);
  t.ok(a.steady, 'reads 34-36 GB/s: one memory speed');
  // The same runs with K 1 in the fast mode (55 GB/s): flagged.
  const b = kRound('k1', rr(1, 2, 1.6, 1.6, [55, 56]), rr(24, 48, 0.34, 11.52, [35, 34]));
  t.notOk(b.steady, 'reads 34-56 GB/s: the speed moved');
  t.equal(b.over_rooflines, 0.7083); // 0.2125 / (0.24 / 0.8)
  const c = kRound('k', rr(1, 2, 1.5, 2.4, [36, 36]), rr(24, 48, 0.36, 11.52, [36, 36]));
  const d = kRound('k1', rr(1, 2, 1.6, 2.4, [36, 36]), rr(24, 48, 0.4, 11.52, [36, 35]));
  const s = summarizeKRounds([a, b, c, d]);
  t.equal(s.steady, 3);
  t.same(s.rounds, [a, b, c, d], 'every round kept, the flagged one too');
  // Steady quotients 1.0625, 1.2, 1.25, all at 34-36 GB/s: one speed, the median the middle one; the
  // flagged round's 0.708 left out.
  t.same(s.by_speed, [{ read_GBps: [34, 36], rounds: 3, median: 1.2, min: 1.0625, max: 1.25 }]);
  // Two steady rounds at the fast speed (60-64 GB/s) make a group of their own, whatever their order.
  const e = kRound('k', rr(1, 2, 1.6, 1.2, [62, 60]), rr(24, 48, 0.34, 11.52, [61, 63])); // 0.2125 / 0.4: 0.53125
  const f = kRound('k1', rr(1, 2, 1.6, 1.2, [64, 62]), rr(24, 48, 0.3, 11.52, [63, 64])); // 0.1875 / 0.4: 0.46875
  const two = summarizeKRounds([e, a, f, c, b, d]);
  t.same(two.by_speed, [
    { read_GBps: [34, 36], rounds: 3, median: 1.2, min: 1.0625, max: 1.25 },
    { read_GBps: [60, 64], rounds: 2, median: 0.5, min: f.over_rooflines, max: e.over_rooflines },
  ]);
  // No round at one speed: all of them, one group.
  t.equal(summarizeKRounds([b]).steady, 0);
  t.same(summarizeKRounds([b]).by_speed, [{ read_GBps: [34, 56], rounds: 1, median: 0.708, min: 0.7083, max: 0.7083 }]);
  t.throws(() => summarizeKRounds([]));
});

t.test(
  "slm-train bench rollout --quick: each run's roofline from its calls at the read and the matmul rate measured around it",
  { timeout: 600_000 },
  async (t) => {
    const tmp = t.testdir();
    const model = join(tmp, 'tiny');
    initModel({ preset: 'tiny', out: model, seed: 0 });
    const out = join(tmp, 'bench.json');
    const r = await runCliAsync(['bench', 'rollout', '--quick', '--rounds', '2', '--out', out, '--model', model], {
      env: { SLM_TRAIN_THREADS: '2' },
      timeout: 540_000,
    });
    t.equal(r.code, 0, r.stderr.slice(-3000));
    const rep = JSON.parse(readFileSync(out, 'utf8')).reports.rollout;
    const cfg = JSON.parse(readFileSync(join(model, 'config.json'), 'utf8'));
    const params = rep.machine.params;
    const D = cfg.head_dim;
    const sizes = {
      layerParams: layerMatmulParams(params, cfg),
      VH: cfg.vocab_size * cfg.hidden_size,
      bytesPerParam: 4,
      kvBytesPerToken: cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * D * 4,
      attnFlopsPerToken: cfg.num_hidden_layers * cfg.num_attention_heads * D * 4,
    };
    t.same(rep.machine.roofline_sizes, sizes, 'the rooflines count the KV cache and the attention of this config');
    // K 4 of one question: the first turn's four prompts are one prompt, its tokens distinct once.
    const first = rep.runs[1].calls[0];
    t.equal(first.rows, 4);
    t.ok(first.kv_tokens > 0 && first.kv_tokens * 4 === first.prompt_tokens, `first turn: ${first.kv_tokens} x 4 = ${first.prompt_tokens}`);
    // The next turn: the four episodes share the first turn's prompt, then differ: between one prompt's and four prompts' tokens.
    for (const c of rep.runs[1].calls.slice(1))
      t.ok(
        c.kv_tokens >= first.kv_tokens && (c.rows === 1 || c.kv_tokens < c.prompt_tokens),
        `a later call: ${c.kv_tokens} distinct of ${c.prompt_tokens} (the first turn's ${first.kv_tokens} shared)`,
      );
    t.same(
      rep.runs.map((x: { k: number; unbatched: boolean }) => [x.k, x.unbatched]),
      [
        [1, false],
        [4, false],
        [4, true],
      ],
    );
    for (const run of rep.runs) {
      t.equal(run.read_GBps.length, 2, `K ${run.k}: the reads before and after`);
      t.ok(
        run.read_GBps.every((g: number) => g > 0),
        `K ${run.k}: ${run.read_GBps.join(' / ')} GB/s`,
      );
      t.equal(run.matmul_GFLOPs.length, 2, `K ${run.k}: the matmul rates before and after`);
      t.ok(
        run.matmul_GFLOPs.every((g: number) => g > 0),
        `K ${run.k}: ${run.matmul_GFLOPs.join(' / ')} GFLOP/s`,
      );
      t.equal(run.calls.length, run.generate_calls, 'every generate call in the JSON');
      const want = runRoofline(run, sizes);
      // The JSON's roofline is rounded to 1 ms (computed from the rounded reads and rates it shows).
      t.ok(
        Math.abs(run.split_s.generation_roofline - want) <= 0.0006 + 0.002 * want,
        `K ${run.k}${run.unbatched ? ' unbatched' : ''}: roofline ${run.split_s.generation_roofline} s = its calls at its own read and rate (${want.toFixed(4)})`,
      );
      t.match(
        r.stdout,
        `(${run.split_s.generation_roofline}; ${run.read_GBps.join(' / ')}; ${run.matmul_GFLOPs.join(' / ')}) |`,
        'the table carries the reads and the rates',
      );
    }
    const k1 = rep.runs[0],
      k4 = rep.runs[1];
    const perRoof = (x: typeof k1) => x.split_s.generation_roofline / x.rollouts;
    t.ok(Math.abs(rep.per_rollout_vs_k1.at_rooflines - perRoof(k4) / perRoof(k1)) <= 0.002 + 0.01 * rep.per_rollout_vs_k1.at_rooflines);
    // --rounds 2: two rounds of K 4 against K 1 after the main runs, K 4 first in the first.
    const kr = rep.per_rollout_vs_k1_rounds;
    t.same(
      kr.rounds.map((x: { first: string; k1: RoundRun; k: RoundRun }) => [x.first, x.k1.k, x.k.k]),
      [
        ['k', 1, 4],
        ['k1', 1, 4],
      ],
    );
    for (const round of kr.rounds) {
      for (const x of [round.k1, round.k]) {
        t.ok(x.calls.length > 0 && x.read_GBps.length === 2 && x.matmul_GFLOPs.length === 2, `K ${x.k}: calls, reads and rates`);
        const want = runRoofline({ calls: x.calls, read_GBps: x.read_GBps, matmul_GFLOPs: x.matmul_GFLOPs }, sizes);
        t.ok(
          Math.abs(x.generation_roofline_s - want) <= 0.0001 + 0.002 * want,
          `K ${x.k}: the round's roofline ${x.generation_roofline_s} (${want})`,
        );
      }
      t.same(round, kRound(round.first, round.k1, round.k), 'the round recomputes from its runs');
    }
    t.same(kr, summarizeKRounds(kr.rounds), 'the summary recomputes from the rounds');
    t.match(r.stdout, `median ${kr.by_speed[0].median.toFixed(2)} `, 'the table carries the rounds');
  },
);

t.test('bench rollout --rounds outside 0-50 fails at once with a code, before any benchmark', async (t) => {
  for (const bad of ['-1', '1.5', '51']) {
    const r = await runCliAsync(['bench', 'rollout', '--quick', '--rounds', bad], { timeout: 60_000 });
    t.equal(r.code, 2, `--rounds ${bad}`);
    t.match(r.stderr, new RegExp(`ARGUMENT_INVALID.*--rounds expects an integer from 0 to 50.*found ${bad.replace('.', '\\.')}`));
    t.notMatch(r.stderr, /\[bench\]/, 'no benchmark ran');
  }
});
