// Unmask rules and transfer schedules. Each rule is a small function with one signature,
// registered by name; the denoising loop never branches on a scheduler's name.
#pragma once

#include "diffuse.h"
#include "sampling.h"

#include <string>
#include <vector>

namespace diffuse {

// What a rule sees at one step: the masked positions of the current block and their statistics.
struct SelectInput {
    const std::vector<RowStats> & stats;  // one per candidate
    int   k;                  // positions the schedule asks for this step (<= candidates)
    float threshold;          // entropy_exit tau, nats
    float confidence_threshold;   // low_confidence_dynamic / confidence_threshold tau, a probability
    float entropy_budget;     // entropy_bounded gamma, nats
    float factor;             // confidence_factor
    float alg_temp;           // Dream: > 0 samples positions instead of taking the top k
    double transfer_prob;     // Dream origin: 1 - s/t (1 on the last step)
    uint64_t rng;             // per-step key
};

// Returns indices into the candidates to commit.
using SelectFn = std::vector<int> (*)(const SelectInput &);

struct SchedulerInfo {
    Scheduler   id;
    const char * name;
    SelectFn    select;
    Schedule    schedule;     // how many positions a step commits
    bool        gumbel;       // LLaDA-style Gumbel sampling of x0 (else Dream's categorical)
    bool        fixed_count;  // false: the rule may commit more (entropy_exit) or a random number (origin)
    bool        until_done;   // a block runs until it has no masks (each step commits >= 1); the
                              // step budget does not bound it (Fast-dLLM's threshold, EB-sampler)
};

const SchedulerInfo & scheduler_info(Scheduler s);
const SchedulerInfo & scheduler_by_name(const std::string & name);   // throws diffuse::Error
std::vector<std::string> scheduler_names();

// LLaDA2.1's token-to-token editing: of a block's committed answer positions (tokens[j] the token
// at the j-th, stats[j] its row), those whose x0 differs from it and whose confidence (the block
// rules': the probability of x0) is above tau. Returns indices j, ascending.
std::vector<int> select_edits(const RowStats * stats, const std::vector<int32_t> & tokens, float tau);

// LLaDA: n_mask positions over `steps` steps, evenly, remainder to the first steps.
std::vector<int> llada_transfer_counts(int n_mask, int steps);

// Dream: timesteps linspace(1, eps, steps + 1); step i commits int(n_mask * (1 - s/t)), all on the last.
int dream_transfer_count(int n_mask, int step, int steps, float eps);
double dream_transfer_prob(int step, int steps, float eps);

}  // namespace diffuse
