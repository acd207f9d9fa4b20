/**
 * What a training run needs to be one rank of a data-parallel job: the process group from the
 * torchrun variables and the config's `distributed` section, the device of this rank, and a run
 * folder that only rank 0 writes (the other ranks get ranks/rank-N for their own files and read
 * checkpoints from the shared run folder when resuming).
 */
import { join } from 'node:path';
import type { ResolvedConfig } from '../config/types.js';
import { SlmError } from '../errors.js';
import type { Model } from '../engine/model.js';
import { RunFolder, loadNewestGood, type TrainState } from '../train/run.js';
import { DataParallel } from './data-parallel.js';
import { ProcessGroup, distEnvFrom } from './group.js';

/** What the trainers see of the job: their rank, and a gather for the metrics of every rank's share. */
export interface Shard {
  rank: number;
  world: number;
  allGather<T>(value: T): Promise<T[]>;
}

export interface Distributed {
  group: ProcessGroup;
  shard: Shard;
  /** The config with this rank's device (cuda -> cuda:LOCAL_RANK). */
  cfg: ResolvedConfig;
}

/** Joins the process group when this process is a rank of a job (WORLD_SIZE > 1); null otherwise. */
export async function joinFromConfig(cfg: ResolvedConfig, log: (line: string) => void): Promise<Distributed | null> {
  const env = distEnvFrom(process.env);
  if (!env) return null;
  const d = cfg.distributed;
  const cuda = cfg.model.device.startsWith('cuda');
  const device = cfg.model.device === 'cuda' ? `cuda:${env.localRank}` : cfg.model.device;
  const backend = d.backend === 'auto' ? (cuda ? 'nccl' : 'gloo') : d.backend;
  if (backend === 'nccl' && !cuda)
    throw new SlmError(
      'CONFIG_INVALID',
      `distributed.backend nccl needs model.device cuda, found ${cfg.model.device}; use gloo (or auto) on CPU.`,
      { path: 'distributed.backend' },
    );
  const group = await ProcessGroup.join(env, {
    backend,
    timeoutS: d.timeout_s,
    python: d.python,
    device: backend === 'nccl' ? device : 'cpu',
    log,
  });
  return { group, shard: group, cfg: { ...cfg, model: { ...cfg.model, device } } };
}

/** Rank 0 trains with the returned model as is; every rank's steps all-reduce their gradients. */
export function makeDataParallel(model: Model, d: Distributed): void {
  model.dataParallel = new DataParallel(d.group);
}

/**
 * The run folder of a rank other than 0: writes nothing in the shared run folder (no metrics, no
 * checkpoints, no config, no trajectories: rank 0 records every rank's); `ranks/rank-N/` is its own
 * folder for whatever a trainer writes there; resuming reads the shared
 * checkpoints that rank 0 wrote.
 */
export class RankRunFolder extends RunFolder {
  private readonly shared: RunFolder;
  constructor(runDir: string, rank: number) {
    super(join(runDir, 'ranks', `rank-${rank}`));
    this.shared = new RunFolder(runDir);
  }
  override writeJson(): void {}
  override writeText(): void {}
  override logMetrics(row: Record<string, unknown>): void {
    this.stopIfDiverged(row);
  }
  override async saveCheckpoint(_model: Model, state: TrainState): Promise<string> {
    return join(this.shared.dir, 'checkpoints', `step-${state.step}`);
  }
  override checkpoints(): ReturnType<RunFolder['checkpoints']> {
    return this.shared.checkpoints();
  }
  override async restore(model: Model): Promise<TrainState> {
    const ck = await loadNewestGood(
      model,
      this.shared.checkpoints(),
      this.log,
      `${this.shared.dir} has no complete checkpoint (rank 0 writes them; several nodes need the run folder on a shared filesystem).`,
    );
    return ck.state;
  }
}
