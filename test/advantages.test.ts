// Advantages (lib/train/rl/advantages.ts: group and token level; lib/train/rl/gae.ts: PPO) against numbers
// computed by hand (worked out in the comments).
import t, { type Test } from 'tap';
import {
  episodeTokenAdvantages,
  turnCounts,
  groupAdvantage,
  groupAdvantageFn,
  grpoAdvantages,
  turnSpans,
} from '../lib/train/rl/advantages.js';
import { gae, klEstimate, maskedWhiten, ppoAdvantages, tokenRewards } from '../lib/train/rl/gae.js';

const close = (t: Test, got: ArrayLike<number | null>, want: Array<number | null>, msg: string, tol = 1e-5) => {
  t.equal(got.length, want.length, `${msg}: length`);
  for (let i = 0; i < want.length; i++) {
    const g = got[i];
    const w = want[i];
    if (w === null || g === null) t.equal(g, w, `${msg}[${i}]`);
    else t.ok(Math.abs(g - w) <= tol, `${msg}[${i}]: ${g} vs ${w}`);
  }
};

t.test('GRPO: (r - mean) / (std + eps), sample and population std', async (t) => {
  // r = [0.75, 0.25, 0, 1]: mean 0.5, deviations [0.25, -0.25, -0.5, 0.5], squares sum 0.625.
  // sample std = sqrt(0.625 / 3) = 0.4564355; population std = sqrt(0.625 / 4) = 0.3952847.
  const r = [0.75, 0.25, 0, 1];
  const s = groupAdvantage(r, { eps: 0 });
  t.equal(s.rule, 'normalized');
  t.ok(Math.abs(s.mean - 0.5) < 1e-12);
  t.ok(Math.abs(s.std - 0.4564355) < 1e-7);
  close(t, s.advantages!, [0.5477226, -0.5477226, -1.0954451, 1.0954451], 'sample std');
  const p = groupAdvantage(r, { eps: 0, stdEstimator: 'population' });
  close(t, p.advantages!, [0.6324555, -0.6324555, -1.2649111, 1.2649111], 'population std');
  // Default eps 1e-4 (TRL): 0.25 / (0.4564355 + 0.0001) = 0.5476026.
  close(t, groupAdvantage(r).advantages!, [0.5476026, -0.5476026, -1.0952052, 1.0952052], 'eps 1e-4');
  // Binary rewards [1, 0, 0, 1]: sample std sqrt(1/3) = 0.5773503 -> +-0.8660254; population -> +-1.
  close(t, groupAdvantage([1, 0, 0, 1], { eps: 0 }).advantages!, [0.8660254, -0.8660254, -0.8660254, 0.8660254], 'binary, sample');
  close(t, groupAdvantage([1, 0, 0, 1], { eps: 0, stdEstimator: 'population' }).advantages!, [1, -1, -1, 1], 'binary, population');
});

t.test('Dr.GRPO: r - mean, no std division', async (t) => {
  close(t, groupAdvantage([0.75, 0.25, 0, 1], { std: 'none' }).advantages!, [0.25, -0.25, -0.5, 0.5], 'Dr.GRPO');
  close(t, groupAdvantage([1, 0, 0, 0], { std: 'none' }).advantages!, [0.75, -0.25, -0.25, -0.25], 'Dr.GRPO binary');
  // The fallbacks apply to Dr.GRPO too.
  t.equal(groupAdvantage([0, 0, 0], { std: 'none' }).reason, 'all_failed');
  close(t, groupAdvantage([1, 1], { std: 'none' }).advantages!, [0.5, 0.5], 'Dr.GRPO all succeed');
});

t.test("fallbacks, the reference's rule: flat (std < 0.01) and mean < 0.1 skipped, flat otherwise r - 0.5, else normalized", async (t) => {
  // The reference (population std): std < 0.01 -> mean < 0.1 ? skip : r - 0.5; else (r - mean) / (std + 1e-8).
  const ref = { stdEstimator: 'population', eps: 1e-8 } as const;
  const f = groupAdvantage([0, 0, 0, 0], ref);
  t.same([f.advantages, f.rule, f.reason, f.successes], [null, 'skipped', 'all_failed', 0]);
  // Every rollout wrong, all scored -1 (sign-magnitude, approach 0): flat, mean -1 < 0.1 -> skipped.
  t.equal(groupAdvantage([-1, -1, -1], ref).reason, 'all_failed');
  // Every rollout wrong but with different approach scores: not flat -> normalized (the reference learns
  // from the better wrong answers). r = [-0.9, -0.5, -0.7]: mean -0.7, population std sqrt(0.08 / 3) = 0.1632993.
  const w = groupAdvantage([-0.9, -0.5, -0.7], ref);
  t.equal(w.rule, 'normalized');
  close(t, w.advantages!, [-1.2247449, 1.2247449, 0], 'all wrong, spread');
  // A near-tie (spread 0.0025: population std 0.0011785) counts as flat: mean 0.80125 >= 0.1 -> r - 0.5,
  // not the +-1.2 a division by a tiny std would give.
  close(t, groupAdvantage([0.8, 0.8025, 0.8, 0.8025], ref).advantages!, [0.3, 0.3025, 0.3, 0.3025], 'near-tie centred');
  // Flat below 0.1 but not zero (e.g. a small format reward for everyone): still skipped.
  t.equal(groupAdvantage([0.05, 0.05], ref).reason, 'all_failed');
  // Flat at exactly 0.1: centred (0.1 - 0.5 = -0.4).
  close(t, groupAdvantage([0.1, 0.1], ref).advantages!, [-0.4, -0.4], 'flat at 0.1');
  // The thresholds are options.
  t.equal(groupAdvantage([0.8, 0.81], { ...ref, flatStd: 0.001 }).rule, 'normalized');
  t.equal(groupAdvantage([0.3, 0.3], { ...ref, flatSkipBelow: 0.5 }).reason, 'all_failed');
  // Opt-in, not the reference: allFailed 'skip' skips a group without a success whatever its spread.
  // Failure is reward <= failAtOrBelow (0 by default), or the correctness flag when given.
  t.equal(groupAdvantage([-0.1, 0, -0.2], { allFailed: 'skip' }).reason, 'all_failed');
  t.equal(groupAdvantage([-0.1, 0, -0.2]).rule, 'normalized', 'by default the spread is learned from');
  t.equal(groupAdvantage([0.25, 0.1, 0.2], { allFailed: 'skip', failAtOrBelow: 0.25 }).reason, 'all_failed');
  t.equal(groupAdvantage([0.25, 0.1, 0.9], { allFailed: 'skip', failAtOrBelow: 0.25 }).rule, 'normalized');
  t.equal(groupAdvantage([0.2, 0.1, 0.15], { allFailed: 'skip' }, [false, false, false]).reason, 'all_failed');
  t.equal(groupAdvantage([0.2, 0.1, 0.15], { allFailed: 'skip' }, [false, true, false]).rule, 'normalized');
  const n = groupAdvantage([-1, 0], { eps: 0 });
  close(t, n.advantages!, [-Math.SQRT1_2, Math.SQRT1_2], 'all failed, normalized'); // sample std of [-1, 0] = 0.7071068
  // Flat and successful: r - 0.5.
  const c = groupAdvantage([1, 1, 1, 1]);
  t.equal(c.rule, 'centered');
  close(t, c.advantages!, [0.5, 0.5, 0.5, 0.5], 'all 1');
  close(t, groupAdvantage([0.8, 0.8, 0.8]).advantages!, [0.3, 0.3, 0.3], 'all 0.8');
  close(t, groupAdvantage([0.3, 0.3]).advantages!, [-0.2, -0.2], 'all 0.3 (a success below the centre is pushed down)');
  close(t, groupAdvantage([1, 1], { center: 0.25 }).advantages!, [0.75, 0.75], 'centre 0.25');
  t.equal(groupAdvantage([1, 1], { zeroVariance: 'skip' }).reason, 'zero_variance');
  const z = groupAdvantage([1, 1], { zeroVariance: 'zero' });
  t.same([z.rule, z.advantages], ['zero', [0, 0]]);
  // A non-finite reward skips the group rather than guessing.
  t.equal(groupAdvantage([1, NaN, 0]).reason, 'non_finite_reward');
  // A single rollout: no sample std, so it is flat; it succeeds -> centred.
  close(t, groupAdvantage([1]).advantages!, [0.5], 'single rollout');
  t.throws(() => groupAdvantage([1, 0], { flatStd: -1 }), { code: 'ARGUMENT_INVALID' });
});

t.test('a batch of groups: per-episode scalars and which groups were skipped', async (t) => {
  // group 0 [1, 0]: sample std 0.7071068 -> +-0.7071068 (eps 0); group 1 all failed; group 2 all succeed.
  const b = grpoAdvantages([1, 0, 0, 0, 1, 1], 2, { eps: 0 });
  close(t, b.advantages, [Math.SQRT1_2, -Math.SQRT1_2, null, null, 0.5, 0.5], 'batch');
  t.same(b.skipped, [{ group: 1, reason: 'all_failed' }]);
  t.same(
    b.groups.map((g) => [g.group, g.start, g.size, g.rule, g.successes]),
    [
      [0, 0, 2, 'normalized', 1],
      [1, 2, 2, 'skipped', 0],
      [2, 4, 2, 'centered', 2],
    ],
  );
  t.same(grpoAdvantages([0.5, 0.5, 0.5, 0.5], 2, { allFailed: 'skip' }, [true, true, false, false]).skipped, [
    { group: 1, reason: 'all_failed' },
  ]);
  t.throws(() => grpoAdvantages([1, 0, 1], 2), { code: 'ARGUMENT_INVALID', message: /multiple of 2/ });
  t.throws(() => grpoAdvantages([1, 0], 0), { code: 'ARGUMENT_INVALID' });
  t.throws(() => grpoAdvantages([1, 0], 2, {}, [true]), { code: 'ARGUMENT_INVALID' });
  t.throws(() => groupAdvantage([]), { code: 'ARGUMENT_INVALID' });
  t.throws(() => groupAdvantage([1, 0], {}, [true]), { code: 'ARGUMENT_INVALID' });
  t.throws(() => groupAdvantage([1, 0], { std: 'batch' as never }), { code: 'ARGUMENT_INVALID', message: /"batch"/ });
  t.throws(() => groupAdvantage([1, 0], { stdEstimator: 'x' as never }), { code: 'ARGUMENT_INVALID' });
  t.throws(() => groupAdvantage([1, 0], { eps: -1 }), { code: 'ARGUMENT_INVALID' });
  // The trainer's per-group function.
  const fn = groupAdvantageFn({ std: 'none' });
  t.same(fn([1, 0]), { advantages: [0.5, -0.5] });
  t.same(fn([0, 0]), { advantages: null, reason: 'all_failed' });
  t.same(groupAdvantageFn({ allFailed: 'skip' })([0.5, 0.5], [false, false]), { advantages: null, reason: 'all_failed' });
  t.same(fn([0.5, 0.5], [false, false]), { advantages: [0, 0] }, 'flat at 0.5 with std none: r - 0.5');
});

t.test('token-level broadcasting over the loss mask (episodeTokenAdvantages, no discount)', async (t) => {
  const m = Uint8Array.from([0, 0, 1, 1, 0, 1]);
  const b = episodeTokenAdvantages([-0.5, 2], [m, Uint8Array.from([0, 1])]);
  t.same(Array.from(b[0]), [0, 0, -0.5, -0.5, 0, -0.5]);
  t.same(Array.from(b[1]), [0, 2]);
  t.type(b[0], Float32Array);
  // Per-sequence loss (loss_norm sequence) spreads the same values: the weights are the native loss's.
  t.same(Array.from(episodeTokenAdvantages([-0.5], [m], { norm: 'sequence' })[0]), [0, 0, -0.5, -0.5, 0, -0.5]);
});

t.test('a batch of groups with a per-group rule, partial correctness flags and excluded members', async (t) => {
  const seen: Array<[number[], boolean[] | undefined]> = [];
  const rule = (r: number[], s?: boolean[]) => {
    seen.push([r, s]);
    return r.length < 2 ? { advantages: null } : { advantages: r.map((x) => x * 10) };
  };
  // Groups of 3: [1, 2, 3] with member 1 excluded; [4, 5, 6] all excluded; [7, 8, 9] none.
  const b = grpoAdvantages(
    [1, 2, 3, 4, 5, 6, 7, 8, 9],
    3,
    rule,
    [true, undefined, undefined, undefined, undefined, undefined, undefined, undefined, undefined],
    [false, true, false, true, true, true, false, false, false],
  );
  close(t, b.advantages, [10, null, 30, null, null, null, 70, 80, 90], 'advantages');
  // Group 0 has one flag (member 0): the other member counts as not successful. Group 2 has none: no flags.
  t.same(seen, [
    [
      [1, 3],
      [true, false],
    ],
    [[7, 8, 9], undefined],
  ]);
  t.same(b.skipped, [{ group: 1, reason: 'all_excluded' }]);
  // A rule giving no advantages without a reason: skipped, reason 'skipped'.
  t.same(grpoAdvantages([1, 2, 3, 4], 2, rule, undefined, [true, false, false, false]).skipped, [{ group: 0, reason: 'skipped' }]);
  t.throws(() => grpoAdvantages([1, 2], 2, rule, undefined, [true]), { code: 'ARGUMENT_INVALID', message: /exclusion flags/ });
});

t.test('KL estimators', async (t) => {
  // d = logp - ref = 0.3: k1 0.3; k2 0.045; k3 = exp(-0.3) + 0.3 - 1 = 0.7408182 - 0.7 = 0.0408182.
  t.ok(Math.abs(klEstimate(-1.2, -1.5, 'k1') - 0.3) < 1e-12);
  t.ok(Math.abs(klEstimate(-1.2, -1.5, 'k2') - 0.045) < 1e-12);
  t.ok(Math.abs(klEstimate(-1.2, -1.5, 'k3') - 0.0408182) < 1e-7);
  t.equal(klEstimate(0, -50, 'k3'), 10, 'k3 clamped at 10');
  t.throws(() => klEstimate(0, 0, 'k4' as never), { code: 'ARGUMENT_INVALID' });
});

// The 5-token example. Positions 0-1 are the prompt (mask 0); the response is positions 2-6 with a
// tool-output token at position 4 (mask 0):
//   mask        [0,    0,    1,    1,    0,    1,    1  ]
//   logp - ref  [-,    -,    0.2, -0.1,  0.5,  0.3,  0.0]   (position 4 is ignored)
//   values      [7,    7,    0.5,  0.4,  9.9,  0.6,  0.7]   (7 and 9.9 must not enter)
// kl_coef 0.1, k1, score 1 on the last trained token (6):
//   rewards     [0,    0,   -0.02, 0.01, 0,   -0.03, 1.0]
const mask = Uint8Array.from([0, 0, 1, 1, 0, 1, 1]);
const logprobs = Float32Array.from([0, 0, -1.0, -2.0, -0.5, -0.7, -0.4]);
const refLogprobs = Float32Array.from([0, 0, -1.2, -1.9, -1.0, -1.0, -0.4]);
const values = Float32Array.from([7, 7, 0.5, 0.4, 9.9, 0.6, 0.7]);

t.test('PPO token rewards: KL penalty on trained tokens, score on the last one', async (t) => {
  const r = tokenRewards({ mask, score: 1, logprobs, refLogprobs }, 0.1, 'k1');
  close(t, r.rewards, [0, 0, -0.02, 0.01, 0, -0.03, 1.0], 'rewards');
  close(t, r.kl, [0, 0, 0.2, -0.1, 0, 0.3, 0], 'kl');
  t.equal(r.lastTrained, 6);
  // Without KL no log-probs are needed.
  close(t, tokenRewards({ mask, score: 0.5 }).rewards, [0, 0, 0, 0, 0, 0, 0.5], 'no KL');
  const none = tokenRewards({ mask: new Uint8Array(3), score: 1 });
  t.equal(none.lastTrained, -1);
  t.throws(() => tokenRewards({ mask, score: 1 }, 0.1), { code: 'ARGUMENT_INVALID', message: /refLogprobs/ });
  t.throws(() => tokenRewards({ mask, score: 1, logprobs: new Float32Array(2), refLogprobs }, 0.1), { code: 'ARGUMENT_INVALID' });
});

t.test('GAE over trained tokens only, against a hand computation', async (t) => {
  const rewards = Float32Array.from([0, 0, -0.02, 0.01, 0, -0.03, 1.0]);
  // gamma 0.9, lam 0.8 (gamma * lam = 0.72), walking back over the trained tokens 6, 5, 3, 2:
  //   t=6: delta = 1.0 + 0.9*0     - 0.7 = 0.3      A = 0.3
  //   t=5: delta = -0.03 + 0.9*0.7 - 0.6 = 0.0      A = 0.0 + 0.72*0.3      = 0.216
  //   (t=4 skipped: its value 9.9 and reward never enter)
  //   t=3: delta = 0.01 + 0.9*0.6  - 0.4 = 0.15     A = 0.15 + 0.72*0.216   = 0.30552
  //   t=2: delta = -0.02 + 0.9*0.4 - 0.5 = -0.16    A = -0.16 + 0.72*0.30552 = 0.0599744
  //   returns = A + V: [0.5599744, 0.70552, -, 0.816, 1.0]
  const g = gae(rewards, values, mask, 0.9, 0.8);
  close(t, g.advantages, [0, 0, 0.0599744, 0.30552, 0, 0.216, 0.3], 'advantages');
  close(t, g.returns, [0, 0, 0.5599744, 0.70552, 0, 0.816, 1.0], 'returns');
  // gamma = lam = 1 (Search-R1): A_t = (sum of rewards from t on) - V_t.
  //   t=6: 1 - 0.7 = 0.3; t=5: 0.97 - 0.6 = 0.37; t=3: 0.98 - 0.4 = 0.58; t=2: 0.96 - 0.5 = 0.46
  const g1 = gae(rewards, values, mask, 1, 1);
  close(t, g1.advantages, [0, 0, 0.46, 0.58, 0, 0.37, 0.3], 'gamma=lam=1 advantages');
  close(t, g1.returns, [0, 0, 0.96, 0.98, 0, 0.97, 1.0], 'gamma=lam=1 returns');
  // lam = 0: one-step TD errors.
  close(t, gae(rewards, values, mask, 0.9, 0).advantages, [0, 0, -0.16, 0.15, 0, 0, 0.3], 'lam=0');
  t.throws(() => gae(rewards, values, new Uint8Array(3), 1, 1), { code: 'ARGUMENT_INVALID' });
});

t.test('masked whitening over the batch (verl masked_whiten)', async (t) => {
  // Trained advantages of the gamma=lam=1 example: [0.46, 0.58, 0.37, 0.3]; mean 0.4275;
  // squared deviations 0.00105625 + 0.02325625 + 0.00330625 + 0.01625625 = 0.043875;
  // unbiased var 0.014625, sqrt(var + 1e-8) = 0.1209339; whitened = (x - 0.4275) / 0.1209339
  // = [0.0325, 0.1525, -0.0575, -0.1275] / 0.1209339.
  const a = Float32Array.from([0, 0, 0.46, 0.58, 0, 0.37, 0.3]);
  const w = maskedWhiten([a], [mask]);
  close(t, w[0], [0, 0, 0.2687418, 1.2610194, 0, -0.4754663, -1.0542949], 'whitened');
  // Across two episodes the statistics are pooled: splitting the same tokens gives the same numbers.
  const w2 = maskedWhiten(
    [Float32Array.from([0.46, 0.58]), Float32Array.from([0.37, 0.3, 5])],
    [Uint8Array.from([1, 1]), Uint8Array.from([1, 1, 0])],
  );
  close(t, [...w2[0], ...w2[1]], [0.2687418, 1.2610194, -0.4754663, -1.0542949, 0], 'pooled');
  close(t, maskedWhiten([a], [mask], { shiftMean: false })[0], [0, 0, 0.6962418, 1.6885194, 0, -0.0479663, -0.6267949], 'mean kept');
  close(t, maskedWhiten([Float32Array.from([3])], [Uint8Array.from([1])])[0], [3], 'one token: unchanged');
  t.throws(() => maskedWhiten([a], []), { code: 'ARGUMENT_INVALID' });
  t.throws(() => maskedWhiten([a], [Uint8Array.from([1])]), { code: 'ARGUMENT_INVALID' });
});

t.test('ppoAdvantages: token rewards -> GAE -> whitening', async (t) => {
  const ep = { mask, score: 1, logprobs, refLogprobs, values };
  const raw = ppoAdvantages([ep], { gamma: 1, lam: 1, klCoef: 0.1, klEstimator: 'k1', whiten: false });
  close(t, raw.rewards[0], [0, 0, -0.02, 0.01, 0, -0.03, 1.0], 'rewards');
  close(t, raw.advantages[0], [0, 0, 0.46, 0.58, 0, 0.37, 0.3], 'advantages');
  close(t, raw.returns[0], [0, 0, 0.96, 0.98, 0, 0.97, 1.0], 'returns');
  t.ok(Math.abs(raw.klMean - 0.1) < 1e-6, 'mean KL (0.2 - 0.1 + 0.3 + 0) / 4 = 0.1');
  const wh = ppoAdvantages([ep], { gamma: 1, lam: 1, klCoef: 0.1 });
  close(t, wh.advantages[0], [0, 0, 0.2687418, 1.2610194, 0, -0.4754663, -1.0542949], 'whitened advantages');
  close(t, wh.returns[0], [0, 0, 0.96, 0.98, 0, 0.97, 1.0], 'returns are not whitened');
  const withEmpty = ppoAdvantages([ep, { mask: new Uint8Array(2), score: 1, values: new Float32Array(2) }], { klCoef: 0, whiten: false });
  t.same(withEmpty.empty, [1]);
  t.throws(() => ppoAdvantages([ep], { gamma: 1.5 }), { code: 'ARGUMENT_INVALID' });
});

t.test('per-turn advantages: turn discount and the reference per-turn mean', async (t) => {
  t.same(turnSpans([0, 1, 1, 0, 0, 1, 0, 1, 1, 1]), [
    [1, 3],
    [5, 6],
    [7, 10],
  ]);
  t.same(turnSpans([0, 0]), []);
  // Episode A: turns of 2 and 3 tokens (n 5); episode B: one turn of 4 tokens (n 4). S = 2, P = 3.
  const a = Uint8Array.from([0, 1, 1, 0, 0, 1, 1, 1]);
  const b = Uint8Array.from([0, 0, 1, 1, 1, 1]);
  // Token level, no discount: the scalar on every trained token.
  const tok = episodeTokenAdvantages([2, -1], [a, b]);
  t.same(Array.from(tok[0]), [0, 2, 2, 0, 0, 2, 2, 2]);
  t.same(Array.from(tok[1]), [0, 0, -1, -1, -1, -1]);
  // Discount 0.5: the first of A's two turns carries 2 * 0.5 = 1; B's only turn is its last.
  const disc = episodeTokenAdvantages([2, -1], [a, b], { turnDiscount: 0.5 });
  t.same(Array.from(disc[0]), [0, 1, 1, 0, 0, 2, 2, 2]);
  t.same(Array.from(disc[1]), [0, 0, -1, -1, -1, -1]);
  // Per turn: factor S n_i / (P m_ij): A's first turn 2*5/(3*2) = 5/3, second 2*5/(3*3) = 10/9; B 2*4/(3*4) = 2/3.
  // With the native per-sequence weight 1/(S n_i) a token of turn j then weighs 1/(P m_ij): check
  // that weight x advantage = A / (P m_ij) for each turn.
  const turn = episodeTokenAdvantages([2, -1], [a, b], { norm: 'turn' });
  close(t, Array.from(turn[0]), [0, 10 / 3, 10 / 3, 0, 0, 20 / 9, 20 / 9, 20 / 9], 'episode A per turn');
  close(t, Array.from(turn[1]), [0, 0, -2 / 3, -2 / 3, -2 / 3, -2 / 3], 'episode B per turn');
  const w = (n: number) => 1 / (2 * n);
  close(
    t,
    [turn[0][1] * w(5), turn[0][5] * w(5), turn[1][2] * w(4)],
    [2 / (3 * 2), 2 / (3 * 3), -1 / (3 * 4)],
    'effective per-token weight = A / (P m)',
  );
  // Data-parallel ranks: A on one rank, B on another, each given the global counts (S 2, P 3 = the
  // sums of turnCounts over the ranks), give the whole batch's advantages.
  t.same(turnCounts([a]), { sequences: 1, pairs: 2 });
  t.same(turnCounts([b, new Uint8Array(3)]), { sequences: 1, pairs: 1 });
  const totals = { sequences: 2, pairs: 3 };
  close(t, Array.from(episodeTokenAdvantages([2], [a], { norm: 'turn', totals })[0]), Array.from(turn[0]), 'rank 0 alone, global counts');
  close(t, Array.from(episodeTokenAdvantages([-1], [b], { norm: 'turn', totals })[0]), Array.from(turn[1]), 'rank 1 alone, global counts');
  t.notSame(Array.from(episodeTokenAdvantages([2], [a], { norm: 'turn' })[0]), Array.from(turn[0]), 'local counts alone would differ');
  // Token 0 is never a target, even when its mask says 1.
  t.same(Array.from(episodeTokenAdvantages([1], [Uint8Array.from([1, 1, 0])])[0]), [0, 1, 0]);
  t.throws(() => episodeTokenAdvantages([1], []), { code: 'ARGUMENT_INVALID' });
  t.throws(() => episodeTokenAdvantages([1], [a], { turnDiscount: 2 }), { code: 'ARGUMENT_INVALID' });
});
