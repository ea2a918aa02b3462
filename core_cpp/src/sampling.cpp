#include "sampling.h"

#include "rng.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace diffuse {

namespace {

// A logit no token can win with; finite so that exp() gives 0 and 0 * logit stays 0 (not NaN).
constexpr float BANNED = -1e30f;

// max, log-sum-exp and entropy of softmax(l) in one pass after the max.
struct Softmax {
    float max;
    double log_z;
    double entropy;
    int32_t argmax;
    float second;   // second-largest logit
};

Softmax softmax_stats(const float * l, int64_t n) {
    Softmax s{-INFINITY, 0.0, 0.0, 0, -INFINITY};
    for (int64_t i = 0; i < n; ++i) {
        if (l[i] > s.max) { s.second = s.max; s.max = l[i]; s.argmax = (int32_t) i; }
        else if (l[i] > s.second) s.second = l[i];
    }
    double z = 0.0, zl = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        const double d = (double) l[i] - s.max;
        const double e = std::exp(d);
        z += e;
        zl += e * d;
    }
    s.log_z = std::log(z);
    s.entropy = s.log_z - zl / z;   // H = log Z - E[l - max]
    return s;
}

float prob(const Softmax & s, float logit) { return (float) std::exp((double) logit - s.max - s.log_z); }

// Dream's sample_tokens: temperature, then top-p, then top-k, softmax; sample at T > 0.
void dream_row(const float * l, int64_t n, const SampleConfig & cfg, uint64_t key, RowStats & r,
               std::vector<std::pair<float, int32_t>> & buf) {
    const float inv_t = cfg.temperature > 0 ? 1.0f / cfg.temperature : 1.0f;
    buf.resize(n);
    for (int64_t i = 0; i < n; ++i) buf[i] = {std::max(l[i] * inv_t, BANNED), (int32_t) i};
    std::sort(buf.begin(), buf.end(), [](auto & a, auto & b) { return a.first > b.first; });
    int64_t keep = n;
    if (cfg.top_p < 1.0f) {
        // Keep the smallest prefix whose cumulative probability reaches top_p (at least one token).
        double z = 0.0;
        for (auto & e : buf) z += std::exp((double) e.first - buf[0].first);
        double cum = 0.0;
        int64_t i = 0;
        for (; i < n; ++i) {
            cum += std::exp((double) buf[i].first - buf[0].first) / z;
            if (cum > cfg.top_p) { ++i; break; }
        }
        keep = std::max<int64_t>(1, std::min(i, n));
    }
    if (cfg.top_k > 0) keep = std::min<int64_t>(keep, cfg.top_k);
    double z = 0.0, zl = 0.0;
    for (int64_t i = 0; i < keep; ++i) {
        const double d = (double) buf[i].first - buf[0].first;
        z += std::exp(d);
        zl += std::exp(d) * d;
    }
    int64_t pick = 0;
    if (cfg.temperature > 0) {
        const double u = uniform01(key, 0) * z;
        double cum = 0.0;
        for (pick = 0; pick < keep - 1; ++pick) {
            cum += std::exp((double) buf[pick].first - buf[0].first);
            if (cum >= u) break;
        }
    }
    const double log_z = std::log(z);
    auto p = [&](int64_t i) { return (float) std::exp((double) buf[i].first - buf[0].first - log_z); };
    r.x0 = buf[pick].second;
    r.conf = p(pick);
    r.margin = p(0) - (keep > 1 ? p(1) : 0.0f);
    r.neg_entropy = (float) (zl / z - log_z);
}

}  // namespace

void sample_rows(const float * logits, int n_rows, int64_t n_vocab, const std::vector<int32_t> & keys,
                 const SampleConfig & cfg, int n_threads, std::vector<RowStats> & out) {
    out.resize(n_rows);
    const bool dream_processed = !cfg.gumbel && (cfg.temperature > 0 || cfg.top_k > 0 || cfg.top_p < 1.0f);
#pragma omp parallel num_threads(std::max(1, n_threads))
    {
        std::vector<std::pair<float, int32_t>> buf;
        std::vector<float> row;
#pragma omp for schedule(dynamic)
        for (int r = 0; r < n_rows; ++r) {
            const float * l = logits + (int64_t) r * n_vocab;
            if (cfg.mask_token_id >= 0 && cfg.mask_token_id < n_vocab) {
                row.assign(l, l + n_vocab);
                row[cfg.mask_token_id] = BANNED;
                l = row.data();
            }
            const uint64_t key = rng_key(cfg.seed, cfg.step, (uint64_t) keys[r]);
            const Softmax s = softmax_stats(l, n_vocab);
            RowStats & o = out[r];
            o.top1 = prob(s, s.max);
            o.entropy = (float) s.entropy;
            o.x0 = s.argmax;
            if (cfg.gumbel && cfg.temperature > 0) {
                // LLaDA's add_gumbel_noise in float64: argmax exp(l) / (-log u)^T.
                double best = -INFINITY;
                for (int64_t i = 0; i < n_vocab; ++i) {
                    const double g = (double) l[i] - cfg.temperature * std::log(-std::log(uniform01(key, i)));
                    if (g > best) { best = g; o.x0 = (int32_t) i; }
                }
            }
            // Raw-distribution values, also Dream's when no temperature/top-k/top-p applies.
            o.p_x0 = prob(s, l[o.x0]);
            o.conf = o.p_x0;
            o.margin = o.top1 - prob(s, s.second);
            o.neg_entropy = -o.entropy;
            if (dream_processed) dream_row(l, n_vocab, cfg, key, o, buf);
        }
    }
}

}  // namespace diffuse
