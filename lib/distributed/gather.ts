/**
 * The metrics of a data-parallel step cover every rank's rollouts: each rank sends what the metrics
 * row needs of its episodes (lengths, trained-token counts, answers, turns, tool records) and
 * rewards, and every rank gets them all back in rank order (= the order of the global batch); the
 * trajectory lines travel too, so that rank 0's trajectories.jsonl holds every episode, and so does
 * the algorithm's own share of the row's statistics (`shared`: JSON), one per rank.
 */
import type { TrainEpisode } from '../episodes/runner-types.js';
import type { RewardResult } from '../rewards/types.js';
import type { Shard } from './run.js';

interface Lite {
  n: number;
  g: number;
  answer: string | null;
  turns: number;
  temperature: number;
  record?: { steps?: unknown; calls?: unknown };
}

export async function gatherRollouts<S>(
  shard: Shard,
  episodes: readonly TrainEpisode[],
  rewards: readonly RewardResult[],
  lines: string[],
  shared: S,
): Promise<{ episodes: TrainEpisode[]; rewards: RewardResult[]; lines: string[]; shared: S[] }> {
  const mine = {
    eps: episodes.map(
      (e): Lite => ({
        n: e.ids.length,
        g: e.lossMask.reduce((a, b) => a + (b ? 1 : 0), 0),
        answer: e.answer,
        turns: e.turns,
        temperature: e.temperature,
        record: e.record ? { steps: e.record.steps, calls: e.record.calls } : undefined,
      }),
    ),
    rewards,
    lines,
    shared,
  };
  const all = await shard.allGather(mine);
  return {
    episodes: all.flatMap((r) =>
      r.eps.map(
        (e): TrainEpisode => ({
          ids: new Int32Array(e.n),
          lossMask: new Uint8Array(e.n).fill(1, 0, e.g),
          logprobs: new Float32Array(0),
          answer: e.answer,
          turns: e.turns,
          temperature: e.temperature,
          record: e.record as Record<string, unknown> | undefined,
        }),
      ),
    ),
    rewards: all.flatMap((r) => r.rewards as RewardResult[]),
    lines: all.flatMap((r) => r.lines),
    shared: all.map((r) => r.shared),
  };
}
