// Everything one call mutates: the forward runner (CPU backend and thread count, graph allocator,
// compute buffers, the last graph) and the KV caches. A Context serves one thread at a time; the
// Model lends them out from a pool, so concurrent calls each get their own and repeated calls reuse
// the memory of earlier ones.
#pragma once

#include "forward.h"

#include <memory>
#include <vector>

namespace diffuse {

class Context {
public:
    explicit Context(const ModelImpl & model) : runner(model), model_(model) {}

    ForwardRunner runner;

    // The i-th KV cache of this context, with room for at least n_ctx positions (kept between calls).
    KVCache & cache(size_t i, int n_ctx);

private:
    const ModelImpl & model_;
    std::vector<std::unique_ptr<KVCache>> caches_;
};

// A Context borrowed from the model's pool; returned when the lease ends.
class ContextLease {
public:
    ContextLease(const ModelImpl & model, std::unique_ptr<Context> ctx) : model_(model), ctx_(std::move(ctx)) {}
    ~ContextLease();
    ContextLease(const ContextLease &) = delete;
    ContextLease & operator=(const ContextLease &) = delete;
    Context * operator->() const { return ctx_.get(); }

private:
    const ModelImpl & model_;
    std::unique_ptr<Context> ctx_;
};

}  // namespace diffuse
