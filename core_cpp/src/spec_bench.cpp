// Self-speculation's passes timed on their own, beside the AR decode token they replace: at `depth`
// rows in the K/V cache (prefilled causally first, as a run does), one AR decode row, and per
// draft length k the draft pass (the seed and k - 1 masks, bidirectional inside the block, logits
// of the masks; also with the draft LoRA when the model has one) and the verify pass (the same k
// rows causally, logits of every row). The passes alternate rep by rep, so every kind sees the
// same machine load.
#include "diffuse.h"

#include "context.h"
#include "model_impl.h"

#include <algorithm>
#include <chrono>

namespace diffuse {

SpecPassTimes bench_spec_passes(const Model & base, int depth, const std::vector<int> & widths, int n_threads, int reps) {
    const ModelImpl & model = static_cast<const ModelImpl &>(base);
    const HParams & hp = model.hparams();
    if (widths.empty() || depth < 1 || reps < 1) throw Error("bench_spec_passes: no draft length, or depth or reps below 1");
    const int max_width = *std::max_element(widths.begin(), widths.end());
    if (*std::min_element(widths.begin(), widths.end()) < 1) throw Error("bench_spec_passes: a draft length below 1");
    if ((int64_t) depth + max_width > hp.n_ctx_train) throw Error("bench_spec_passes: depth + draft length exceed the context");
    const int threads = thread_count(n_threads > 0 ? n_threads : model.n_threads());
    ContextLease ctx = model.lease();
    KVCache & cache = ctx->cache(0, depth + max_width);
    auto rows = [&](int from, int to, int attn_block, int first_out, int masks) {
        SequenceRows r;
        r.cache = &cache;
        r.n_kv = to;
        r.attn_block = attn_block;
        for (int pos = from; pos < to; ++pos) {
            r.tokens.push_back(pos >= to - masks ? hp.mask_token_id : (int32_t) ((pos * 7919LL + 11) % hp.n_vocab));
            r.positions.push_back(pos);
        }
        for (int j = first_out; j < to - from; ++j) r.out_rows.push_back(j);
        return r;
    };
    std::vector<float> logits((size_t) max_width * hp.n_vocab);
    for (int from = 0; from < depth; from += 512) {
        const int to = std::min(depth, from + 512);
        ctx->runner.run({rows(from, to, 1, to - from - 1, 0)}, threads, logits.data());
    }
    struct Pass { SequenceRows rows; std::vector<double> * ms; };
    SpecPassTimes out;
    out.draft_ms.resize(widths.size());
    out.verify_ms.resize(widths.size());
    out.draft_lora_ms.resize(widths.size());
    std::vector<Pass> passes = {{rows(depth - 1, depth, 0, 0, 0), &out.decode_ms}};
    for (size_t i = 0; i < widths.size(); ++i) {
        const int k = widths[i], end = depth - 1 + k;   // the seed at depth - 1, as the loop's
        if (k > 1) passes.push_back({rows(depth - 1, end, 0, 1, k - 1), &out.draft_ms[i]});
        if (k > 1 && hp.draft_lora_rank > 0) {
            passes.push_back({rows(depth - 1, end, 0, 1, k - 1), &out.draft_lora_ms[i]});
            passes.back().rows.draft_lora = true;
        }
        passes.push_back({rows(depth - 1, end, k > 1 ? 1 : 0, 0, 0), &out.verify_ms[i]});
    }
    for (int r = -1; r < reps; ++r) {   // rep -1: warm-up (plans and allocates each graph)
        for (const Pass & p : passes) {
            const auto t0 = std::chrono::steady_clock::now();
            ctx->runner.run({p.rows}, threads, logits.data());
            if (r >= 0) p.ms->push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        }
    }
    return out;
}

}  // namespace diffuse
