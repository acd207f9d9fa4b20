// PPO's toy two-turn task (test/ppo.test.ts, test/ppo-critic.test.ts): the model writes 3 tokens, the
// "environment" appends 3 tokens (loss mask 0, like a tool output or retrieved passages), the model
// writes 3 more. Reward = the share of generated tokens that are "good" (ids 0-7).
import type { Model } from '../../lib/engine/model.js';
import type { RolloutRequest, TrainEpisode } from '../../lib/train/types.js';

export type Q = { id: number; prompt: number[] };
export const questions: Q[] = Array.from({ length: 8 }, (_, i) => ({
  id: i,
  prompt: Array.from({ length: 6 }, (_, k) => ((i * 13 + k * 7) % 50) + 10),
}));
export const ENV = [60, 61, 62];

/** Two generation turns with environment text between them (no sandbox: the engine directly). */
export function twoTurn(model: Model, g = 3) {
  return async (reqs: RolloutRequest<Q>[]): Promise<TrainEpisode[]> => {
    const temperature = reqs.map((r) => r.temperature);
    const a = await model.generate({
      prompts: reqs.map((r) => Int32Array.from(r.question.prompt)),
      maxNewTokens: g,
      temperature,
      seed: reqs[0].seed,
    });
    const mid = reqs.map((r, i) => [...r.question.prompt, ...a.tokens[i], ...ENV]);
    const b = await model.generate({ prompts: mid.map((p) => Int32Array.from(p)), maxNewTokens: g, temperature, seed: reqs[0].seed + 1 });
    return reqs.map((r, i) => {
      const P = r.question.prompt.length;
      const ids = Int32Array.from([...mid[i], ...b.tokens[i]]);
      const lossMask = new Uint8Array(ids.length);
      const logprobs = new Float32Array(ids.length);
      lossMask.fill(1, P, P + a.tokens[i].length);
      logprobs.set(a.logprobs[i], P);
      lossMask.fill(1, mid[i].length);
      logprobs.set(b.logprobs[i], mid[i].length);
      return {
        ids,
        lossMask,
        logprobs,
        temperature: r.temperature,
        answer: null,
        turns: 2,
        record: { completion: Array.from(ids.slice(P)) },
      };
    });
  };
}
export const reward = async (ep: TrainEpisode) => {
  const gen = Array.from(ep.ids).filter((_, k) => ep.lossMask[k]);
  const share = gen.filter((x) => x < 8).length / Math.max(1, gen.length);
  return { total: share, parts: { good: share } };
};
