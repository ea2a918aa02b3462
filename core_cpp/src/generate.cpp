// The denoising loop: forward -> sample -> unmask -> event, block by block.
//
// Inter-step cache (the paper's): K/V of every layer stay in a KVCache between steps. A step
// recomputes only its active positions (masked in the current block, changed within the last
// keep_active steps, and for Dream the rows whose shifted logits are needed); every other position
// keeps the K/V of the step that last computed it. Step 0 and every refresh_every-th step recompute
// everything; cache=false recomputes everything every step (exact).
#include "diffuse.h"

#include "forward.h"
#include "model_impl.h"
#include "rng.h"
#include "sampling.h"
#include "schedulers.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

namespace diffuse {

GenerateParams default_generate_params(Arch arch) {
    GenerateParams p;
    if (arch == Arch::Dream) {
        // Dream's reference: whole-sequence denoising with the entropy rule and eps schedule.
        p.scheduler = Scheduler::Entropy;
        p.block_length = 0;
    }
    return p;
}

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct Run {
    ModelImpl & model;
    const GenerateParams & p;
    int n_prompt, n_total, n_threads;

    std::vector<int32_t> x;            // (n_total,) current sequence
    std::vector<uint8_t> mask;         // (n_total,) 1 = masked
    std::vector<int>     last_change;  // (n_total,) step that last changed the token; -1 = before the run
    std::vector<int32_t> decided;      // (n_total,) step that committed the position, -1 = prompt/masked
};

// Positions to recompute this step; the source row of every needed logit is always among them.
std::vector<int32_t> plan_active(const Run & r, int step, int bs, int be, const std::vector<int32_t> & sources) {
    const GenerateParams & p = r.p;
    const bool full = !p.cache || step == 0 || (p.refresh_every > 0 && step % p.refresh_every == 0);
    std::vector<uint8_t> on(r.n_total, full ? 1 : 0);
    if (!full) {
        for (int i = 0; i < r.n_total; ++i)
            on[i] = (r.mask[i] && i >= bs && i < be) || step - r.last_change[i] <= p.keep_active;
        for (int32_t s : sources) on[s] = 1;
    }
    std::vector<int32_t> active;
    for (int i = 0; i < r.n_total; ++i)
        if (on[i]) active.push_back(i);
    return active;
}

// Logits (n_out, n_vocab) of the `sources` rows, computing only `active` positions of `seq`.
void run_forward(Run & r, KVCache & cache, const std::vector<int32_t> & seq, const std::vector<int32_t> & active,
                 const std::vector<int32_t> & sources, std::vector<float> & logits) {
    ForwardBatch b;
    b.n_kv = r.n_total;
    std::vector<int32_t> row_of(r.n_total, -1);
    for (int32_t pos : active) {
        row_of[pos] = (int32_t) b.tokens.size();
        b.tokens.push_back(seq[pos]);
        b.positions.push_back(pos);
    }
    for (int32_t s : sources) b.out_rows.push_back(row_of[s]);
    logits.resize(sources.size() * (size_t) r.model.hparams().n_vocab);
    r.model.runner().run(cache, b, r.n_threads, logits.data());
}

}  // namespace

GenerateOutput generate(Model & base, const std::vector<int32_t> & prompt, const GenerateParams & p,
                        const StepCallback & on_step) {
    ModelImpl & model = static_cast<ModelImpl &>(base);
    const HParams & hp = model.hparams();
    const SchedulerInfo & sched = scheduler_info(p.scheduler);

    // ---- validate ----
    if (prompt.empty()) throw Error("the prompt is empty");
    model.check_tokens(prompt.data(), prompt.size());
    if (p.gen_length <= 0) throw Error("gen_length must be positive");
    const int block = p.block_length <= 0 ? p.gen_length : std::min(p.block_length, p.gen_length);
    if (p.gen_length % block != 0)
        throw Error("gen_length (" + std::to_string(p.gen_length) + ") must be a multiple of block_length (" +
                    std::to_string(block) + ")");
    if (p.steps <= 0) throw Error("steps must be positive");
    if (p.keep_active < 1) throw Error("keep_active must be at least 1 (a committed position is recomputed once)");
    if (p.refresh_every < 0) throw Error("refresh_every must be >= 0");
    if (!(p.temperature >= 0) || !(p.top_p > 0 && p.top_p <= 1) || p.top_k < 0 || !(p.alg_temp >= 0) ||
        !(p.cfg_scale >= 0) || !(p.eps > 0 && p.eps < 1) || !(p.threshold >= 0))
        throw Error("sampling options out of range (temperature >= 0, 0 < top_p <= 1, top_k >= 0, alg_temp >= 0, "
                    "cfg_scale >= 0, 0 < eps < 1, threshold >= 0)");
    const int64_t n_total64 = (int64_t) prompt.size() + p.gen_length;
    if (n_total64 > hp.n_ctx_train)
        throw Error("prompt (" + std::to_string(prompt.size()) + " tokens) + gen_length (" +
                    std::to_string(p.gen_length) + ") exceeds the model's context of " +
                    std::to_string(hp.n_ctx_train) + " positions");
    const int n_blocks = p.gen_length / block;
    // Each block gets the same number of steps; the budget is rounded down to a multiple of the
    // block count (at least one step per block).
    const int steps_per_block = std::max(1, p.steps / n_blocks);

    Run r{model, p, (int) prompt.size(), (int) n_total64, p.n_threads > 0 ? p.n_threads : model.n_threads(),
          {}, {}, {}, {}};
    r.x = prompt;
    r.x.resize(r.n_total, hp.mask_token_id);
    r.mask.assign(r.n_total, 0);
    std::fill(r.mask.begin() + r.n_prompt, r.mask.end(), 1);
    r.last_change.assign(r.n_total, -1);
    r.decided.assign(r.n_total, -1);

    KVCache cache(model, r.n_total);
    std::unique_ptr<KVCache> uncond_cache;
    std::vector<int32_t> x_uncond;   // classifier-free guidance: the prompt masked out
    if (p.cfg_scale > 0) {
        uncond_cache = std::make_unique<KVCache>(model, r.n_total);
        x_uncond = r.x;
        std::fill(x_uncond.begin(), x_uncond.begin() + r.n_prompt, hp.mask_token_id);
    }

    GenerateOutput out;
    out.steps_allowed = steps_per_block * n_blocks;
    out.stop_reason = "done";

    std::vector<float> logits, logits_un, entropy(r.n_total), confidence(r.n_total);
    std::vector<RowStats> stats;
    std::vector<int32_t> unmasked, cached;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    auto is_eos = [&](int32_t t) { return std::find(p.eos_ids.begin(), p.eos_ids.end(), t) != p.eos_ids.end(); };

    int step = 0;
    bool stop = false;
    for (int b = 0; b < n_blocks && !stop; ++b) {
        const int bs = r.n_prompt + b * block, be = bs + block;
        const std::vector<int> counts = llada_transfer_counts(block, steps_per_block);

        for (int i = 0; i < steps_per_block; ++i) {
            const Clock::time_point t0 = Clock::now();
            std::vector<int32_t> cand;   // masked positions of this block
            for (int pos = bs; pos < be; ++pos)
                if (r.mask[pos]) cand.push_back(pos);
            if (cand.empty()) break;

            // Dream predicts position p from the output row of p - 1.
            std::vector<int32_t> sources(cand);
            if (hp.shift_logits)
                for (int32_t & s : sources) s = std::max(0, s - 1);

            const std::vector<int32_t> active = plan_active(r, step, bs, be, sources);
            run_forward(r, cache, r.x, active, sources, logits);
            if (uncond_cache) {
                for (int pos = r.n_prompt; pos < r.n_total; ++pos) x_uncond[pos] = r.x[pos];
                run_forward(r, *uncond_cache, x_uncond, active, sources, logits_un);
                const float w = p.cfg_scale + 1.0f;
                for (size_t j = 0; j < logits.size(); ++j) logits[j] = logits_un[j] + w * (logits[j] - logits_un[j]);
            }
            const double forward_ms = ms_since(t0);

            const Clock::time_point t1 = Clock::now();
            SampleConfig sc;
            sc.temperature = p.temperature;
            sc.top_k = p.top_k;
            sc.top_p = p.top_p;
            sc.gumbel = sched.gumbel;
            sc.seed = p.seed;
            sc.step = (uint64_t) step;
            sc.mask_token_id = hp.mask_token_id;
            sample_rows(logits.data(), (int) cand.size(), hp.n_vocab, cand, sc, r.n_threads, stats);
            for (const RowStats & s : stats)
                if (!std::isfinite(s.entropy))
                    throw Error(model.path() + ": the forward pass produced NaN/Inf logits (corrupt weights?)");

            const int n_cand = (int) cand.size();
            int k = sched.schedule == Schedule::LLaDABlocks
                        ? (i == steps_per_block - 1 ? n_cand : std::min(counts[i], n_cand))
                        : dream_transfer_count(n_cand, i, steps_per_block, p.eps);
            SelectInput in{stats, k, p.threshold, p.alg_temp, dream_transfer_prob(i, steps_per_block, p.eps),
                           rng_key(p.seed ^ 0x5ced5ced5cedULL, (uint64_t) step, 1)};
            const std::vector<int> chosen = sched.select(in);

            std::fill(entropy.begin(), entropy.end(), nan);
            std::fill(confidence.begin(), confidence.end(), nan);
            for (int j = 0; j < n_cand; ++j) {
                entropy[cand[j]] = stats[j].entropy;
                confidence[cand[j]] = stats[j].top1;
            }
            unmasked.clear();
            for (int j : chosen) {
                const int32_t pos = cand[j];
                r.x[pos] = stats[j].x0;
                r.mask[pos] = 0;
                r.last_change[pos] = step;
                r.decided[pos] = step;
                unmasked.push_back(pos);
            }
            std::sort(unmasked.begin(), unmasked.end());
            const double sample_ms = ms_since(t1);
            const double total_ms = ms_since(t0);

            cached.clear();
            {
                size_t a = 0;
                for (int pos = 0; pos < r.n_total; ++pos) {
                    if (a < active.size() && active[a] == pos) ++a;
                    else cached.push_back(pos);
                }
            }
            out.step_ms.push_back(total_ms);
            out.forward_ms.push_back(forward_ms);
            out.sample_ms.push_back(sample_ms);
            out.steps = step + 1;

            if (on_step) {
                StepEvent ev{step, b, n_blocks, out.steps_allowed, r.n_prompt, bs, be,
                             &r.x, &r.mask, &unmasked, &entropy, &confidence, &active, &cached,
                             forward_ms, sample_ms, total_ms};
                if (!on_step(ev)) {
                    out.stop_reason = "cancelled";
                    stop = true;
                    break;
                }
            }
            ++step;
        }
        if (stop) break;

        // A finished block that is all end-of-text ends the answer: pad the rest and stop.
        bool all_eos = !p.eos_ids.empty();
        for (int pos = bs; pos < be && all_eos; ++pos) all_eos = !r.mask[pos] && is_eos(r.x[pos]);
        if (all_eos && be < r.n_total) {
            for (int pos = be; pos < r.n_total; ++pos) {
                r.x[pos] = p.eos_ids.front();
                r.mask[pos] = 0;
            }
            out.stop_reason = "eos";
            break;
        }
    }

    out.tokens.assign(r.x.begin() + r.n_prompt, r.x.end());
    out.decided_step.assign(r.decided.begin() + r.n_prompt, r.decided.end());
    return out;
}

}  // namespace diffuse
