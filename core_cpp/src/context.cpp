#include "context.h"

namespace diffuse {

KVCache & Context::cache(size_t i, int n_ctx) {
    if (caches_.size() <= i) caches_.resize(i + 1);
    if (!caches_[i] || caches_[i]->n_ctx() < n_ctx) {
        caches_[i].reset();   // free the old one first: peak memory is one cache, not two
        caches_[i] = std::make_unique<KVCache>(model_, n_ctx);
    }
    return *caches_[i];
}

ContextLease::~ContextLease() { model_.give_back(std::move(ctx_)); }

ContextLease ModelImpl::lease() const {
    std::unique_ptr<Context> ctx;
    {
        std::lock_guard<std::mutex> lock(pool_mutex_);
        if (!pool_.empty()) {
            ctx = std::move(pool_.back());
            pool_.pop_back();
        }
    }
    if (!ctx) ctx = std::make_unique<Context>(*this);
    return ContextLease(*this, std::move(ctx));
}

void ModelImpl::give_back(std::unique_ptr<Context> ctx) const {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    pool_.push_back(std::move(ctx));
}

}  // namespace diffuse
