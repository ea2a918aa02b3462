// DiffusionGemma's generate (transformers 5.24 generation_diffusion_gemma.py), per sequence:
//   canvas 0 .. n-1, each: the encoder writes the prompt's (or the previous canvas's) K/V; the canvas
//   starts as uniform random tokens; step i of N (cur = N - i):
//     T = t_end + (t - t_end) cur / N; processed = logits / T (raw logits at T = 0);
//     draw one token per position from softmax(processed) (T = 0: the argmax);
//     accept the lowest-entropy positions while the sum of their entropies minus the largest stays
//     within the bound (at least one); the others are re-drawn uniformly;
//     stop when the argmax has stood `stability` steps and the mean entropy < stop_entropy;
//     the next step's self-conditioning is `processed`;
//   the canvas's output is its last argmax; end-of-text in it ends the answer (the positions after
//   the first become that token: the official loop writes pad_token_id there).
// Quirks kept: the temperature at the last step is t_end + (t - t_end) / N, never t_end itself; the
// entropies (acceptance, stop rule) are those of the temperature-scaled logits; an accepted
// position is not frozen: the next step decides it again. Differences: our counter-based RNG, not
// torch's; sequences of a batch stop on their own (the official batch pads finished rows).
#include "uniform_state.h"

#include "stream.h"

#include "../context.h"
#include "../forward.h"
#include "../rng.h"
#include "../options.h"
#include "../sampling.h"
#include "../schedulers.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <list>
#include <numeric>

namespace diffuse {

namespace {

// RNG streams of the loop (the draws use sample_rows' own: seed, step, position).
constexpr uint64_t CANVAS_STREAM = 0xca27a5ULL, REDRAW_STREAM = 0x4ed4a3ULL;

int32_t uniform_token(uint64_t key, int64_t position, int64_t n_vocab) {
    return (int32_t) std::min<int64_t>(n_vocab - 1, (int64_t) (uniform01(key, (uint64_t) position) * (double) n_vocab));
}

struct Sequence {
    int index;
    const GenerateParams p;
    int n_prompt, C, n_canvases, n_total;
    std::vector<int32_t> x;            // prompt, finished canvases, the canvas being denoised
    std::vector<int32_t> decided;      // (n_total,) the step that finished a position's canvas, -1 prompt
    int n_encoded = 0;                 // cache rows [0, n_encoded) hold the encoder's K/V
    int canvas = 0, i = 0, step = 0;   // canvas index, its step, steps run in all
    std::vector<int32_t> history;      // stability x C argmax canvases, -1 before any
    std::vector<float> self_cond;      // (C, n_vocab) the last step's processed logits; empty at a canvas's start
    KVCache * cache = nullptr;
    size_t slot = 0;
    bool done = false;
    GenerateOutput out;

    Sequence(int index_, const ModelImpl & model, const std::vector<int32_t> & prompt, const GenerateParams & p_)
        : index(index_), p(p_) {
        const Plan g = check_request(model, prompt, p);
        n_prompt = (int) prompt.size();
        C = g.block;
        n_canvases = g.n_blocks;
        n_total = g.n_total;
        x = prompt;
        x.resize(n_total, 0);
        decided.assign(n_total, -1);
        out.steps_allowed = p.steps * n_canvases;
        start_canvas(model.hparams().n_vocab);
    }
    int start() const { return n_prompt + canvas * C; }

    void start_canvas(int64_t n_vocab) {
        const uint64_t key = rng_key(p.seed ^ CANVAS_STREAM, (uint64_t) canvas, 0);
        for (int j = start(); j < start() + C; ++j) x[j] = uniform_token(key, j, n_vocab);
        i = 0;
        self_cond.clear();
        history.assign((size_t) p.stability * C, -1);
    }

    float temperature() const {
        const int cur = p.steps - i;   // the official loop counts the steps down, N .. 1
        return p.temperature_end + (p.temperature - p.temperature_end) * ((float) cur / (float) p.steps);
    }

    // The canvas is over: its argmax is its output; end-of-text ends the answer.
    void finish_canvas(const std::vector<int32_t> & argmax, int64_t n_vocab) {
        std::copy(argmax.begin(), argmax.end(), x.begin() + start());
        std::fill(decided.begin() + start(), decided.begin() + start() + C, step - 1);
        for (int j = start(); j < start() + C; ++j) {
            if (std::find(p.eos_ids.begin(), p.eos_ids.end(), x[j]) == p.eos_ids.end()) continue;
            std::fill(x.begin() + j + 1, x.begin() + start() + C, x[j]);
            x.resize(start() + C);
            decided.resize(x.size());
            out.stop_reason = "eos";
            done = true;
            return;
        }
        if (++canvas == n_canvases) {
            out.stop_reason = "done";
            done = true;
            return;
        }
        start_canvas(n_vocab);
    }

    GenerateOutput take_output() {
        out.tokens.assign(x.begin() + n_prompt, x.end());
        out.decided_step.assign(decided.begin() + n_prompt, decided.end());
        return std::move(out);
    }
};

}  // namespace

Plan plan_uniform_state(const HParams & hp, int64_t n_prompt, const GenerateParams & p) {
    if (p.mode != Decoding::Diffusion)
        throw Error("mode ar and self_spec do not apply to DiffusionGemma: its decoder denoises canvases");
    const int C = hp.canvas_length;
    if (p.block_length > 0 && p.block_length != C)
        throw Error("block_length: DiffusionGemma denoises canvases of its own length (" + std::to_string(C) + ")");
    if (p.sub_block_length > 0 || p.cfg_scale > 0 || p.top_k > 0 || p.top_p < 1 || p.editing_threshold < 1)
        throw Error("sub_block_length, cfg_scale, top_k, top_p and editing_threshold do not apply to DiffusionGemma");
    if (p.temperature > 0 && p.temperature_end > p.temperature)
        throw Error("temperature_end (" + std::to_string(p.temperature_end) + ") must not exceed temperature (" +
                    std::to_string(p.temperature) + "): the temperature falls over a canvas's steps");
    const int64_t n_canvases = (p.gen_length + C - 1) / C;
    if (n_prompt + n_canvases * C > hp.n_ctx_train) throw context_error(n_prompt, p, "canvas", C, hp.n_ctx_train);
    Plan g{Loop::UniformState};
    g.origin = (int) n_prompt;
    g.n_total = (int) (n_prompt + n_canvases * C);
    g.block = g.sub = C;
    g.n_blocks = (int) n_canvases;
    g.steps_per_sub = p.steps;   // at most: a canvas may settle sooner
    return g;
}

int uniform_state_stream(const ModelImpl & model, const BatchFeed & feed, const StepCallback & on_step) {
    const HParams & hp = model.hparams();
    const int64_t V = hp.n_vocab;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    ContextLease ctx = model.lease();
    std::list<Sequence> running;       // a list: a Sequence stays put while it runs
    CacheSlots slots;
    int n_admitted = 0;

    std::vector<float> logits, entropy, confidence, encoder_logits;
    std::vector<RowStats> stats;
    std::vector<int32_t> keys, argmax, next, accepted, redrawn, active, cached;
    std::vector<uint8_t> noise;
    std::vector<SequenceRows> batch;
    std::vector<Sequence *> work;

    for (;;) {
        // ---- step boundary: ended sequences leave (their caches go to the new), new ones join ----
        work.clear();
        for (auto it = running.begin(); it != running.end();) {
            if (!it->done) {
                work.push_back(&*it++);
                continue;
            }
            slots.give_back(it->slot);
            feed.finished(it->index, it->take_output());
            it = running.erase(it);
        }
        if (!admit_items(feed, model, running, n_admitted, work) && work.empty()) break;
        if (work.empty()) continue;   // everything admitted was refused: ask again
        const int n_threads = work[0]->p.n_threads > 0 ? thread_count(work[0]->p.n_threads) : model.n_threads();

        // ---- the encoder: prompts that joined, canvases that finished (one causal pass) ----
        const Clock::time_point t0 = Clock::now();
        batch.clear();
        for (Sequence * q : work) {
            if (!q->cache) {
                q->slot = slots.take();
                q->cache = &ctx->cache(q->slot, q->n_total);
            }
            if (q->n_encoded == q->start()) continue;
            SequenceRows r;
            r.cache = q->cache;
            r.tokens.assign(q->x.begin() + q->n_encoded, q->x.begin() + q->start());
            r.positions.resize(r.tokens.size());
            std::iota(r.positions.begin(), r.positions.end(), q->n_encoded);
            r.n_kv = q->start();
            r.attn_block = 1;                          // causal
            r.out_rows = {(int32_t) r.tokens.size() - 1};   // the pass needs one; its logits are unused
            batch.push_back(std::move(r));
            q->n_encoded = q->start();
        }
        if (!batch.empty()) {
            encoder_logits.resize(batch.size() * (size_t) V);
            ctx->runner.run(batch, n_threads, encoder_logits.data());
        }
        const Clock::time_point t1 = Clock::now();
        const double encoder_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();

        // ---- the decoder: every running canvas, one bidirectional pass ----
        batch.clear();
        for (Sequence * q : work) {
            q->out.prefill_ms += encoder_ms;
            SequenceRows r;
            r.cache = q->cache;
            r.tokens.assign(q->x.begin() + q->start(), q->x.begin() + q->start() + q->C);
            r.positions.resize(q->C);
            std::iota(r.positions.begin(), r.positions.end(), q->start());
            r.n_kv = q->start() + q->C;
            r.canvas = true;
            r.self_cond = q->self_cond.empty() ? nullptr : q->self_cond.data();
            r.out_rows.resize(q->C);
            std::iota(r.out_rows.begin(), r.out_rows.end(), 0);
            batch.push_back(std::move(r));
        }
        size_t n_rows = 0;
        for (const Sequence * q : work) n_rows += (size_t) q->C;
        logits.resize(n_rows * (size_t) V);
        ctx->runner.run(batch, n_threads, logits.data());
        const double forward_ms = ms_since(t1);

        // ---- per sequence: draw, accept, re-draw, stop rule, report ----
        float * row = logits.data();
        for (Sequence * qp : work) {
            Sequence & q = *qp;
            const Clock::time_point t2 = Clock::now();
            const int C = q.C, s0 = q.start();
            float * lg = row;
            row += (size_t) C * V;
            const float T = q.temperature();
            if (T > 0)
                for (size_t j = 0; j < (size_t) C * V; ++j) lg[j] /= T;   // processed logits, in place
            SampleConfig cfg;
            cfg.temperature = T > 0 ? 1.0f : 0.0f;   // lg is already scaled; 0: the draw is the argmax
            cfg.gumbel = false;                      // a categorical draw from softmax(processed)
            cfg.seed = q.p.seed;
            cfg.step = (uint64_t) q.step;
            keys.resize(C);
            std::iota(keys.begin(), keys.end(), s0);
            sample_pass(model, lg, C, keys, cfg, n_threads, stats);

            // Accept the lowest entropies within the bound; re-draw the others uniformly.
            SelectInput in{stats, 0, 0, 0, q.p.entropy_budget, 0, 0, 0, 0};
            std::vector<int> chosen = scheduler_info(Scheduler::EntropyBounded).select(in);
            noise.assign(C, 1);
            float cut = 0;
            for (int j : chosen) {
                noise[j] = 0;
                cut = std::max(cut, stats[j].entropy);
            }
            const uint64_t redraw_key = rng_key(q.p.seed ^ REDRAW_STREAM, (uint64_t) q.step, 0);
            next.resize(C);
            argmax.resize(C);
            accepted.clear();
            redrawn.clear();
            double mean_entropy = 0;
            for (int j = 0; j < C; ++j) {
                argmax[j] = stats[j].argmax;
                mean_entropy += stats[j].entropy / C;
                if (noise[j]) {
                    next[j] = uniform_token(redraw_key, s0 + j, V);
                    redrawn.push_back(s0 + j);
                } else {
                    next[j] = stats[j].x0;
                    accepted.push_back(s0 + j);
                }
            }
            // The stop rule: the argmax unchanged over the last `stability` steps, and confident.
            bool stable = true;
            for (size_t k = 0; k < q.history.size(); ++k) stable = stable && q.history[k] == argmax[k % C];
            if (!q.history.empty()) {
                std::rotate(q.history.begin(), q.history.begin() + C, q.history.end());
                std::copy(argmax.begin(), argmax.end(), q.history.end() - C);
            }
            const bool stop = stable && mean_entropy < q.p.stop_entropy;

            entropy.assign(q.n_total, nan);
            confidence.assign(q.n_total, nan);
            for (int j = 0; j < C; ++j) {
                entropy[s0 + j] = stats[j].entropy;
                confidence[s0 + j] = stats[j].top1;
            }
            active.resize(C);
            std::iota(active.begin(), active.end(), s0);
            cached.resize(s0);
            std::iota(cached.begin(), cached.end(), 0);
            std::vector<uint8_t> mask(q.n_total, 0);
            for (int32_t pos : redrawn) mask[pos] = 1;
            const double sample_ms = ms_since(t2);
            q.out.step_ms.push_back(forward_ms + sample_ms);
            q.out.forward_ms.push_back(forward_ms);
            q.out.sample_ms.push_back(sample_ms);
            q.out.steps = ++q.step;
            if (on_step) {
                static const std::vector<int32_t> none;
                StepEvent ev{q.index, q.step - 1, q.canvas, q.n_canvases, q.out.steps_allowed, q.n_prompt, s0, s0 + C,
                             (int) accepted.size(), &q.x, &mask, &accepted, &entropy, &confidence, &active, &cached,
                             forward_ms, sample_ms, forward_ms + sample_ms, &none, &none, &redrawn, &argmax, cut};
                if (!on_step(ev)) {
                    q.out.stop_reason = "cancelled";
                    q.done = true;
                    continue;
                }
            }
            ++q.i;
            if (stop || q.i == q.p.steps) {
                q.finish_canvas(argmax, V);
                continue;
            }
            std::copy(next.begin(), next.end(), q.x.begin() + s0);
            q.self_cond.assign(lg, lg + (size_t) C * V);   // the processed logits condition the next step
        }
    }
    return (int) slots.count();
}

}  // namespace diffuse
