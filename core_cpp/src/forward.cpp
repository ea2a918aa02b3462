#include "forward.h"

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>
#include <utility>

namespace diffuse {

// Graph size: about 26 nodes per layer plus 16 per layer and sequence (attention, cache writes,
// views), plus for MoE about 20 per layer and 2 per used expert (router, the k-way sum); sized per
// shape, since a larger graph costs a larger hash set to clear on every plan.
static size_t graph_nodes(const HParams & hp, size_t n_seq) {
    const int64_t moe = hp.moe() ? 40 + 2 * hp.n_expert_used : 0;   // + groups, weight norm, shared expert
    const int64_t gemma = hp.canvas_length > 0 ? 80 : 0;              // post-norms, GELU, router scale
    return 96 + 8 * n_seq + hp.n_layer * (40 + moe + gemma + 24 * n_seq);
}

// ---- KVCache ----

static std::atomic<uint64_t> next_cache_id{1};

KVCache::KVCache(const ModelImpl & model, int n_ctx) : n_ctx_(n_ctx), id_(next_cache_id.fetch_add(1)) {
    const HParams & hp = model.hparams();
    const size_t n_tensors = 2 * hp.n_layer;
    ggml_init_params ip = {ggml_tensor_overhead() * n_tensors, nullptr, /*no_alloc*/ true};
    ctx_ = ggml_init(ip);
    if (!ctx_) throw Error("cannot create the KV cache context");
    const ggml_type type = model.kv_f16() ? GGML_TYPE_F16 : GGML_TYPE_F32;
    double rows = 0;   // K row values summed over the layers
    for (int il = 0; il < hp.n_layer; ++il) rows += (double) model.layer(il).kv_row();
    // Refused up front rather than allocated: with overcommit a too-large buffer "succeeds" and
    // the kernel's OOM killer ends the process when the pages are touched.
    const double need = 2.0 * rows * n_ctx * ggml_type_size(type);
    if (need > (double) physical_memory_bytes())
        throw Error("the K/V cache for " + std::to_string(n_ctx) + " positions needs " +
                    std::to_string((int64_t) (need / (1 << 20))) + " MiB, more than this machine's memory");
    for (int il = 0; il < hp.n_layer; ++il) {
        k.push_back(ggml_new_tensor_2d(ctx_, type, model.layer(il).kv_row(), n_ctx));
        v.push_back(ggml_new_tensor_2d(ctx_, type, model.layer(il).kv_row(), n_ctx));
    }
    buf_ = ggml_backend_alloc_ctx_tensors_from_buft(ctx_, ggml_backend_cpu_buffer_type());
    if (!buf_) {
        ggml_free(ctx_);
        throw Error("out of memory allocating the KV cache (" + std::to_string(n_ctx) + " positions)");
    }
}

KVCache::~KVCache() {
    if (buf_) ggml_backend_buffer_free(buf_);
    if (ctx_) ggml_free(ctx_);
}

// ---- ForwardRunner ----

ForwardRunner::ForwardRunner(const ModelImpl & model) : model_(model) {
    backend_ = ggml_backend_cpu_init();
    if (!backend_) throw Error("cannot initialise the ggml CPU backend");
    galloc_ = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend_));
}

ForwardRunner::~ForwardRunner() {
    if (ctx_) ggml_free(ctx_);
    ggml_gallocr_free(galloc_);
    ggml_backend_free(backend_);
}

// The architecture's graph over this batch: logits (n_vocab, n_out_total).
void ForwardRunner::build(const std::vector<SequenceRows> & seqs) {
    if (ctx_) ggml_free(ctx_);
    const size_t n_nodes = graph_nodes(model_.hparams(), seqs.size());
    graph_meta_.resize(ggml_tensor_overhead() * n_nodes + ggml_graph_overhead_custom(n_nodes, false));
    ggml_init_params ip = {graph_meta_.size(), graph_meta_.data(), /*no_alloc*/ true};
    ctx_ = ggml_init(ip);
    graph_ = ggml_new_graph_custom(ctx_, n_nodes, false);
    std::vector<KVCache *> caches;
    for (const SequenceRows & s : seqs) caches.push_back(s.cache);
    GraphBuilder g(ctx_, model_, shape_, caches, in_);
    ggml_build_forward_expand(graph_, model_.arch().build(g));
}

// Every node of a graph ends in a barrier, where sleeping OpenMP threads must be woken: tens of
// microseconds each on a VM (a 1-row pass of the 4-layer demo model took 5 ms on 2 threads, 0.2 ms
// on 1). A pass gets one more thread per PER_THREAD_FLOPS_PER_NODE x nodes of work, so small passes
// (cached steps of small models) run on fewer threads and large ones on all n_threads.
static constexpr double PER_THREAD_FLOPS_PER_NODE = 4e6;
// Every pass streams all the weights, whatever its rows: on a large model even a 1-row pass is
// memory-bound work that more threads speed up (Qwen2.5-0.5B Q4_K_M, 2-row block step at depth
// 512: 87-98 ms on the one thread flops alone asked for, 69 ms on 2). A weight byte counts as this
// many FLOPs (a Q4 byte is two weights: unpacked, scaled, multiplied and added).
static constexpr double FLOPS_PER_WEIGHT_BYTE = 16;

int ForwardRunner::threads_for_pass(int n_threads) const {
    const HParams & hp = model_.hparams();
    double flops = FLOPS_PER_WEIGHT_BYTE * (double) model_.weights_bytes();
    for (size_t s = 0; s < shape_.n_q.size(); ++s) {
        flops += 2.0 * (double) model_.layer_matmul_params() * shape_.n_q[s];
        flops += 4.0 * hp.n_layer * (double) shape_.n_q[s] * shape_.n_kv[s] * hp.head_dim * hp.n_head;
        flops += 2.0 * (double) hp.n_embd * hp.n_vocab * shape_.n_out[s];
    }
    const double per_thread = PER_THREAD_FLOPS_PER_NODE * ggml_graph_n_nodes(graph_);
    return (int) std::clamp(flops / per_thread, 1.0, (double) std::max(1, n_threads));
}

void ForwardRunner::run(const std::vector<SequenceRows> & seqs, int n_threads, float * logits) {
    const HParams & hp = model_.hparams();
    if (seqs.empty()) throw Error("empty forward batch");
    BatchShape shape;
    for (const SequenceRows & s : seqs) {
        if (!s.cache) throw Error("forward batch: a sequence has no KV cache");
        if (s.tokens.empty() || s.out_rows.empty()) throw Error("empty forward batch");
        if (s.positions.size() != s.tokens.size()) throw Error("forward batch: positions and tokens differ in length");
        if (s.n_kv <= 0 || s.n_kv > s.cache->n_ctx()) throw Error("forward batch: n_kv out of range");
        if (s.attn_block < 0) throw Error("forward batch: negative attention block");
        model_.check_tokens(s.tokens.data(), s.tokens.size());
        if (!s.cache_rows.empty() && s.cache_rows.size() != s.tokens.size())
            throw Error("forward batch: cache rows and tokens differ in length");
        for (const std::vector<int32_t> * v : {&s.positions, &s.cache_rows})
            for (int32_t p : *v)
                if (p < 0 || p >= s.n_kv) throw Error("forward batch: position " + std::to_string(p) + " outside the context");
        for (int32_t r : s.out_rows)
            if (r < 0 || r >= (int) s.tokens.size()) throw Error("forward batch: output row out of range");
        for (uint64_t id : shape.caches)
            if (id == s.cache->id()) throw Error("forward batch: two sequences share a KV cache");
        shape.caches.push_back(s.cache->id());
        shape.n_q.push_back((int) s.tokens.size());
        shape.n_kv.push_back(s.n_kv);
        shape.n_out.push_back((int) s.out_rows.size());
        shape.masked.push_back(s.attn_block > 0 || hp.n_swa > 0);
        if (s.canvas != seqs[0].canvas) throw Error("forward batch: canvas and encoder rows in one pass");
        if (s.canvas == (s.attn_block > 0) && hp.canvas_length > 0)
            throw Error("forward batch: a DiffusionGemma pass is a causal encoder or a bidirectional canvas");
        if (s.self_cond && !s.canvas) throw Error("forward batch: self-conditioning applies to a canvas only");
        if (s.draft_lora != seqs[0].draft_lora) throw Error("forward batch: draft and other passes in one pass");
        shape.self_cond = shape.self_cond || s.self_cond;
    }
    shape.own_head = model_.head_choice().own(model_.weights().output, shape.total_out(), n_threads);
    shape.canvas = seqs[0].canvas;
    shape.draft_lora = seqs[0].draft_lora && hp.draft_lora_rank > 0;
    if (shape.canvas && hp.canvas_length == 0) throw Error("forward batch: this model has no canvas");

    if (!ctx_ || !(shape == shape_)) {
        shape_ = std::move(shape);
        build(seqs);
        if (!ggml_gallocr_alloc_graph(galloc_, graph_)) {
            ggml_free(ctx_);
            ctx_ = nullptr;
            throw Error("out of memory allocating the compute graph (" +
                        std::to_string(shape_.total_q()) + " positions)");
        }
    }

    // Inputs: the sequences' rows one after another.
    std::vector<int32_t> tokens, positions, out_rows;
    std::vector<int64_t> rows;
    for (size_t s = 0, off = 0; s < seqs.size(); off += seqs[s].tokens.size(), ++s) {
        const SequenceRows & q = seqs[s];
        const std::vector<int32_t> & slots = q.cache_rows.empty() ? q.positions : q.cache_rows;
        tokens.insert(tokens.end(), q.tokens.begin(), q.tokens.end());
        positions.insert(positions.end(), q.positions.begin(), q.positions.end());
        for (int32_t r : q.out_rows) out_rows.push_back((int32_t) off + r);
        rows.assign(slots.begin(), slots.end());
        ggml_backend_tensor_set(in_.cache_rows[s], rows.data(), 0, sizeof(int64_t) * rows.size());
        if (!in_.gather_rows.empty()) {
            std::iota(rows.begin(), rows.end(), (int64_t) off);
            ggml_backend_tensor_set(in_.gather_rows[s], rows.data(), 0, sizeof(int64_t) * rows.size());
        }
        if (in_.masks[s]) {
            // Block-causal: query row j (at cache row p) sees cache row r iff block(r) <= block(p).
            // Sliding layers (a second mask) see, of those, the rows from anchor - (n_swa - 1) on,
            // the anchor being the query (causal) or the first row of this pass (a canvas).
            static const uint16_t zero = ggml_fp32_to_fp16(0.0f), minus_inf = ggml_fp32_to_fp16(-INFINITY);
            const int n_kv = q.n_kv, B = q.attn_block;
            for (const bool swa : {false, true}) {
                ggml_tensor * mask = swa ? in_.masks_swa[s] : in_.masks[s];
                if (!mask) continue;
                mask_.assign((size_t) n_kv * slots.size(), minus_inf);
                for (size_t j = 0; j < slots.size(); ++j) {
                    const int p = slots[j];
                    const int end = B > 0 ? std::min(n_kv, (p / B + 1) * B) : n_kv;
                    const int begin = swa ? std::max(0, (B > 0 ? p : slots[0]) - (hp.n_swa - 1)) : 0;
                    if (begin < end) std::fill(mask_.begin() + j * n_kv + begin, mask_.begin() + j * n_kv + end, zero);
                }
                ggml_backend_tensor_set(mask, mask_.data(), 0, sizeof(uint16_t) * mask_.size());
            }
        }
    }
    if (in_.self_cond) {
        // Rows without previous logits get zeros (a uniform softmax) switched off by self_cond_on.
        const size_t V = (size_t) hp.n_vocab;
        for (size_t s = 0, off = 0; s < seqs.size(); off += seqs[s].tokens.size(), ++s) {
            const size_t n = seqs[s].tokens.size();
            sc_on_.assign(n, seqs[s].self_cond ? 1.0f : 0.0f);
            ggml_backend_tensor_set(in_.self_cond_on, sc_on_.data(), off * sizeof(float), n * sizeof(float));
            if (seqs[s].self_cond) {
                ggml_backend_tensor_set(in_.self_cond, seqs[s].self_cond, off * V * sizeof(float), n * V * sizeof(float));
            } else {
                sc_zero_.assign(n * V, 0.0f);
                ggml_backend_tensor_set(in_.self_cond, sc_zero_.data(), off * V * sizeof(float), n * V * sizeof(float));
            }
        }
    }
    ggml_backend_tensor_set(in_.tokens, tokens.data(), 0, sizeof(int32_t) * tokens.size());
    ggml_backend_tensor_set(in_.positions, positions.data(), 0, sizeof(int32_t) * positions.size());
    if (in_.q_scale) {
        std::vector<float> scale;
        for (int32_t p : positions)
            scale.push_back(1.0f + hp.attn_temp_scale * std::log(1.0f + std::floor((float) p / hp.attn_temp_length)));
        ggml_backend_tensor_set(in_.q_scale, scale.data(), 0, sizeof(float) * scale.size());
    }
    ggml_backend_tensor_set(in_.out_rows, out_rows.data(), 0, sizeof(int32_t) * out_rows.size());

    ggml_backend_cpu_set_n_threads(backend_, threads_for_pass(n_threads));
    const ggml_status st = ggml_backend_graph_compute(backend_, graph_);
    if (st != GGML_STATUS_SUCCESS) throw Error("forward pass failed (ggml status " + std::to_string((int) st) + ")");
    ggml_backend_tensor_get(in_.logits, logits, 0, out_rows.size() * (size_t) hp.n_vocab * sizeof(float));
}

void ForwardRunner::routing(size_t s, const std::vector<int32_t> & out_rows, std::vector<int32_t> & experts) const {
    const HParams & hp = model_.hparams();
    const int64_t k = hp.n_expert_used;
    const int n_q = shape_.n_q.at(s);
    experts.assign((size_t) hp.n_layer * n_q * k, -1);
    // Rows of sequence s: in the batch from `off` in every layer but the last; the last layer ran
    // over the sequences' out_rows only, from `out_off`.
    int off = 0, out_off = 0;
    for (size_t i = 0; i < s; ++i) {
        off += shape_.n_q[i];
        out_off += shape_.n_out[i];
    }
    // The chosen experts are the first k of each row of the router's ranking (rows of n_expert):
    // rows [first, first + n) of a layer, k values each, into dst rows.
    std::vector<int32_t> ranked;
    auto read = [&](const ggml_tensor * ranking, int first, int n, const auto & dst_row) {
        const int64_t E = ranking->ne[0];
        ranked.resize((size_t) n * E);
        ggml_backend_tensor_get(ranking, ranked.data(), first * ranking->nb[1], ranked.size() * sizeof(int32_t));
        for (int j = 0; j < n; ++j) std::copy_n(ranked.begin() + j * E, k, dst_row(j));
    };
    // Dense layers (LLaDA2's first) route nothing: their rows stay -1.
    for (int64_t il = 0; il + 1 < hp.n_layer; ++il)
        if (in_.experts[il])
            read(in_.experts[il], off, n_q, [&](int j) { return experts.begin() + (il * n_q + j) * k; });
    if (in_.experts.back())
        read(in_.experts.back(), out_off, (int) out_rows.size(),
             [&](int j) { return experts.begin() + ((hp.n_layer - 1) * n_q + out_rows[j]) * k; });
}

}  // namespace diffuse
