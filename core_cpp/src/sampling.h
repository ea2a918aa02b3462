// Per-position statistics and token sampling over the vocabulary, for the positions a step may
// commit. Rows are independent and processed in parallel (OpenMP).
#pragma once

#include <cstdint>
#include <vector>

namespace diffuse {

struct SampleConfig {
    float temperature = 0.0f;
    int   top_k = 0;            // Dream-style filtering (0: off)
    float top_p = 1.0f;         // (1: off)
    // WeDLM's sampler: top-k, then top-p over the raw distribution, then temperature (Dream's:
    // temperature first, so top-p cuts the tempered distribution).
    bool  top_p_raw = false;
    bool  gumbel = true;        // LLaDA: Gumbel-max in float64; Dream: categorical over top-k/top-p
    uint64_t seed = 0;
    uint64_t step = 0;
    int32_t  mask_token_id = -1;  // never sampled: committing a mask would leave the position masked
};

struct RowStats {
    int32_t x0;          // sampled (or argmax) token
    int32_t argmax;      // the most likely token
    float   p_x0;        // softmax probability of x0 under the raw logits (LLaDA confidence)
    float   top1;        // raw top-1 probability
    float   entropy;     // raw softmax entropy, nats
    float   conf;        // Dream confidence: probability of x0 under the processed distribution
    float   margin;      // Dream: p1 - p2 under the processed distribution
    float   neg_entropy; // Dream: sum p log p under the processed distribution
};

// logits: (n_rows, n_vocab) row-major; keys[r] identifies the row's position for the RNG.
void sample_rows(const float * logits, int n_rows, int64_t n_vocab, const std::vector<int32_t> & keys,
                 const SampleConfig & cfg, int n_threads, std::vector<RowStats> & out);

}  // namespace diffuse
