/** Every benchmark module (bench/<kind>.ts) exports `runBench(opts): Promise<BenchReport>`. */
export interface BenchOptions {
  /** Smaller sizes and fewer repetitions, so that `slm-train bench --quick` stays under 2 minutes. */
  quick?: boolean;
  /** A model folder to use instead of the generated preset (where the benchmark uses a model). */
  model?: string;
  /**
   * rollout: also measure, in the same run and beside each K, the old generate path (sharePrefix
   * false and no multi-turn cache reuse: every row prefills its whole conversation every turn).
   */
  compareUnshared?: boolean;
  /**
   * rollout: rounds of the largest K against K 1 back to back, alternating which goes first, after
   * the main runs; serve: rounds of 16 clients, each beside the batch-16 decode measured just before
   * and after it; engine: rounds of the batch-16 decode in float32 and bfloat16 (default 3; --quick
   * 1; 0: none).
   */
  rounds?: number;
  /** recall: the folder holding wiki-excerpts/ and wiki-trivia/ (default $SLM_SHARED_DIR/data, else ../shared/data). */
  data?: string;
  /**
   * engine: the folder of a llama.cpp build from source holding llama-bench and llama-batched-bench
   * (default $SLM_TRAIN_LLAMA_CPP_BIN); its rows are skipped, saying why, when neither is given.
   */
  llamaCppBin?: string;
  /** Print progress lines to stderr. */
  log?: (line: string) => void;
}
export interface BenchReport {
  kind: string;
  /** Machine-readable figures; every speed figure sits next to the limit measured in the same run. */
  results: Record<string, unknown>;
  /** A markdown table for people. */
  table: string;
}
