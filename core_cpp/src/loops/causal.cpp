// The causal-cache modes. Every one starts with a causal prefill whose last row gives the answer's
// first token, and keeps the K/V of the committed tokens in the sequence's cache, causally:
//
// - ar: one causal pass per token, over the last committed token.
// - self_spec (Nemotron-Labs-Diffusion's linear_spec_generate): the last committed token, the seed,
//   at position P is not in the cache yet. A draft pass runs [seed, draft_length - 1 masks] at
//   P.. over the cache, bidirectionally inside the block, and takes each mask's argmax. A verify pass
//   runs [seed, drafts] causally, writing their K/V, and chooses the AR token after each row (the
//   same choice as mode ar: argmax, or a draw keyed by position). The drafts are kept while each
//   equals the AR token before it; the AR token after the last kept one (the bonus) is committed
//   too and seeds the next iteration. Rows past the kept ones are left in the cache to be
//   overwritten (the official loop crops them). Every committed token is the AR choice after the
//   committed tokens before it, so the answer is mode ar's.
// - diffusion (Nemotron-Labs-Diffusion's generate): blocks of [seed, block - 1 masks] from the
//   prompt's end; each step runs the block bidirectionally over the cache and commits masks by
//   the scheduler (its default: confidence_threshold 0.9); a finished block gets one causal pass
//   that writes its K/V and whose last row seeds the next block.
// - diffusion (WeDLM's, loops/wedlm.h): a causal prefill without a token, then passes over a
//   sliding window reordered filled-first, committing its head.
//
// Where the official code differs, and why: docs/self_speculation.md.
#include "causal.h"
#include "wedlm.h"

#include "../options.h"
#include "../rng.h"
#include "../sampling.h"
#include "../schedulers.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

namespace diffuse {

namespace {

// A prompt is prefilled in passes of at most this many rows: compute memory stays bounded.
constexpr int PREFILL_ROWS = 512;

const char * mode_name(Decoding m) {
    switch (m) {
        case Decoding::Diffusion: return "diffusion";
        case Decoding::AR: return "ar";
        case Decoding::SelfSpec: return "self_spec";
    }
    return "?";
}

// WeDLM's diffusion mode: its window reordered over the causal cache (loops/wedlm.h).
bool wedlm(const HParams & hp, const GenerateParams & p) {
    return p.mode == Decoding::Diffusion && hp.family == Family::WeDLM;
}

// Nemotron-Labs-Diffusion's blocks; WeDLM has none (its window slides by any count).
int diffusion_block(const HParams & hp, const GenerateParams & p) {
    if (wedlm(hp, p)) return 1;
    return p.block_length > 0 ? p.block_length : hp.trained_block;
}

// Positions of a run: the answer's tokens (diffusion: whole blocks) after the prompt.
int total_length(const HParams & hp, int64_t n_prompt, const GenerateParams & p) {
    int64_t gen = p.gen_length;
    if (p.mode == Decoding::Diffusion) {
        const int64_t B = diffusion_block(hp, p);
        gen = (gen + B - 1) / B * B;
    }
    return (int) std::min<int64_t>(n_prompt + gen, INT32_MAX);
}

// Rows [from, to) of `x` for `cache`: causal (attn_block 1) or seeing each other and the whole
// cache before them (0); logits of rows `out` (offsets from `from`).
SequenceRows pass_rows(KVCache * cache, const std::vector<int32_t> & x, int from, int to, bool causal,
                       std::vector<int32_t> out) {
    SequenceRows r;
    r.cache = cache;
    r.tokens.assign(x.begin() + from, x.begin() + to);
    for (int pos = from; pos < to; ++pos) r.positions.push_back(pos);
    r.n_kv = to;
    r.attn_block = causal && to - from > 1 ? 1 : 0;   // one row sees the whole cache either way
    r.out_rows = std::move(out);
    return r;
}

}  // namespace

Plan plan_causal(const HParams & hp, int64_t n_prompt, const GenerateParams & p) {
    const std::string mode = std::string("mode ") + mode_name(p.mode);
    // Options of the denoising loop that mean nothing over a causal cache.
    if (p.cfg_scale > 0) throw Error("cfg_scale does not apply to " + mode);
    if (p.editing_threshold < 1) throw Error("editing_threshold does not apply to " + mode);
    if (p.carry_first) throw Error("carry_first does not apply to " + mode);
    if (p.sub_block_length > 0) throw Error("sub_block_length does not apply to " + mode);
    if (p.cache_policy != CachePolicy::Active || p.suffix_window >= 0)
        throw Error("cache_policy and suffix_window do not apply to " + mode + " (its cache is exact)");
    if (p.mode == Decoding::SelfSpec && p.draft_length > hp.n_ctx_train)
        throw Error("draft_length (" + std::to_string(p.draft_length) + ") exceeds the model's context of " +
                    std::to_string(hp.n_ctx_train) + " positions");
    if (wedlm(hp, p) && p.window_size > hp.n_ctx_train)
        throw Error("window_size (" + std::to_string(p.window_size) + ") exceeds the model's context of " +
                    std::to_string(hp.n_ctx_train) + " positions");
    const bool blocks = p.mode == Decoding::Diffusion && !wedlm(hp, p);
    Plan g{Loop::Causal};
    g.origin = (int) n_prompt;
    g.n_total = total_length(hp, n_prompt, p);
    g.block = g.sub = p.mode == Decoding::Diffusion ? diffusion_block(hp, p) : 1;
    if (g.n_total > hp.n_ctx_train) throw context_error(n_prompt, p, blocks ? "block" : "", g.block, hp.n_ctx_train);
    g.n_blocks = (g.n_total - g.origin) / g.block;
    g.steps_per_sub = blocks ? p.steps : 1;
    return g;
}

// One sequence of a causal mode. Positions [0, n_done) are committed (x, mask 0; diffusion: the
// committed prefix, the current block may hold more); the cache holds causal K/V of rows
// [0, n_cached): 0 before the prefill, then all but the last committed token (the seed, the next
// pass's first row; diffusion: the current block's).
struct CausalSequence {
    int index;
    const GenerateParams p;
    const SchedulerInfo & sched;
    const bool shift;            // the model's row i predicts position i + 1 (Dream's diffusion)
    int n_prompt, n_total, block;
    int n_cache;                 // cache positions: n_total; WeDLM: as far as its window may reach
    std::unique_ptr<WeDLMWindow> window;   // WeDLM's diffusion mode
    std::vector<int32_t> x, decided;
    std::vector<uint8_t> mask;
    int n_done, n_cached = 0;
    int bstart = 0, block_step = 0;   // diffusion: the current block's first position (its seed), steps run in it
    KVCache * cache = nullptr;
    size_t slot = 0;
    int step = 0;
    bool done = false;
    GenerateOutput out;

    // This iteration, for its event: positions committed, rows computed, the draft (self_spec).
    std::vector<int32_t> unmasked, active, cached, draft, experts, edited, keys, committed;
    std::vector<float> entropy, confidence, logits;
    std::vector<RowStats> stats;
    int accepted = -1, scheduled = 0, block_start = 0, block_end = 0;
    double forward_ms = 0;

    CausalSequence(int index_, const ModelImpl & model, const std::vector<int32_t> & prompt, const GenerateParams & p_)
        : index(index_), p(p_), sched(scheduler_info(p_.scheduler)), shift(model.hparams().shift_logits) {
        const Plan g = check_request(model, prompt, p);
        n_prompt = (int) prompt.size();
        n_total = g.n_total;
        block = g.block;
        x = prompt;
        x.resize(n_total, model.hparams().mask_token_id);
        mask.assign(n_total, 0);
        std::fill(mask.begin() + n_prompt, mask.end(), 1);
        decided.assign(n_total, -1);
        n_done = n_prompt;
        out.stop_reason = "done";
        const int n_gen = n_total - n_prompt;
        out.steps_allowed = p.mode == Decoding::Diffusion
                                ? 1 + n_gen / block * (sched.until_done ? block - 1 : std::clamp(p.steps, 1, std::max(1, block - 1)))
                                : n_gen;
        n_cache = n_total;
        if (wedlm(model.hparams(), p)) {
            // While an answer position is still a mask, the window (window_size positions from the
            // head it commits) ends before n_total + window_size - 1; each pass fills one of those.
            n_cache = (int) std::min<int64_t>(model.hparams().n_ctx_train, (int64_t) n_total + p.window_size - 1);
            window = std::make_unique<WeDLMWindow>(n_prompt, p.window_size, n_cache, model.hparams().mask_token_id);
            out.steps_allowed = n_cache - n_prompt;
        }
    }

    GenerateOutput take_output() {
        out.tokens.assign(x.begin() + n_prompt, x.end());
        out.decided_step.assign(decided.begin() + n_prompt, decided.end());
        return std::move(out);
    }

    void commit(int pos, int32_t token) {
        x[pos] = token;
        mask[pos] = 0;
        decided[pos] = step;
        unmasked.push_back(pos);
    }

    bool is_eos(int32_t t) const { return std::find(p.eos_ids.begin(), p.eos_ids.end(), t) != p.eos_ids.end(); }

    // End-of-text in the answer's committed prefix ends it (eos_stop none: never): every later
    // position becomes end-of-text, as the denoising loop's early stop leaves them.
    void stop_at_eos() {
        if (p.eos_stop == EosStop::None || p.eos_ids.empty()) return;
        for (int pos = n_prompt; pos < n_total && !mask[pos]; ++pos) {
            if (!is_eos(x[pos])) continue;
            for (int after = pos + 1; after < n_total; ++after) {
                x[after] = p.eos_ids.front();
                mask[after] = 0;
            }
            out.stop_reason = "eos";
            done = true;
            return;
        }
    }

    SampleConfig sampling(bool greedy, uint64_t step_key) const {
        SampleConfig sc;
        sc.temperature = greedy ? 0.0f : p.temperature;
        sc.top_k = p.top_k;
        sc.top_p = p.top_p;
        sc.gumbel = p.mode == Decoding::Diffusion && sched.gumbel;
        sc.seed = p.seed;
        sc.step = step_key;
        return sc;
    }

    // Runs one pass; logits of its out_rows in `logits`.
    void run(ForwardRunner & runner, int n_threads, int64_t V, const SequenceRows & rows) {
        const Clock::time_point t0 = Clock::now();
        logits.resize(rows.out_rows.size() * (size_t) V);
        runner.run({rows}, n_threads, logits.data());
        forward_ms += ms_since(t0);
        ++out.forward_passes;
    }

    // Chooses a token per logit row: AR's choice for the positions in `keys` (greedy, or a draw keyed
    // by the position alone, so that every mode draws the same token at the same position).
    void choose(int n_rows, int64_t V, int32_t mask_id, bool greedy, uint64_t step_key, int n_threads) {
        SampleConfig sc = sampling(greedy, step_key);
        sc.mask_token_id = mask_id;
        sample_rows(logits.data(), n_rows, V, keys, sc, n_threads, stats);
        for (int j = 0; j < n_rows; ++j) {
            if (!std::isfinite(stats[j].entropy)) throw Error("the forward pass produced NaN/Inf logits (corrupt weights?)");
            if (keys[j] >= n_total) continue;   // self_spec: the AR token after the answer's last position
            entropy[keys[j]] = stats[j].entropy;
            confidence[keys[j]] = stats[j].top1;
        }
    }

    // The causal pass over rows [n_cached, n_done): the prompt (in chunks) or the last token;
    // commits the AR token after them.
    void ar_step(ForwardRunner & runner, int n_threads, int64_t V, int32_t mask_id) {
        const int from = n_cached, to = n_done;
        for (int a = from; a < to; a += PREFILL_ROWS) {
            const int b = std::min(to, a + PREFILL_ROWS);
            for (int pos = a; pos < b; ++pos) active.push_back(pos);
            run(runner, n_threads, V, pass_rows(cache, x, a, b, true, {b - a - 1}));
        }
        if (n_cached == 0) out.prefill_ms = forward_ms;
        n_cached = to;
        keys = {to};
        choose(1, V, mask_id, false, 0, n_threads);
        block_start = to;
        block_end = to + 1;
        commit(to, stats[0].x0);
        n_done = to + 1;
        bstart = to;   // diffusion: the prefill seeds the first block
    }

    // One draft pass and one verify pass of the block at the seed's position.
    void spec_step(ForwardRunner & runner, int n_threads, int64_t V, int32_t mask_id) {
        // Rows P..P+k-1, the answer's last at most (the last row's AR token, past the answer, is dropped).
        const int P = n_done - 1, k = std::min(p.draft_length, n_total - P);
        block_start = P;
        block_end = P + k;
        draft.assign(1, x[P]);
        for (int pos = P; pos < P + k; ++pos) active.push_back(pos);
        if (k > 1) {
            // x[P + 1, P + k) hold masks: the draft pass's block.
            std::vector<int32_t> rows;
            for (int j = 1; j < k; ++j) rows.push_back(shift ? j - 1 : j);
            SequenceRows draft_rows = pass_rows(cache, x, P, P + k, false, rows);
            draft_rows.draft_lora = p.draft_lora;   // the draft LoRA, never in a verify pass: the answer stays ar's
            run(runner, n_threads, V, draft_rows);
            keys.clear();
            for (int j = 1; j < k; ++j) keys.push_back(P + j);
            SampleConfig sc = sampling(true, 0);
            sc.mask_token_id = mask_id;
            sample_rows(logits.data(), k - 1, V, keys, sc, n_threads, stats);
            for (int j = 0; j < k - 1; ++j) draft.push_back(stats[j].x0);
        }
        std::vector<int32_t> block_tokens = x;   // the seed and the drafts, at P..
        std::copy(draft.begin(), draft.end(), block_tokens.begin() + P);
        std::vector<int32_t> rows(k);
        for (int j = 0; j < k; ++j) rows[j] = j;
        run(runner, n_threads, V, pass_rows(cache, block_tokens, P, P + k, true, rows));
        keys.clear();
        for (int j = 0; j < k; ++j) keys.push_back(P + 1 + j);
        choose(k, V, mask_id, false, 0, n_threads);
        accepted = 0;
        while (accepted + 1 < k && stats[accepted].x0 == draft[accepted + 1]) ++accepted;
        for (int j = 0; j <= accepted && P + 1 + j < n_total; ++j) commit(P + 1 + j, stats[j].x0);
        n_cached = P + 1 + accepted;   // the seed and the kept drafts
        n_done = std::min(n_total, n_cached + 1);
    }

    // One pass of WeDLM's window (loops/wedlm.h); the first prefills the prompt before it, taking no
    // token from it (the window's first mask predicts its own position).
    void wedlm_step(ForwardRunner & runner, int n_threads, int64_t V) {
        if (n_cached == 0) {
            const Clock::time_point t0 = Clock::now();
            for (int a = 0; a < n_prompt; a += PREFILL_ROWS) {
                const int b = std::min(n_prompt, a + PREFILL_ROWS);
                logits.resize((size_t) V);
                runner.run({pass_rows(cache, x, a, b, true, {b - a - 1})}, n_threads, logits.data());
            }
            out.prefill_ms = ms_since(t0);
            n_cached = n_prompt;
        }
        WeDLMWindow & w = *window;
        const SequenceRows rows = w.pass(cache);
        for (int32_t pos : w.order())
            if (pos < n_total) active.push_back(pos);
        block_start = w.start();
        block_end = std::min(w.end(), n_total);
        run(runner, n_threads, V, rows);
        const int c = w.commit();
        committed.clear();
        for (int pos = w.start() - c; pos < w.start(); ++pos) committed.push_back(pos);
        n_cached = w.start();
        const std::vector<int32_t> masks = w.masks();
        if (masks.empty()) return;
        // Entropy and token of the raw logits, the mask token not excluded (as Tencent's sampler).
        keys = masks;
        SampleConfig sc = sampling(false, (uint64_t) step);
        sc.gumbel = false;
        sc.top_p_raw = true;   // Tencent's sample_tokens: top-k, top-p, then temperature
        sample_rows(logits.data(), (int) masks.size(), V, keys, sc, n_threads, stats);
        std::vector<float> h(masks.size());
        for (size_t j = 0; j < masks.size(); ++j) {
            h[j] = stats[j].entropy;
            if (!std::isfinite(h[j])) throw Error("the forward pass produced NaN/Inf logits (corrupt weights?)");
            if (masks[j] >= n_total) continue;
            entropy[masks[j]] = stats[j].entropy;
            confidence[masks[j]] = stats[j].top1;
        }
        for (int j : w.select(h, p.threshold, p.pos_penalty)) {
            w.fill(masks[j], stats[j].x0);
            if (masks[j] < n_total) commit(masks[j], stats[j].x0);
        }
        while (n_done < n_total && !mask[n_done]) ++n_done;
    }

    // One denoising step of the current block; a finished block's causal pass, which seeds the next.
    void diffusion_step(ForwardRunner & runner, int n_threads, int64_t V, int32_t mask_id) {
        const int bs = bstart, be = std::min(n_total, bs + block);
        block_start = bs;
        block_end = be;
        std::vector<int32_t> cand, rows;
        for (int pos = bs; pos < be; ++pos) {
            active.push_back(pos);
            if (mask[pos]) {
                cand.push_back(pos);
                rows.push_back(pos - bs);
            }
        }
        run(runner, n_threads, V, pass_rows(cache, x, bs, be, false, rows));
        keys = cand;
        choose((int) cand.size(), V, mask_id, false, (uint64_t) step, n_threads);
        // The schedule's count (the official loop's get_num_transfer_tokens); the threshold rules
        // commit every position above their threshold, at least one, whatever it says.
        const int masks = be - bs - 1, steps = std::clamp(p.steps, 1, std::max(1, masks));
        int k = (int) cand.size();
        if (!sched.until_done && block_step < steps - 1)
            k = std::min(llada_transfer_counts(masks, steps)[block_step], k);
        scheduled = k;
        const SelectInput in{stats, k, p.threshold, p.confidence_threshold, p.entropy_budget, p.factor, p.alg_temp,
                             1.0, rng_key(p.seed ^ 0x5ced5ced5cedULL, (uint64_t) step, 1)};
        for (int j : sched.select(in)) commit(cand[j], stats[j].x0);
        ++block_step;
        while (n_done < n_total && !mask[n_done]) ++n_done;
        stop_at_eos();
        const bool finished = std::none_of(mask.begin() + bs, mask.begin() + be, [](uint8_t m) { return m != 0; });
        if (done || !finished) return;
        if (be >= n_total) {   // the last block: no K/V needed after it (the official loop still writes them)
            done = true;
            return;
        }
        // The block's causal pass: its K/V for the blocks after it, and the next block's seed.
        run(runner, n_threads, V, pass_rows(cache, x, bs, be, true, {be - bs - 1}));
        n_cached = be;
        keys = {be};
        choose(1, V, mask_id, false, (uint64_t) step, n_threads);
        commit(be, stats[0].x0);
        n_done = be + 1;
        bstart = be;
        block_step = 0;
    }

    // One iteration (an event); false once the answer is complete.
    void iterate(ForwardRunner & runner, int n_threads, int64_t V, int32_t mask_id, const StepCallback & on_step) {
        const Clock::time_point t0 = Clock::now();
        unmasked.clear();
        active.clear();
        draft.clear();
        accepted = -1;
        scheduled = 1;
        forward_ms = 0;
        entropy.assign(n_total, std::numeric_limits<float>::quiet_NaN());
        confidence.assign(n_total, std::numeric_limits<float>::quiet_NaN());
        if (window) wedlm_step(runner, n_threads, V);
        else if (n_cached == 0 || p.mode == Decoding::AR) ar_step(runner, n_threads, V, mask_id);
        else if (p.mode == Decoding::SelfSpec) spec_step(runner, n_threads, V, mask_id);
        else diffusion_step(runner, n_threads, V, mask_id);
        std::sort(unmasked.begin(), unmasked.end());
        stop_at_eos();
        if (n_done >= n_total) done = true;
        const double total_ms = ms_since(t0), sample_ms = total_ms - forward_ms;
        out.step_ms.push_back(total_ms);
        out.forward_ms.push_back(forward_ms);
        out.sample_ms.push_back(sample_ms);
        out.steps = step + 1;
        if (on_step) {
            cached.clear();
            // WeDLM's pass runs its window in its own order: the cache served what lies before it.
            const int first = window ? block_start : active.empty() ? 0 : active.front();
            for (int pos = 0; pos < std::min(n_total, first); ++pos) cached.push_back(pos);
            // Diffusion: the blocks; the other modes: each iteration is a block of its own.
            const bool blocks = p.mode == Decoding::Diffusion && !window;
            const int n_blocks = blocks ? (n_total - n_prompt) / block : out.steps_allowed;
            const int blk = blocks ? std::max(0, block_start - n_prompt) / block : step;
            StepEvent ev{index, step, blk, n_blocks, out.steps_allowed, n_prompt, block_start, block_end,
                         scheduled, &x, &mask, &unmasked, &entropy, &confidence, &active, &cached, forward_ms, sample_ms,
                         total_ms, &experts, &edited};
            if (p.mode == Decoding::SelfSpec && !draft.empty()) {
                ev.spec_draft = &draft;
                ev.spec_accepted = accepted;
            }
            if (window) {
                ev.window_order = &active;   // the pass's order, within the answer
                ev.committed = &committed;
            }
            if (!on_step(ev)) {
                out.stop_reason = "cancelled";
                done = true;
            }
        }
        ++step;
    }
};

// ---- CausalSide ----

// A lease made in place (ContextLease is neither copied nor moved).
struct CausalSide::Lease {
    explicit Lease(const ModelImpl & model) : lease(model.lease()) {}
    ContextLease lease;
};

CausalSide::CausalSide(const ModelImpl & model, const BatchFeed & outer, const StepCallback & on_step)
    : model_(model), outer_(outer), outer_on_step_(on_step) {
    inner_feed_.admit = [this] { return admit(); };
    inner_feed_.finished = [this](int i, GenerateOutput && out) {
        ++loop_finished_;
        outer_.finished(loop_index_.at(i), std::move(out));
    };
    if (outer_on_step_)   // the loop makes events only for a listener
        inner_on_step_ = [this](const StepEvent & ev) {
            StepEvent mapped = ev;
            mapped.sequence = loop_index_.at(ev.sequence);
            return outer_on_step_(mapped);
        };
}

CausalSide::~CausalSide() = default;

std::vector<BatchItem> CausalSide::admit() {
    for (;;) {
        std::vector<BatchItem> items = outer_.admit(), loop;
        const bool loop_idle = (int) loop_index_.size() == loop_finished_;
        for (BatchItem & item : items) {
            const int index = n_admitted_++;
            if (loop_of(model_.arch(), item.params) == Loop::Causal) {
                start(index, item);
            } else {
                loop_index_.push_back(index);
                loop.push_back(std::move(item));
            }
        }
        if (!running_.empty()) iterate();
        if (!loop.empty() || !loop_idle || running_.empty()) return loop;
    }
}

void CausalSide::start(int index, const BatchItem & item) {
    try {
        running_.emplace_back(index, model_, item.prompt, item.params);
    } catch (const Error & e) {   // a bad item fails alone
        GenerateOutput out;
        out.stop_reason = "error";
        out.error = e.what();
        outer_.finished(index, std::move(out));
        return;
    }
    if (!lease_) lease_ = std::make_unique<Lease>(model_);
    CausalSequence & q = running_.back();
    q.slot = slots_.take();
    q.cache = &lease_->lease->cache(q.slot, q.n_cache);
}

void CausalSide::iterate() {
    const HParams & hp = model_.hparams();
    for (auto it = running_.begin(); it != running_.end();) {
        CausalSequence & q = *it;
        const int n_threads = q.p.n_threads > 0 ? thread_count(q.p.n_threads) : model_.n_threads();
        if (!q.done) q.iterate(lease_->lease->runner, n_threads, hp.n_vocab, hp.mask_token_id, outer_on_step_);
        if (!q.done) {
            ++it;
            continue;
        }
        slots_.give_back(q.slot);
        outer_.finished(q.index, q.take_output());
        it = running_.erase(it);
    }
}

// ---- the parity hook ----

void ModelImpl::forward_causal_into(const std::vector<int32_t> & tokens, int open_block, float * out,
                                    bool draft_lora) const {
    const int n = (int) tokens.size();
    if (hp_.family == Family::DiffusionGemma)
        throw Error("forward: mode 'ar' does not apply to DiffusionGemma: it denoises a canvas over a context (forward_canvas)");
    if (n == 0) throw Error("forward: no tokens");
    if (n > hp_.n_ctx_train)
        throw Error("forward: " + std::to_string(n) + " tokens exceed the model's context of " +
                    std::to_string(hp_.n_ctx_train));
    if (open_block < 0 || open_block > n) throw Error("forward: the open block must be 0..the token count");
    if (draft_lora && (open_block == 0 || hp_.draft_lora_rank == 0))
        throw Error(open_block == 0 ? "forward: draft_lora applies to an open block (a draft pass) only"
                                    : "forward: " + path() + " has no draft LoRA");
    ContextLease ctx = lease();
    KVCache * cache = &ctx->cache(0, n);
    // The causal prefix (all of it when no block is open), then the block over it.
    const int prefix = n - open_block;
    std::vector<int32_t> rows;
    for (int a = 0; a < prefix; a += PREFILL_ROWS) {
        const int b = std::min(prefix, a + PREFILL_ROWS);
        rows.resize(b - a);
        for (int j = 0; j < b - a; ++j) rows[j] = j;
        ctx->runner.run({pass_rows(cache, tokens, a, b, true, rows)}, n_threads(), out + (size_t) a * hp_.n_vocab);
    }
    if (open_block > 0) {
        rows.resize(open_block);
        for (int j = 0; j < open_block; ++j) rows[j] = j;
        SequenceRows block = pass_rows(cache, tokens, prefix, n, false, rows);
        block.draft_lora = draft_lora;
        ctx->runner.run({block}, n_threads(), out + (size_t) prefix * hp_.n_vocab);
    }
    for (size_t i = 0; i < (size_t) n * hp_.n_vocab; ++i)
        if (!std::isfinite(out[i])) throw Error(path() + ": the forward pass produced NaN/Inf logits (corrupt weights?)");
}

}  // namespace diffuse
