// Batched generation in one call: left-padded prefill (shared prefixes computed once, see
// GenerateParams::share_prefix), then one decode step per token for all rows with a KV cache. Rows stop on a stop token id, on a stop
// string (checked on the decoded bytes of the row's output, using the vocabulary's byte strings), at their max_new_tokens, or when
// cancelled from another thread. Finished rows are dropped from the batch (and the cache compacted) once a quarter of the batch has
// finished (a cancelled row counts as finished). An optional per-step callback reports each step's tokens as they are sampled (streaming
// servers).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/episode_cache.h"
#include "core/qwen3.h"

namespace slm {

struct Vocab {
  std::vector<std::string> bytes;  // id -> the raw bytes the token decodes to
};

enum class Finish : uint8_t { Length = 0, StopToken = 1, StopString = 2, Cancelled = 3 };

// One decode step: the rows (original indices) that sampled a token in it, with the token, its
// log-prob, its top-n alternatives (n = GenerateParams::top_n, row-major) and whether the row
// finished with it (kRunning: not yet). A cancelled row gets no event; generate's output says so.
struct StepEvent {
  static constexpr uint8_t kRunning = 255;
  std::vector<int32_t> rows, tokens;
  std::vector<float> logprobs;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
  std::vector<uint8_t> finish;
};

// A call's stop token ids and stop strings, checked on each sampled token of a row.
class StopRule {
 public:
  StopRule(const std::vector<int32_t>& ids, const std::vector<std::string>& strings, const Vocab* vocab);
  // StepEvent::kRunning, or the Finish (as uint8_t) that `token` ends its row with; `tail` holds the
  // row's recent output bytes (kept short here).
  uint8_t check(int32_t token, std::string& tail) const;

 private:
  std::unordered_set<int32_t> ids_;
  std::vector<std::string> strings_;
  size_t longest_ = 0;
  const Vocab* vocab_;
};

struct GenerateParams {
  std::vector<std::vector<int32_t>> prompts;
  int64_t max_new_tokens = 64;
  // Per row (empty: every row max_new_tokens): a row stops with Finish::Length after this many tokens.
  std::vector<int64_t> row_max_new_tokens;
  std::vector<float> temperature;  // per row; <= 0 = greedy
  int64_t top_k = 0;
  double top_p = 1.0;
  // Per row (empty: every row top_p): nucleus mass of each row, in (0, 1].
  std::vector<float> row_top_p;
  uint64_t seed = 0;
  // One seed per row (empty: rows are seeded from (seed, row index)); see RowRng.
  std::vector<uint64_t> row_seeds;
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop_strings;
  int32_t pad_id = 0;
  // The top_n most likely tokens and their log-probs at every step (0: none), under the same
  // distribution as `logprobs` (softmax(logits / T), T = 1 for greedy rows).
  int64_t top_n = 0;
  // One flag per row, set from any thread: the row stops before its next token (Finish::Cancelled).
  const std::atomic<uint8_t>* cancel = nullptr;
  // Called on the generating thread after every decode step with that step's tokens.
  std::function<void(StepEvent&&)> on_step;
  // Shared prefixes: rows with identical prompts are prefilled once (their cache rows and last
  // logits copied to every such row), and the longest prefix common to all distinct prompts (e.g.
  // the system prompt) is prefilled once at batch 1 before the rest of each prompt. Each row still
  // samples with its own random stream. false: every row prefills its whole prompt (the old path).
  bool share_prefix = true;
  // Chunked prefill: a new prompt is run through the model `prefill_chunk` positions at a time (0:
  // in one forward), and between chunks a call whose every row has been cancelled stops (each row
  // Finish::Cancelled, no token). The episode-cache path (rows continuing a cached past) runs whole.
  int64_t prefill_chunk = 0;
  // Multi-turn KV-cache reuse (core/episode_cache.h): with a store, a row with a key (non-empty
  // cache_keys[b]; empty vector: no row has one) reuses the longest prefix its stored cache shares
  // with its prompt (at least one prompt token is always computed: it gives the first logits), and
  // its KV (prompt + generated tokens) is put back under the key when the row is done. Keys must be
  // distinct within a call. Rows that reuse a cache are not deduplicated or prefix-shared.
  EpisodeCacheStore* episode_cache = nullptr;
  std::vector<std::string> cache_keys;
};

struct GenerateOutput {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> logprobs;
  // With top_n > 0: per row, top_n ids / log-probs per generated token (row-major).
  std::vector<std::vector<int32_t>> top_ids;
  std::vector<std::vector<float>> top_logprobs;
  std::vector<Finish> finish;
  int64_t steps = 0;                     // decode steps run
  double prefill_seconds = 0;            // time of the prefill forward
  double decode_seconds = 0;             // time of all decode steps
  int64_t prefill_tokens = 0;            // prompt tokens run through the model (padding excluded)
  int64_t prefill_tokens_requested = 0;  // the sum of the prompts' lengths
  int64_t cache_reused_tokens = 0;       // prompt tokens taken from episode caches (not computed)
  int64_t cache_hits = 0;                // rows that reused an episode cache
  int64_t cache_evicted = 0;             // episode caches evicted by the store's limit during the call
  int64_t cache_stale = 0;               // keyed rows whose cache was dropped (the weights changed)
};

GenerateOutput generate(const Qwen3Model& model, const GenerateParams& p, const Vocab* vocab);

}  // namespace slm
