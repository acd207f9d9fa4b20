// Continuous batching: one decode loop that rows join while it runs and leave when they finish (a
// server's requests arrive at any time). Rows submitted from any thread wait in an inbox; at the
// top of every iteration the loop takes them as a group (up to max_rows decoding at once), prefills
// the group prefill_chunk positions at a time — one chunk per iteration, so rows already decoding keep
// producing a token every iteration and cancellations are seen between chunks — and, once its prompts are in, merges the group's
// cache into the running batch's: every row's past right-aligned at the batch's last column, the
// columns no live row needs dropped. Each row samples from its own seed's stream with its own
// temperature, top-p and token limit; top-k and the stops belong to the session. A row's tokens are
// those it would get from generate() alone (the same arithmetic up to batch-shape-dependent
// reductions). The loop ends when no row is left and the inbox is empty; submit() then takes none.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/generate.h"
#include "core/qwen3.h"
#include "core/sampler.h"

namespace slm {

struct SessionParams {
  int64_t top_k = 0;
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop_strings;
  int64_t top_n = 0;            // top log-probs per token (0: none)
  int64_t prefill_chunk = 256;  // prompt positions per prefill forward while rows decode (0: a prompt at once)
  int64_t max_rows = 32;        // rows decoding (or being prefilled) at once; the rest wait in the inbox
  int32_t pad_id = 0;
  // Called on the loop's thread after every iteration that sampled a token or ended a row. A row
  // that ends without a token (cancelled) gets an entry with token -1 and Finish::Cancelled.
  std::function<void(StepEvent&&)> on_step;
};

struct RowRequest {
  std::vector<int32_t> prompt;
  int64_t max_new_tokens = 16;
  float temperature = 1.f;  // <= 0: greedy
  float top_p = 1.f;
  uint64_t seed = 0;  // the row's stream, as GenerateParams::row_seeds
};

struct SessionStats {
  int64_t steps = 0;           // decode steps run
  int64_t rows = 0;            // rows admitted
  int64_t joined = 0;          // rows merged into a batch that was already decoding
  int64_t max_batch = 0;       // most rows in one decode step
  int64_t prefill_tokens = 0;  // prompt tokens computed (a group whose rows all left stops between chunks)
  int64_t rebuilds = 0;        // times the batch's cache was rebuilt (joins, compaction, growth)
  double prefill_seconds = 0, decode_seconds = 0;
};

class ContinuousBatch {
 public:
  ContinuousBatch(const Qwen3Model& model, SessionParams p, const Vocab* vocab);
  // Any thread. The rows' ids (0, 1, ... in submit order), all of them or none: empty when the loop
  // has ended (a request's rows are never split between a loop that ended and the next one).
  std::vector<int64_t> submit(std::vector<RowRequest> rows);
  // Any thread: the row ends before its next token (unknown or ended rows: nothing).
  void cancel(int64_t row);
  // Before run(): where each iteration's event goes (SessionParams::on_step).
  void set_on_step(std::function<void(StepEvent&&)> f) { p_.on_step = std::move(f); }
  // The decode loop (one thread); returns when no row is left and none is waiting.
  SessionStats run();

 private:
  struct Row {
    int64_t id;
    RowRequest req;
    RowStream rng;
    int64_t produced = 0;
    std::string tail;        // recent output bytes, for stop strings
    bool cancelled = false;  // ends before its next token
  };
  void take_inbox();
  void prefill_chunk();
  void join_group();
  void decode_step(StepEvent& ev);
  // Rebuilds the batch's cache from the live rows (and the group, when joining), with room for
  // `extra` more columns; returns the kept rows' old indices.
  at::Tensor rebuild(bool with_group, int64_t extra);
  void end_row(StepEvent& ev, const Row& r, int32_t token, float logprob, Finish f);

  const Qwen3Model& model_;
  SessionParams p_;
  StopRule stops_;

  std::mutex mu_;
  std::vector<Row> inbox_;
  std::unordered_set<int64_t> cancelled_;
  int64_t next_id_ = 0;
  bool closed_ = false;

  // The decoding batch: rows_[i] is cache row i; mask_ [B, length] (1: a real position).
  std::vector<Row> rows_;
  std::vector<uint8_t> alive_;
  KVCache cache_;
  at::Tensor mask_, last_pos_, logits_;
  // The group being prefilled: its rows (distinct prompts once each; of_[g]: the prefilled row of
  // group row g), left-padded ids / positions / mask, and the columns done.
  std::vector<Row> group_;
  std::vector<int64_t> of_;
  KVCache gcache_;
  at::Tensor gids_, gpos_, gmask_, glogits_, glast_pos_;
  int64_t gdone_ = 0;
  at::Tensor logits_buf_;
  SessionStats stats_;
};

}  // namespace slm
