#include "sampling.h"

#include "rng.h"

#include <algorithm>
#include <cmath>
#include <cstring>

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

// LLaDA's add_gumbel_noise in float64: x0 = argmax_i l_i - T log(-log u_i), the first index on ties.
// Every token's draw is read (any u_i close enough to 1 wins), but the two logarithms are taken
// only where they can matter: -log u >= w = 1 - u >= 2^-e (e: minus w's binary exponent, read from
// its bits) bounds token i's score by l_i + T e ln 2, and a token whose bound stays below the
// argmax token's score (the winner's is at least that) cannot win. The scores compared are the
// ones the full pass computes, so the pick is the same.
int32_t gumbel_argmax(const float * l, int64_t n, double t, uint64_t key, int32_t argmax) {
    auto score = [&](int64_t i) { return (double) l[i] - t * std::log(-std::log(uniform01(key, i))); };
    const double floor_score = score(argmax);
    // The bound is exact arithmetic; the slack covers score()'s rounding many times over.
    const double cutoff = floor_score - 1e-6 * (1.0 + std::fabs(floor_score) + t);
    const double t_ln2 = t * 0.6931471805599453;
    double best = -INFINITY;
    int32_t x0 = argmax;
    for (int64_t i = 0; i < n; ++i) {
        const double w = 1.0 - uniform01(key, i);   // exact for u >= 1/2; below, within the slack
        uint64_t bits;
        std::memcpy(&bits, &w, sizeof bits);
        const int e = 1023 - (int) (bits >> 52);     // w = 0 (u rounded to 1, score +inf) gives 1023
        if ((double) l[i] + t_ln2 * e < cutoff) continue;
        const double g = score(i);
        if (g > best) { best = g; x0 = (int32_t) i; }
    }
    return x0;
}

// Dream's distribution in sorted order: larger value first, equal values by lower token id (the
// raw argmax's tie rule). An entry packs both into one key, ascending in that order: the value's
// bits made descending-comparable above the token id.
using Entry = uint64_t;
Entry entry(float v, int32_t id) {   // v not NaN
    uint32_t u;
    v += 0.0f;   // -0 == +0: one key for both
    std::memcpy(&u, &v, sizeof u);
    const uint32_t ascending = u & 0x80000000u ? ~u : u | 0x80000000u;
    return (uint64_t) ~ascending << 32 | (uint32_t) id;
}
float value(Entry e) {
    const uint32_t ascending = ~(uint32_t) (e >> 32);
    const uint32_t u = ascending & 0x80000000u ? ascending & 0x7fffffffu : ~ascending;
    float v;
    std::memcpy(&v, &u, sizeof v);
    return v;
}
int32_t token(Entry e) { return (int32_t) (uint32_t) e; }

// Sorts e[from..] by value, stably (LSD radix on the key's upper 32 bits, 8 a pass, skipping
// passes where every key has the same digit): entries gathered in token order keep equal values
// by ascending id, so this is the full keys' order, in linear time.
void sort_by_value(std::vector<Entry> & e, size_t from, std::vector<Entry> & scratch) {
    const size_t n = e.size() - from;
    if (n < 2) return;
    scratch.resize(n);
    Entry * src = e.data() + from, * dst = scratch.data();
    for (int shift = 32; shift < 64; shift += 8) {
        size_t start[257] = {};
        for (size_t i = 0; i < n; ++i) ++start[((src[i] >> shift) & 255) + 1];
        if (start[((src[0] >> shift) & 255) + 1] == n) continue;
        for (int d = 0; d < 256; ++d) start[d + 1] += start[d];
        for (size_t i = 0; i < n; ++i) dst[start[(src[i] >> shift) & 255]++] = src[i];
        std::swap(src, dst);
    }
    if (src != e.data() + from) std::copy(src, src + n, e.data() + from);
}

// A worker's buffers, reused across rows.
struct Scratch {
    std::vector<float> row, tempered;
    std::vector<Entry> entries, sorting;
};

// The values bucketed by their distance below the top one (4 buckets a nat, the last one open),
// with each bucket's count and weight exp(value - top). Top-k, the top-p nucleus and the draw read
// a prefix of the sorted order whose length the buckets tell before anything is sorted.
struct Buckets {
    static constexpr int N = 256;
    float top = BANNED;
    int64_t count[N] = {};
    double mass[N] = {};
    int of(float v) const {   // monotone in v: the entries of buckets 0..b are a prefix of the order
        const float x = (top - v) * 4.0f;
        return x < N - 1 ? (int) x : N - 1;
    }
    // The last bucket of the fewest leading ones that hold k entries / weight m (N - 1: all).
    int holding_count(int64_t k) const {
        int64_t c = 0;
        for (int b = 0; b < N - 1; ++b)
            if ((c += count[b]) >= k) return b;
        return N - 1;
    }
    int holding_mass(double m) const {
        m *= 1.0 + 1e-9;   // bucket sums round differently from the walk's running sum
        double c = 0.0;
        for (int b = 0; b < N - 1; ++b)
            if ((c += mass[b]) >= m) return b;
        return N - 1;
    }
};

// The entries in key order, sorted only as far as they are read: whole buckets are gathered
// from the row and sorted, the first ones as the caller foresees, more when a read goes past them.
class Ranking {
public:
    Ranking(const std::vector<float> & v, const Buckets & b, Scratch & s) : v_(v), b_(b), e_(s.entries), s_(s.sorting) {
        e_.clear();
    }
    void gather(int last) {   // buckets up to `last`
        if (last < next_) return;
        const size_t from = e_.size();
        for (int64_t i = 0; i < (int64_t) v_.size(); ++i) {
            const int b = b_.of(v_[i]);
            if (b >= next_ && b <= last) e_.push_back(entry(v_[i], (int32_t) i));
        }
        sort_by_value(e_, from, s_);
        next_ = last + 1;
    }
    Entry operator[](int64_t i) {   // i < the vocabulary size
        while (i >= (int64_t) e_.size()) gather(b_.holding_count(std::max<int64_t>(i + 1, 4 * (int64_t) e_.size())));
        return e_[i];
    }

private:
    const std::vector<float> & v_;
    const Buckets & b_;
    std::vector<Entry> & e_, & s_;
    int next_ = 0;   // the first bucket not gathered
};

// Dream's sample_tokens: temperature, then top-p, then top-k, softmax; sample at T > 0. With
// cfg.top_p_raw (WeDLM) top-p measures the raw distribution `raw` instead: a positive temperature
// keeps the order, so only where the nucleus ends changes.
void dream_row(const float * l, int64_t n, const SampleConfig & cfg, uint64_t key, const Softmax & raw, RowStats & r,
               Scratch & s) {
    const float inv_t = cfg.temperature > 0 ? 1.0f / cfg.temperature : 1.0f;
    Buckets bk;
    std::vector<float> & v = s.tempered;
    v.resize(n);
    for (int64_t i = 0; i < n; ++i) {
        const float x = l[i] * inv_t;
        v[i] = x >= BANNED ? x : BANNED;   // NaN too: the order must stay total
        bk.top = std::max(bk.top, v[i]);
    }
    const float top = bk.top;
    // The whole vocabulary's weight, in token order (no sort needed): top-p's denominator, and
    // everything when nothing is cut.
    const bool whole = cfg.top_p < 1.0f || cfg.top_k <= 0 || cfg.top_k >= n;
    double z_all = 0.0, zl_all = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        const int b = bk.of(v[i]);
        ++bk.count[b];
        if (whole) {
            const double d = (double) v[i] - top, e = std::exp(d);
            z_all += e;
            zl_all += e * d;
            bk.mass[b] += e;
        }
    }
    Ranking rank(v, bk, s);
    auto gap = [&](int64_t i) { return (double) value(rank[i]) - top; };   // log of the weight
    const int64_t k_cap = cfg.top_k > 0 ? std::min<int64_t>(cfg.top_k, n) : n;
    int64_t keep = k_cap;
    if (k_cap < n) rank.gather(bk.holding_count(k_cap));
    if (cfg.top_p < 1.0f) {
        // The smallest prefix whose cumulative probability exceeds top_p (at least one token);
        // top-k cuts at k_cap anyway, so the walk stops there.
        if (!cfg.top_p_raw) rank.gather(std::min(bk.holding_mass(cfg.top_p * z_all), bk.holding_count(k_cap)));
        double cum = 0.0;
        int64_t i = 0;
        for (; i < k_cap; ++i) {   // rank[i] gathers as far as the walk goes
            cum += cfg.top_p_raw ? (double) prob(raw, l[token(rank[i])]) : std::exp(gap(i)) / z_all;
            if (cum > cfg.top_p) { ++i; break; }
        }
        keep = std::max<int64_t>(1, std::min(i, k_cap));
    }
    double z = z_all, zl = zl_all;
    if (keep < n) {
        z = zl = 0.0;
        for (int64_t i = 0; i < keep; ++i) {
            const double d = gap(i), e = std::exp(d);
            z += e;
            zl += e * d;
        }
    }
    int64_t pick = 0;
    if (cfg.temperature > 0) {
        const double u = uniform01(key, 0) * z;
        if (keep == n) rank.gather(bk.holding_mass(u));
        double cum = 0.0;
        for (pick = 0; pick < keep - 1; ++pick) {
            cum += std::exp(gap(pick));
            if (cum >= u) break;
        }
    }
    const double log_z = std::log(z);
    auto p = [&](int64_t i) { return (float) std::exp(gap(i) - log_z); };
    r.x0 = token(rank[pick]);
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
        Scratch scratch;
#pragma omp for schedule(dynamic)
        for (int r = 0; r < n_rows; ++r) {
            const float * l = logits + (int64_t) r * n_vocab;
            if (cfg.mask_token_id >= 0 && cfg.mask_token_id < n_vocab) {
                scratch.row.assign(l, l + n_vocab);
                scratch.row[cfg.mask_token_id] = BANNED;
                l = scratch.row.data();
            }
            const uint64_t key = rng_key(cfg.seed, cfg.step, (uint64_t) keys[r]);
            const Softmax s = softmax_stats(l, n_vocab);
            RowStats & o = out[r];
            o.top1 = prob(s, s.max);
            o.entropy = (float) s.entropy;
            o.x0 = o.argmax = s.argmax;
            if (cfg.gumbel && cfg.temperature > 0) o.x0 = gumbel_argmax(l, n_vocab, cfg.temperature, key, s.argmax);
            // Raw-distribution values, also Dream's when no temperature/top-k/top-p applies.
            o.p_x0 = prob(s, l[o.x0]);
            o.conf = o.p_x0;
            o.margin = o.top1 - prob(s, s.second);
            o.neg_entropy = -o.entropy;
            if (dream_processed) dream_row(l, n_vocab, cfg, key, s, o, scratch);
        }
    }
}

}  // namespace diffuse
