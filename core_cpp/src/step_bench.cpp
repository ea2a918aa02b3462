// One block-diffusion denoising step as the loop runs it, timed on its own: `width` new rows
// (a block) against `depth` rows already in the K/V cache, logits for every new row (each is a
// masked position a rule may commit). The prompt of `depth` rows is prefilled first, as a run does.
#include "diffuse.h"

#include "context.h"
#include "model_impl.h"

#include <chrono>

namespace diffuse {

std::vector<double> bench_block_step(const Model & base, int depth, int width, int n_threads, int reps, int masked,
                                     std::vector<int32_t> * experts) {
    const ModelImpl & model = static_cast<const ModelImpl &>(base);
    const HParams & hp = model.hparams();
    if (!hp.block_diffusion()) throw Error("bench_block_step: not a block-diffusion model");
    if (width <= 0 || depth < 0 || reps <= 0 || depth % width != 0)
        throw Error("bench_block_step: width must be positive and divide depth, reps positive");
    if (masked < 0 || masked > width) throw Error("bench_block_step: masked must be between 0 and width");
    if ((int64_t) depth + width > hp.n_ctx_train) throw Error("bench_block_step: depth + width exceed the context");
    ContextLease ctx = model.lease();
    KVCache & cache = ctx->cache(0, depth + width);
    const int threads = n_threads > 0 ? thread_count(n_threads) : model.n_threads();
    auto rows = [&](int from, int to, bool all_logits) {
        SequenceRows r;
        r.cache = &cache;
        r.n_kv = to;
        r.attn_block = width;
        for (int pos = from; pos < to; ++pos) {
            r.tokens.push_back((int32_t) ((pos * 7919LL + 11) % hp.n_vocab));
            r.positions.push_back(pos);
        }
        for (int j = all_logits ? 0 : to - from - 1; j < to - from; ++j) r.out_rows.push_back(j);
        return r;
    };
    std::vector<float> logits((size_t) width * hp.n_vocab);
    const int chunk = std::max(1, 512 / width) * width;
    for (int from = 0; from < depth; from += chunk)
        ctx->runner.run({rows(from, std::min(depth, from + chunk), false)}, threads, logits.data());
    SequenceRows step = rows(depth, depth + width, true);
    for (int j = width - masked; j < width; ++j) step.tokens[j] = hp.mask_token_id;
    ctx->runner.run({step}, threads, logits.data());   // warm-up: plans and allocates the graph
    std::vector<double> ms;
    for (int i = 0; i < reps; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        ctx->runner.run({step}, threads, logits.data());
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    if (experts) {
        experts->clear();
        if (hp.moe()) ctx->runner.routing(0, step.out_rows, *experts);
    }
    return ms;
}

}  // namespace diffuse
