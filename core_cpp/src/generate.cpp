// The denoising loop: forward -> sample -> unmask -> event, block by block, for one sequence or a
// batch of them advancing together (one forward pass per step over every unfinished sequence). The
// batch is a stream: sequences join and leave it at step boundaries; generate_batch admits all at once.
//
// Inter-step cache of full-attention models (the paper's): K/V of every layer stay in a KVCache
// between steps. A step recomputes only its active positions (masked in the current block, changed
// within the last keep_active steps, and for Dream the rows whose shifted logits are needed); every
// other position keeps the K/V of the step that last computed it. Step 0 and every refresh_every-th
// step recompute everything; cache=false recomputes everything every step (exact).
//
// Block diffusion (SDAR, Fast-dLLM v2): blocks of block_length are aligned at position 0 and
// attention is causal across them, so a finished block's K/V never change and the cache is exact.
// The prompt's whole blocks are prefilled once; its tail shares the first answer block. A step
// computes the current block's rows against the cache; the first step of a block also recomputes
// the block that just finished, from its final tokens (in the same pass: the block-causal mask
// keeps those rows from seeing the new block, so their K/V are what a pass of their own gives).
// With shifted logits (Fast-dLLM v2) a block's first position is predicted by the previous block's
// last row, so that block's recompute is a step of its own (a "carry" step) that commits it; the
// block's other masks may be decoded in sub-blocks, every pass still over the whole block. The
// answer ends as soon as its decided prefix holds end-of-text: nothing after it can change it.
//
// Token-to-token editing (LLaDA2.1, editing_threshold < 1): each step of a block also replaces
// committed answer tokens of that block (select_edits), and once the block has no masks up to
// max_post_steps more passes edit it, until one edits nothing. Edits stay inside the current block,
// whose rows every step recomputes, so a finished block's K/V still come from its final tokens;
// with editing only finished blocks count as a decided prefix.
#include "diffuse.h"

#include "context.h"
#include "loops/causal.h"
#include "loops/stream.h"
#include "loops/uniform_state.h"
#include "model_impl.h"
#include "options.h"
#include "rng.h"
#include "sampling.h"
#include "schedulers.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <limits>
#include <list>

namespace diffuse {

GenerateParams default_generate_params(Arch arch) {
    GenerateParams p;
    switch (arch) {
        case Arch::LLaDA: break;
        case Arch::Dream:
            // Dream's reference: whole-sequence denoising with the entropy rule and eps schedule.
            p.scheduler = Scheduler::Entropy;
            p.block_length = 0;
            break;
        case Arch::SDAR:
        case Arch::FastDLLMv2:
            // SDAR's recipe: the model's block (block_length 0), one step per position at most,
            // the dynamic rule at 0.9 (SDAR uses 0.85-0.9; Fast-dLLM v2 0.9).
            p.scheduler = Scheduler::LowConfidenceDynamic;
            p.block_length = 0;
            p.confidence_threshold = 0.9f;
            p.eos_stop = EosStop::Prefix;
            break;
        case Arch::DiffusionGemma:
            // generation_config.json of diffusiongemma-26B-A4B-it: 48 steps per canvas, entropy
            // bound 0.1, temperature 0.8 -> 0.4, stability 1, confidence 0.005, 256 new tokens.
            p.gen_length = 256;
            p.steps = 48;
            p.block_length = 0;   // the model's canvas
            p.entropy_budget = 0.1f;
            p.temperature = 0.8f;
            p.temperature_end = 0.4f;
            p.stability = 1;
            p.stop_entropy = 0.005f;
            break;
        case Arch::NemotronDiffusion:
            // Its generate_diffusion: blocks of the model's 32, threshold 0.9 (at least one per step).
            p.scheduler = Scheduler::ConfidenceThreshold;
            p.block_length = 0;
            p.steps = 32;
            p.confidence_threshold = 0.9f;
            p.eos_stop = EosStop::Prefix;
            break;
        case Arch::WeDLM:
            // Tencent's SamplingParams: entropy threshold 0.4, position penalty 0.02; window 16
            // (Config). Greedy, as its README and example.py run it (SamplingParams says 0.2).
            p.threshold = 0.4f;
            p.block_length = 0;   // no blocks: the answer is gen_length positions
            p.eos_stop = EosStop::Prefix;
            break;
    }
    return p;
}

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// last_change of a position no step has changed (the prompt, masks not yet committed): never
// "recently changed", so the cache keeps serving it.
constexpr int NEVER = INT_MIN / 2;

// Where a run's blocks lie: [origin, n_total) in blocks of `block`.
struct Geometry {
    int block, sub, origin, n_total;   // sub: sub-block length (block diffusion), else the block
};

// Checks a request against the model; returns its blocks.
Geometry validate(const ModelImpl & model, const std::vector<int32_t> & prompt, const GenerateParams & p) {
    const HParams & hp = model.hparams();
    if (runs_causally(model, p)) {   // loops/causal.cpp: no blocks of this loop
        check_causal(model, prompt, p);
        return {};
    }
    if (prompt.empty()) throw Error("the prompt is empty");
    model.check_tokens(prompt.data(), prompt.size());
    check_options(p);
    if (p.editing_threshold < 1 && (!hp.block_diffusion() || hp.shift_logits))
        throw Error("editing_threshold applies to block-diffusion models without shifted logits (LLaDA2.1, SDAR) only");
    if (p.carry_first && !hp.shift_logits)
        throw Error("carry_first applies to models with shifted logits (Dream, Fast-dLLM v2) only");
    const int64_t n_prompt = (int64_t) prompt.size();
    Geometry g;
    if (hp.block_diffusion()) {
        // Blocks aligned at position 0 (SDAR's generate.py): the prompt's whole blocks are
        // prefilled, its tail shares the first answer block, the run ends on a block boundary.
        if (p.cfg_scale > 0) throw Error("cfg_scale is not supported for block-diffusion models");
        // Their cache is exact and they see no suffix: neither option means anything there.
        if (p.cache_policy != CachePolicy::Active)
            throw Error("cache_policy applies to full-attention models only (a block-diffusion model's cache is exact)");
        if (p.suffix_window >= 0)
            throw Error("suffix_window applies to full-attention models only (a block-diffusion model sees no suffix)");
        g.block = p.block_length > 0 ? p.block_length : hp.block_size;
        g.sub = p.sub_block_length > 0 ? p.sub_block_length : hp.sub_block_size > 0 ? hp.sub_block_size : g.block;
        g.sub = std::min(g.sub, g.block);
        const int64_t origin = n_prompt / g.block * g.block;
        const int64_t end = origin + (n_prompt + p.gen_length - origin + g.block - 1) / g.block * g.block;
        if (end > hp.n_ctx_train)
            throw Error("prompt (" + std::to_string(n_prompt) + " tokens) + gen_length (" +
                        std::to_string(p.gen_length) + "), in whole blocks of " + std::to_string(g.block) +
                        ", exceeds the model's context of " + std::to_string(hp.n_ctx_train) + " positions");
        g.origin = (int) origin;
        g.n_total = (int) end;
        return g;
    }
    if (p.sub_block_length > 0) throw Error("sub_block_length applies to block-diffusion models only");
    g.block = p.block_length <= 0 ? p.gen_length : std::min(p.block_length, p.gen_length);
    g.sub = g.block;
    if (p.gen_length % g.block != 0)
        throw Error("gen_length (" + std::to_string(p.gen_length) + ") must be a multiple of block_length (" +
                    std::to_string(g.block) + ")");
    if (n_prompt + p.gen_length > hp.n_ctx_train)
        throw Error("prompt (" + std::to_string(prompt.size()) + " tokens) + gen_length (" +
                    std::to_string(p.gen_length) + ") exceeds the model's context of " +
                    std::to_string(hp.n_ctx_train) + " positions");
    g.origin = (int) n_prompt;
    g.n_total = (int) (n_prompt + p.gen_length);
    return g;
}

// One sequence's state through the run.
struct Sequence {
    int index;
    const GenerateParams p;            // a copy: the admitted item is gone after admit()
    const SchedulerInfo & sched;
    const bool block_causal;           // block diffusion: exact cache, blocks aligned at 0
    const bool shift;                  // position p is predicted by the output row of p - 1 (Dream)
    const bool carries;                // block diffusion with shifted logits: carry steps (above)
    const bool editing;                // token-to-token editing (above)
    int n_prompt, n_total, block, origin, n_blocks;
    int sub, n_subs, steps_per_sub;    // sub-blocks of a block (one of the whole block when none)

    std::vector<int32_t> x;            // (n_total,) current sequence
    std::vector<uint8_t> mask;         // (n_total,) 1 = masked
    std::vector<int>     last_change;  // (n_total,) step that last changed the token, NEVER if none
    std::vector<int32_t> decided;      // (n_total,) step that committed the position, -1 = prompt/masked
    std::vector<int32_t> x_uncond;     // classifier-free guidance: x with the prompt masked out
    KVCache * cache = nullptr;
    KVCache * uncond_cache = nullptr;
    std::vector<size_t> slots;         // the context's cache indices it holds, freed when it ends
    int n_final = 0;                   // block diffusion: rows [0, n_final) of the cache are final

    int b = 0, u = 0, i = 0, step = 0; // current block, sub-block, step within it, steps run
    int block_steps = 0;               // steps run in the current block
    int n_seen = 0;                    // full attention: rows [0, n_seen) have been computed once
    bool carrying = false;             // this step commits the block's first position (carry step)
    bool post = false;                 // editing: this step is a pass after the block's last mask
    int post_steps = 0;                // editing: such passes run in the current block
    bool post_edited = false;          // editing: whether the last of them edited
    bool done = false;
    GenerateOutput out;

    // This step: masked positions of the block, editing: the block's committed answer positions,
    // the rows whose logits they take (cand's, then editable's), rows to recompute.
    std::vector<int32_t> cand, editable, sources, active;

    Sequence(int index_, const ModelImpl & model, const std::vector<int32_t> & prompt, const GenerateParams & p_)
        : index(index_), p(p_), sched(scheduler_info(p_.scheduler)), block_causal(model.hparams().block_diffusion()),
          shift(model.hparams().shift_logits), carries(shift && (block_causal || p_.carry_first)),
          editing(p_.editing_threshold < 1) {
        const Geometry g = validate(model, prompt, p);
        block = g.block;
        sub = g.sub;
        n_subs = (block + sub - 1) / sub;
        origin = g.origin;
        n_total = g.n_total;
        n_prompt = (int) prompt.size();
        n_blocks = (n_total - origin) / block;
        // Each block gets the same number of steps, and never more than it has positions: past
        // that a schedule only adds steps that commit nothing (Dream's eps schedule spent half of
        // them so at steps = 2 x gen_length). Full attention: the budget is the run's, rounded
        // down to a multiple of the block count (at least one step per block); block diffusion:
        // it is per block (SDAR's denoising_steps).
        // Sub-blocks share their block's steps evenly.
        const int steps_per_block = std::clamp(block_causal ? p.steps : p.steps / n_blocks, 1, block);
        steps_per_sub = std::clamp(steps_per_block / n_subs, 1, sub);
        const int32_t mask_id = model.hparams().mask_token_id;
        x = prompt;
        x.resize(n_total, mask_id);
        mask.assign(n_total, 0);
        std::fill(mask.begin() + n_prompt, mask.end(), 1);
        last_change.assign(n_total, NEVER);
        decided.assign(n_total, -1);
        if (p.cfg_scale > 0) {
            x_uncond = x;
            std::fill(x_uncond.begin(), x_uncond.begin() + n_prompt, mask_id);
        }
        out.steps_allowed = ((sched.until_done ? block : steps_per_sub * n_subs) + (carries ? 1 : 0) +
                             (editing ? p.max_post_steps : 0)) * n_blocks;
        out.stop_reason = "done";
    }

    GenerateOutput take_output() {
        out.tokens.assign(x.begin() + n_prompt, x.end());
        out.decided_step.assign(decided.begin() + n_prompt, decided.end());
        return std::move(out);
    }

    int block_start() const { return origin + b * block; }
    int block_end() const { return block_start() + block; }
    // Full attention: the positions a step attends to (the suffix window cuts off the rest).
    int window_end() const { return p.suffix_window < 0 ? n_total : std::min(n_total, block_end() + p.suffix_window); }
    int sub_start() const { return block_start() + u * sub; }
    int sub_end() const { return std::min(sub_start() + sub, block_end()); }
    // Positions a step can see: block diffusion has no future yet.
    int n_visible() const { return block_causal ? block_end() : window_end(); }
    bool is_eos(int32_t t) const { return std::find(p.eos_ids.begin(), p.eos_ids.end(), t) != p.eos_ids.end(); }

    // Positions to commit at step i of a sub-block (the rule may commit more or fewer).
    int scheduled(int n_cand) const {
        if (carrying) return 1;
        if (sched.schedule == Schedule::DreamEps) return dream_transfer_count(n_cand, i, steps_per_sub, p.eps);
        if (i >= steps_per_sub - 1) return n_cand;
        return std::min(llada_transfer_counts(sub_end() - sub_start(), steps_per_sub)[i], n_cand);
    }

    // Whether the finished current block ends the answer (eos_stop all_eos / holds_eos).
    bool block_ends_answer() const {
        if (p.eos_ids.empty() || (p.eos_stop != EosStop::AllEos && p.eos_stop != EosStop::HoldsEos)) return false;
        const bool all = p.eos_stop == EosStop::AllEos;
        for (int pos = std::max(block_start(), n_prompt); pos < block_end(); ++pos) {
            const bool eos = !mask[pos] && is_eos(x[pos]);
            if (!all && eos) return true;
            if (all && !eos) return false;
        }
        return all;
    }

    // eos_stop prefix: whether the answer's decided prefix holds end-of-text (Fast-dLLM v2's stop;
    // nothing after it can change the text). Editing may still change the current block.
    bool prefix_holds_eos() const {
        if (p.eos_ids.empty()) return false;
        const int end = editing ? block_start() : n_total;
        for (int pos = n_prompt; pos < end && !mask[pos]; ++pos)
            if (is_eos(x[pos])) return true;
        return false;
    }

    // The answer is over: every position still masked, from `from` on, becomes end-of-text.
    void end_with_eos(int from) {
        for (int pos = from; pos < n_total; ++pos)
            if (mask[pos]) {
                x[pos] = p.eos_ids.front();
                mask[pos] = 0;
            }
        out.stop_reason = "eos";
        done = true;
    }

    // Moves to the next step that has work (finishing sub-blocks and blocks on the way); false
    // when the run is over.
    bool next_step() {
        while (!done && b < n_blocks) {
            if (p.eos_stop == EosStop::Prefix && prefix_holds_eos()) {
                end_with_eos(n_prompt);
                break;
            }
            const int bs = block_start(), be = block_end();
            cand.clear();
            carrying = carries && mask[bs];
            if (carrying) cand.push_back(bs);
            for (; !carrying && u < n_subs; ++u, i = 0) {
                if (i >= steps_per_sub && !sched.until_done) continue;
                for (int pos = sub_start(); pos < sub_end(); ++pos)
                    if (mask[pos]) cand.push_back(pos);
                if (!cand.empty()) break;
            }
            // Editing: the official loop's passes after the last mask, while the one before edited.
            post = editing && cand.empty() && !carrying && post_steps < p.max_post_steps &&
                   (post_steps == 0 || post_edited);
            if (!cand.empty() || post) {
                sources = cand;
                if (shift)
                    for (int32_t & s : sources) s = std::max(0, s - 1);
                editable.clear();
                for (int pos = std::max(bs, n_prompt); editing && pos < be; ++pos)
                    if (!mask[pos]) editable.push_back(pos);
                sources.insert(sources.end(), editable.begin(), editable.end());   // no shift with editing
                plan_active();
                return true;
            }
            if (be < n_total && block_ends_answer()) end_with_eos(be);
            ++b;
            u = i = block_steps = post_steps = 0;
        }
        done = true;
        return false;
    }

    // After a step's commits and `n_edited` edits.
    void advance(size_t n_edited) {
        ++step;
        ++block_steps;
        n_seen = std::max(n_seen, window_end());
        if (post) {
            ++post_steps;
            post_edited = n_edited > 0;
        } else if (!carrying) {
            ++i;
        }
    }

    // Positions to recompute this step; the source row of every needed logit is always among them.
    void plan_active() {
        active.clear();
        const int bs = block_start(), be = block_end();
        if (block_causal) {
            // The current block, and the rows whose K/V are not final yet (the block that just
            // finished); with shifted logits also the block holding the first source row. A carry
            // step needs no row of the current block.
            int from = p.cache ? std::min(n_final, bs) : 0;
            from = std::min(from, *std::min_element(sources.begin(), sources.end()) / block * block);
            for (int pos = from; pos < (carrying ? bs : be); ++pos) active.push_back(pos);
            return;
        }
        // Full attention over [0, window_end()). Prefix and dual caches: a full pass at each block's
        // start, then the rows from the block's start to the window's end (prefix) or the block (dual).
        const int we = window_end();
        const bool block_policy = p.cache_policy != CachePolicy::Active;
        const bool full = !p.cache || step == 0 || (block_policy ? block_steps == 0
                                                                 : p.refresh_every > 0 && step % p.refresh_every == 0);
        std::vector<uint8_t> on(we, 1);
        if (!full) {
            for (int pos = 0; pos < we; ++pos) {
                switch (p.cache_policy) {
                    case CachePolicy::Active:
                        on[pos] = (mask[pos] && pos >= bs && pos < be) || step - last_change[pos] <= p.keep_active;
                        break;
                    case CachePolicy::Prefix: on[pos] = pos >= bs; break;
                    case CachePolicy::Dual: on[pos] = pos >= bs && pos < be; break;
                }
                on[pos] |= pos >= n_seen;   // entering the suffix window: never computed yet
            }
            for (int32_t s : sources) on[s] = 1;
        }
        for (int pos = 0; pos < we; ++pos)
            if (on[pos]) active.push_back(pos);
    }

    // The rows at `positions` of `seq` for `kv` (block diffusion: with its mask), logits wanted for
    // `wanted` (positions among them); for prefill passes and steps.
    SequenceRows rows(KVCache * kv, const std::vector<int32_t> & seq, const std::vector<int32_t> & positions,
                      const std::vector<int32_t> & wanted) const {
        SequenceRows r;
        r.cache = kv;
        r.n_kv = block_causal ? (positions.back() / block + 1) * block : window_end();
        r.attn_block = block_causal ? block : 0;
        std::vector<int32_t> row_of(n_total, -1);
        for (int32_t pos : positions) {
            row_of[pos] = (int32_t) r.tokens.size();
            r.tokens.push_back(seq[pos]);
            r.positions.push_back(pos);
        }
        for (int32_t s : wanted) r.out_rows.push_back(row_of[s]);
        return r;
    }

    // This step's rows of `kv`, computed from `seq`.
    SequenceRows step_rows(KVCache * kv, const std::vector<int32_t> & seq) const { return rows(kv, seq, active, sources); }
};

// Block diffusion: the prompt's whole blocks [0, origin) written to the sequence's cache once,
// in passes of at most PREFILL_ROWS rows (whole blocks) so that compute memory stays bounded
// whatever the prompt's length. A pass must return some logits: one row's, unused.
constexpr int PREFILL_ROWS = 512;

void prefill(Sequence & q, ForwardRunner & runner, int n_threads, int64_t n_vocab) {
    // A prompt ending on a block boundary leaves its last block to the carry step, whose last row
    // predicts the answer's first position.
    const int end = q.carrying && q.cand.front() == q.origin ? q.origin - q.block : q.origin;
    if (!q.block_causal || !q.p.cache || end == 0) return;
    const Clock::time_point t0 = Clock::now();
    const int chunk = std::max(1, PREFILL_ROWS / q.block) * q.block;
    std::vector<float> logits(n_vocab);
    std::vector<int32_t> positions;
    for (int from = 0; from < end; from += chunk) {
        positions.clear();
        for (int pos = from; pos < std::min(end, from + chunk); ++pos) positions.push_back(pos);
        runner.run({q.rows(q.cache, q.x, positions, {positions.back()})}, n_threads, logits.data());
    }
    q.n_final = end;
    q.out.prefill_ms = ms_since(t0);
    q.plan_active();   // planned at admission, before the prompt's blocks were in the cache
}

}  // namespace

int generate_stream(const Model & base, const BatchFeed & given_feed, const StepCallback & given_on_step) {
    const ModelImpl & model = static_cast<const ModelImpl &>(base);
    const HParams & hp = model.hparams();
    if (hp.arch == Arch::DiffusionGemma) return uniform_state_stream(model, given_feed, given_on_step);
    ContextLease ctx = model.lease();
    // The AR, self-speculation and causal-cache diffusion items run beside this loop (loops/causal.h).
    CausalSide causal(model, given_feed, given_on_step);
    const BatchFeed & feed = causal.feed();
    const StepCallback & on_step = causal.on_step();

    std::list<Sequence> running;       // admission order; a list, so a Sequence stays put while it runs
    int n_admitted = 0;
    std::vector<size_t> free_slots;    // caches of the context no running sequence holds
    size_t n_slots = 0;
    auto take_cache = [&](Sequence & q) {
        size_t s = n_slots;
        if (free_slots.empty()) ++n_slots;
        else {
            s = free_slots.back();
            free_slots.pop_back();
        }
        q.slots.push_back(s);
        return &ctx->cache(s, q.n_total);   // never read before a full pass writes it: no clearing
    };

    const int64_t V = hp.n_vocab;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> logits, entropy, confidence;
    std::vector<RowStats> stats;
    std::vector<int32_t> unmasked, edited, cached, experts, keys, current;
    std::vector<SequenceRows> batch;
    std::vector<Sequence *> work, joined;
    std::vector<size_t> batch_index;   // per work item: its (conditional) rows' index in batch

    for (;;) {
        // ---- step boundary: ended sequences leave (their caches go to the new), then new ones join ----
        work.clear();
        for (auto it = running.begin(); it != running.end();) {
            if (it->next_step()) {
                work.push_back(&*it++);
                continue;
            }
            free_slots.insert(free_slots.end(), it->slots.begin(), it->slots.end());
            feed.finished(it->index, it->take_output());
            it = running.erase(it);
        }
        joined.clear();
        const bool admitted = admit_items(feed, model, running, n_admitted, joined);
        for (Sequence * q : joined)
            if (q->next_step()) work.push_back(q);
        if (work.empty()) {
            if (!admitted) break;
            continue;   // everything admitted was refused: ask again
        }
        const int n_threads = work[0]->p.n_threads > 0 ? thread_count(work[0]->p.n_threads) : model.n_threads();
        for (Sequence * q : work) {
            if (q->cache) continue;
            q->cache = take_cache(*q);
            if (q->p.cfg_scale > 0) q->uncond_cache = take_cache(*q);
            prefill(*q, ctx->runner, n_threads, V);
        }

        // ---- one forward pass for every sequence with a step to do ----
        const Clock::time_point t0 = Clock::now();
        batch.clear();
        batch_index.clear();
        size_t n_out = 0;
        for (Sequence * q : work) {
            batch_index.push_back(batch.size());
            batch.push_back(q->step_rows(q->cache, q->x));
            n_out += q->sources.size();
            if (q->uncond_cache) {
                for (int pos = q->n_prompt; pos < q->n_total; ++pos) q->x_uncond[pos] = q->x[pos];
                batch.push_back(q->step_rows(q->uncond_cache, q->x_uncond));
                n_out += q->sources.size();
            }
        }
        logits.resize(n_out * (size_t) V);
        ctx->runner.run(batch, n_threads, logits.data());
        const double forward_ms = ms_since(t0);
        for (Sequence * q : work) q->n_final = std::max(q->n_final, q->block_start());   // earlier blocks: final K/V

        // ---- per sequence: sample, commit, report ----
        float * row = logits.data();
        for (size_t w = 0; w < work.size(); ++w) {
            Sequence & q = *work[w];
            const Clock::time_point t1 = Clock::now();
            const int n_cand = (int) q.cand.size();
            const int n_rows = (int) q.sources.size();   // n_cand, then the editable positions'
            float * lg = row;
            row += (size_t) n_rows * V;
            if (q.uncond_cache) {
                const float * un = row;
                row += (size_t) n_rows * V;
                const float w = q.p.cfg_scale + 1.0f;
                for (size_t j = 0; j < (size_t) n_rows * V; ++j) lg[j] = un[j] + w * (lg[j] - un[j]);
            }
            SampleConfig sc;
            sc.temperature = q.p.temperature;
            sc.top_k = q.p.top_k;
            sc.top_p = q.p.top_p;
            sc.gumbel = q.sched.gumbel;
            sc.seed = q.p.seed;
            sc.step = (uint64_t) q.step;
            sc.mask_token_id = hp.mask_token_id;
            keys = q.cand;   // the positions the rows predict
            keys.insert(keys.end(), q.editable.begin(), q.editable.end());
            sample_rows(lg, n_rows, V, keys, sc, n_threads, stats);
            for (const RowStats & s : stats)
                if (!std::isfinite(s.entropy))
                    throw Error(model.path() + ": the forward pass produced NaN/Inf logits (corrupt weights?)");

            entropy.assign(q.n_total, nan);
            confidence.assign(q.n_total, nan);
            for (int j = 0; j < n_cand; ++j) {
                entropy[keys[j]] = stats[j].entropy;
                confidence[keys[j]] = stats[j].top1;
            }
            // Editing: the block's committed answer tokens to replace (rows n_cand on); the
            // positions edited are evaluated and changed, so their values are reported too.
            edited.clear();
            if (q.editing) {
                current.clear();
                for (int32_t pos : q.editable) current.push_back(q.x[pos]);
                for (int j : select_edits(stats.data() + n_cand, current, q.p.editing_threshold)) {
                    const int32_t pos = q.editable[j];
                    const RowStats & s = stats[n_cand + j];
                    q.x[pos] = s.x0;
                    q.last_change[pos] = q.step;
                    entropy[pos] = s.entropy;
                    confidence[pos] = s.top1;
                    edited.push_back(pos);
                }
                stats.resize(n_cand);   // the commit rule sees the masked positions only
            }

            const int n_scheduled = q.post ? 0 : q.scheduled(n_cand);
            SelectInput in{stats, n_scheduled, q.p.threshold, q.p.confidence_threshold, q.p.entropy_budget,
                           q.p.factor, q.p.alg_temp, dream_transfer_prob(q.i, q.steps_per_sub, q.p.eps),
                           rng_key(q.p.seed ^ 0x5ced5ced5cedULL, (uint64_t) q.step, 1)};
            const std::vector<int> chosen = q.carrying ? std::vector<int>{0}
                                            : q.post   ? std::vector<int>{}
                                                       : q.sched.select(in);
            unmasked.clear();
            for (int j : chosen) {
                const int32_t pos = q.cand[j];
                q.x[pos] = stats[j].x0;
                q.mask[pos] = 0;
                q.last_change[pos] = q.step;
                q.decided[pos] = q.step;
                unmasked.push_back(pos);
            }
            std::sort(unmasked.begin(), unmasked.end());
            const double sample_ms = ms_since(t1);
            const double total_ms = forward_ms + sample_ms;

            cached.clear();
            for (int pos = 0, a = 0; pos < q.n_visible(); ++pos) {
                if (a < (int) q.active.size() && q.active[a] == pos) ++a;
                else cached.push_back(pos);
            }
            q.out.step_ms.push_back(total_ms);
            q.out.forward_ms.push_back(forward_ms);
            q.out.sample_ms.push_back(sample_ms);
            q.out.steps = q.step + 1;

            experts.clear();
            if (on_step && q.p.expert_routing && hp.moe()) {
                const size_t bi = batch_index[w];
                ctx->runner.routing(bi, batch[bi].out_rows, experts);
            }
            if (on_step) {
                StepEvent ev{q.index, q.step, q.b, q.n_blocks, q.out.steps_allowed, q.n_prompt,
                             q.block_start(), q.block_end(), n_scheduled, &q.x, &q.mask, &unmasked, &entropy, &confidence,
                             &q.active, &cached, forward_ms, sample_ms, total_ms, &experts, &edited};
                if (!on_step(ev)) {
                    q.out.stop_reason = "cancelled";
                    q.done = true;
                }
            }
            q.advance(edited.size());
        }
    }

    return (int) n_slots;
}

std::vector<GenerateOutput> generate_batch(const Model & base, const std::vector<BatchItem> & items,
                                           const StepCallback & on_step) {
    const ModelImpl & model = static_cast<const ModelImpl &>(base);
    if (items.empty()) throw Error("generate_batch: no prompts");
    // Checked before any step: a batch with a bad prompt fails as a whole, naming it.
    for (size_t s = 0; s < items.size(); ++s) {
        try {
            if (model.hparams().arch == Arch::DiffusionGemma) check_uniform_state(model, items[s].prompt, items[s].params);
            else validate(model, items[s].prompt, items[s].params);
        } catch (const Error & e) {
            throw Error(items.size() == 1 ? e.what() : "prompt " + std::to_string(s) + ": " + e.what());
        }
    }
    std::vector<GenerateOutput> outs(items.size());
    bool admitted = false;
    const BatchFeed feed{[&] {
                             if (admitted) return std::vector<BatchItem>{};
                             admitted = true;
                             return items;
                         },
                         [&](int s, GenerateOutput && out) { outs[s] = std::move(out); }};
    generate_stream(model, feed, on_step);
    return outs;
}

GenerateOutput generate(const Model & model, const std::vector<int32_t> & prompt, const GenerateParams & params,
                        const StepCallback & on_step) {
    return std::move(generate_batch(model, {BatchItem{prompt, params}}, on_step).front());
}

}  // namespace diffuse
