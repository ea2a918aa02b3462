#include "schedulers.h"

#include "rng.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace diffuse {

namespace {

// Indices of the k largest scores (ties: lower index first, as torch.topk on CPU tends to).
std::vector<int> top_k(const std::vector<float> & score, int k) {
    std::vector<int> idx(score.size());
    std::iota(idx.begin(), idx.end(), 0);
    k = std::min<int>(k, (int) idx.size());
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) {
        return score[a] > score[b] || (score[a] == score[b] && a < b);
    });
    idx.resize(k);
    return idx;
}

// Dream's alg_temp: sample k positions without replacement from softmax(score / alg_temp),
// as Gumbel-top-k (equivalent to torch.multinomial without replacement).
std::vector<int> pick(const std::vector<float> & score, const SelectInput & in) {
    if (in.alg_temp <= 0) return top_k(score, in.k);
    std::vector<float> noisy(score.size());
    for (size_t i = 0; i < score.size(); ++i)
        noisy[i] = (float) (score[i] / in.alg_temp - std::log(-std::log(uniform01(in.rng, i))));
    return top_k(noisy, in.k);
}

template <typename F>
std::vector<float> scores(const SelectInput & in, F f) {
    std::vector<float> s;
    s.reserve(in.stats.size());
    for (const RowStats & r : in.stats) s.push_back(f(r));
    return s;
}

std::vector<int> select_low_confidence(const SelectInput & in) {
    return top_k(scores(in, [](const RowStats & r) { return r.p_x0; }), in.k);
}

std::vector<int> select_random(const SelectInput & in) {
    std::vector<float> s(in.stats.size());
    for (size_t i = 0; i < s.size(); ++i) s[i] = (float) uniform01(in.rng, i);
    return top_k(s, in.k);
}

// The paper's rule: every position below tau, and at least the scheduled count (lowest entropy first).
std::vector<int> select_entropy_exit(const SelectInput & in) {
    const std::vector<float> s = scores(in, [](const RowStats & r) { return -r.entropy; });
    int below = 0;
    for (const RowStats & r : in.stats) below += r.entropy < in.threshold;
    return top_k(s, std::max(in.k, below));
}

std::vector<int> select_origin(const SelectInput & in) {
    std::vector<int> out;
    for (size_t i = 0; i < in.stats.size(); ++i)
        if (uniform01(in.rng, i) < in.transfer_prob) out.push_back((int) i);
    return out;
}

std::vector<int> select_maskgit_plus(const SelectInput & in) {
    return pick(scores(in, [](const RowStats & r) { return r.conf; }), in);
}

std::vector<int> select_topk_margin(const SelectInput & in) {
    return pick(scores(in, [](const RowStats & r) { return r.margin; }), in);
}

std::vector<int> select_entropy(const SelectInput & in) {
    return pick(scores(in, [](const RowStats & r) { return r.neg_entropy; }), in);
}

// Block diffusion rules. Confidence is the probability of x0 (at temperature 0: the softmax
// probability of the argmax at temperature 1).
float confidence(const RowStats & r) { return r.conf; }

std::vector<int> select_low_confidence_static(const SelectInput & in) {
    return top_k(scores(in, confidence), in.k);
}

// SDAR's low_confidence_dynamic (LLaDA2's rule too): every position above tau if there are at least
// the scheduled count of them, else the scheduled count, most confident first.
std::vector<int> select_low_confidence_dynamic(const SelectInput & in) {
    std::vector<int> high;
    for (size_t i = 0; i < in.stats.size(); ++i)
        if (confidence(in.stats[i]) > in.confidence_threshold) high.push_back((int) i);
    if ((int) high.size() >= in.k) return high;
    return select_low_confidence_static(in);
}

// Fast-dLLM's get_transfer_index with a threshold: the most confident position, and every other
// one whose confidence is not below tau.
std::vector<int> select_confidence_threshold(const SelectInput & in) {
    std::vector<int> order = top_k(scores(in, confidence), (int) in.stats.size());
    std::vector<int> out;
    for (size_t j = 0; j < order.size(); ++j)
        if (j == 0 || confidence(in.stats[order[j]]) >= in.confidence_threshold) out.push_back(order[j]);
    return out;
}

// EB-sampler (Ben-Hamu et al. 2025), as SDAR names it: the lowest-entropy positions, as many as keep
// sum(H) - max(H) within the budget, at least one.
std::vector<int> select_entropy_bounded(const SelectInput & in) {
    const std::vector<int> order = top_k(scores(in, [](const RowStats & r) { return -r.entropy; }),
                                         (int) in.stats.size());
    std::vector<int> out;
    double sum = 0;   // entropies taken so far: with the next (the largest yet), sum(H) - max(H) = sum
    for (int j : order) {
        if (!out.empty() && sum > in.entropy_budget) break;
        sum += in.stats[j].entropy;
        out.push_back(j);
    }
    return out;
}

// Fast-dLLM's get_transfer_index_dynamic: with the confidences sorted c_1 >= c_2 >= ..., the n most
// confident while every c_i (i <= n) is >= 1 - factor / (i + 1), the first always. Its quirk is
// kept: when the first failure is the last position, that one is committed too (all of them).
std::vector<int> select_confidence_factor(const SelectInput & in) {
    std::vector<int> order = top_k(scores(in, confidence), (int) in.stats.size());
    size_t n = 1;
    while (n < order.size() && confidence(in.stats[order[n]]) >= 1.0 - in.factor / (double) (n + 2)) ++n;
    if (n == order.size() - 1) n = order.size();
    order.resize(n);
    return order;
}

const SchedulerInfo SCHEDULERS[] = {
    // id                              name                      rule                          schedule              gumbel fixed  until_done
    {Scheduler::LowConfidence,        "low_confidence",         select_low_confidence,        Schedule::LLaDABlocks, true,  true,  false},
    {Scheduler::Random,               "random",                 select_random,                Schedule::LLaDABlocks, true,  true,  false},
    {Scheduler::EntropyExit,          "entropy_exit",           select_entropy_exit,          Schedule::LLaDABlocks, true,  false, false},
    {Scheduler::Origin,               "origin",                 select_origin,                Schedule::DreamEps,    false, false, false},
    {Scheduler::MaskgitPlus,          "maskgit_plus",           select_maskgit_plus,          Schedule::DreamEps,    false, true,  false},
    {Scheduler::TopkMargin,           "topk_margin",            select_topk_margin,           Schedule::DreamEps,    false, true,  false},
    {Scheduler::Entropy,              "entropy",                select_entropy,               Schedule::DreamEps,    false, true,  false},
    {Scheduler::LowConfidenceDynamic, "low_confidence_dynamic", select_low_confidence_dynamic, Schedule::LLaDABlocks, false, false, false},
    {Scheduler::LowConfidenceStatic,  "low_confidence_static",  select_low_confidence_static, Schedule::LLaDABlocks, false, true,  false},
    {Scheduler::ConfidenceThreshold,  "confidence_threshold",   select_confidence_threshold,  Schedule::LLaDABlocks, false, false, true},
    {Scheduler::EntropyBounded,       "entropy_bounded",        select_entropy_bounded,       Schedule::LLaDABlocks, false, false, true},
    {Scheduler::ConfidenceFactor,     "confidence_factor",      select_confidence_factor,     Schedule::LLaDABlocks, false, false, true},
};

}  // namespace

const SchedulerInfo & scheduler_info(Scheduler s) {
    for (const SchedulerInfo & i : SCHEDULERS)
        if (i.id == s) return i;
    throw Error("unknown scheduler");
}

const SchedulerInfo & scheduler_by_name(const std::string & name) {
    for (const SchedulerInfo & i : SCHEDULERS)
        if (name == i.name) return i;
    std::string all;
    for (const SchedulerInfo & i : SCHEDULERS) all += (all.empty() ? "" : ", ") + std::string(i.name);
    throw Error("unknown scheduler '" + name + "' (choose one of: " + all + ")");
}

std::vector<std::string> scheduler_names() {
    std::vector<std::string> out;
    for (const SchedulerInfo & i : SCHEDULERS) out.push_back(i.name);
    return out;
}

std::vector<int> select_edits(const RowStats * stats, const std::vector<int32_t> & tokens, float tau) {
    std::vector<int> out;
    for (size_t j = 0; j < tokens.size(); ++j)
        if (stats[j].x0 != tokens[j] && confidence(stats[j]) > tau) out.push_back((int) j);
    return out;
}

std::vector<int> llada_transfer_counts(int n_mask, int steps) {
    std::vector<int> counts(steps, n_mask / steps);
    for (int i = 0; i < n_mask % steps; ++i) ++counts[i];
    return counts;
}

static double dream_timestep(int i, int steps, float eps) {
    return 1.0 + (double) i * ((double) eps - 1.0) / steps;
}

double dream_transfer_prob(int step, int steps, float eps) {
    if (step >= steps - 1) return 1.0;
    return 1.0 - dream_timestep(step + 1, steps, eps) / dream_timestep(step, steps, eps);
}

int dream_transfer_count(int n_mask, int step, int steps, float eps) {
    if (step >= steps - 1) return n_mask;
    return (int) (n_mask * dream_transfer_prob(step, steps, eps));
}

}  // namespace diffuse
