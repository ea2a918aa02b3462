// One block-diffusion denoising step as the loop runs it, timed on its own: `width` new rows
// (a block) against `depth` rows already in the K/V cache, logits for every new row (each is a
// masked position a rule may commit), or for the last few only. The prompt of `depth` rows is
// prefilled first, as a run does. On a full-attention model the same pass attends over every
// row (a cached step's active rows against the cached K/V), so `bench knee` measures any family.
#include "diffuse.h"

#include "context.h"
#include "model_impl.h"

#include <algorithm>
#include <chrono>

namespace diffuse {

std::vector<BlockStepResult> bench_block_steps(const Model & base, int depth, const std::vector<BlockStepCase> & cases,
                                               int reps, bool routing) {
    const ModelImpl & model = static_cast<const ModelImpl &>(base);
    const HParams & hp = model.hparams();
    if (cases.empty() || depth < 0 || reps <= 0) throw Error("bench_block_step: no case, or depth negative, or reps not positive");
    int max_width = 0;
    for (const BlockStepCase & c : cases) {
        if (c.width <= 0 || depth % c.width != 0)
            throw Error("bench_block_step: width must be positive and divide depth");
        if (c.masked < 0 || c.masked > c.width) throw Error("bench_block_step: masked must be between 0 and width");
        if (c.logit_rows < 0 || c.logit_rows > c.width)
            throw Error("bench_block_step: logit_rows must be between 0 (every row) and width");
        max_width = std::max(max_width, c.width);
    }
    if ((int64_t) depth + max_width > hp.n_ctx_train) throw Error("bench_block_step: depth + width exceed the context");
    ContextLease ctx = model.lease();
    KVCache & cache = ctx->cache(0, depth + max_width);
    auto rows = [&](int from, int to, int block, int logit_rows) {
        SequenceRows r;
        r.cache = &cache;
        r.n_kv = to;
        r.attn_block = hp.block_diffusion() ? block : 0;
        for (int pos = from; pos < to; ++pos) {
            r.tokens.push_back((int32_t) ((pos * 7919LL + 11) % hp.n_vocab));
            r.positions.push_back(pos);
        }
        for (int j = to - from - logit_rows; j < to - from; ++j) r.out_rows.push_back(j);
        return r;
    };
    std::vector<float> logits((size_t) max_width * hp.n_vocab);
    // The prompt once, in blocks of the widest case (every width divides depth, so it does too).
    const int chunk = std::max(1, 512 / max_width) * max_width;
    const int prefill_threads = thread_count(cases[0].threads > 0 ? cases[0].threads : model.n_threads());
    for (int from = 0; from < depth; from += chunk)
        ctx->runner.run({rows(from, std::min(depth, from + chunk), max_width, 1)}, prefill_threads, logits.data());
    std::vector<BlockStepResult> out(cases.size());
    for (size_t i = 0; i < cases.size(); ++i) {
        const BlockStepCase & c = cases[i];
        const int threads = c.threads > 0 ? thread_count(c.threads) : model.n_threads();
        SequenceRows step = rows(depth, depth + c.width, c.width, c.logit_rows > 0 ? c.logit_rows : c.width);
        for (int j = c.width - c.masked; j < c.width; ++j) step.tokens[j] = hp.mask_token_id;
        ctx->runner.run({step}, threads, logits.data());   // warm-up: plans and allocates the graph
        for (int r = 0; r < reps; ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            ctx->runner.run({step}, threads, logits.data());
            out[i].ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        }
        if (routing && hp.moe()) ctx->runner.routing(0, step.out_rows, out[i].experts);
    }
    return out;
}

std::vector<double> bench_block_step(const Model & base, int depth, int width, int n_threads, int reps, int masked,
                                     int logit_rows, std::vector<int32_t> * experts) {
    std::vector<BlockStepResult> r =
        bench_block_steps(base, depth, {{width, masked, n_threads, logit_rows}}, reps, experts != nullptr);
    if (experts) *experts = std::move(r[0].experts);
    return std::move(r[0].ms);
}

}  // namespace diffuse
