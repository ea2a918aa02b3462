// diffuse: a CPU engine for masked diffusion language models (LLaDA, Dream) on GGML.
//
// Usage:
//   auto model = diffuse::Model::load("llada-8b-q4_k_m.gguf", {});   // throws diffuse::Error
//   std::vector<float> logits = model->forward({1, 2, 3});           // (n_tokens, n_vocab), row-major
//
//   diffuse::GenerateParams p = diffuse::default_generate_params(model->hparams().family);
//   p.gen_length = 128; p.scheduler = diffuse::Scheduler::EntropyExit;
//   diffuse::GenerateOutput out = diffuse::generate(*model, prompt_ids, p,
//       [](const diffuse::StepEvent & ev) { return true; /* false cancels */ });
//
// Every failure (bad file, bad input, cancelled run) is a diffuse::Error with a message that names
// the file and the problem; nothing aborts the process.
//
// Threads: a Model is immutable after load and safe to share. forward_into, generate, generate_batch
// and generate_stream may run on one Model from any number of threads at once: each call borrows a
// context of its own (compute buffers, KV caches, CPU backend) from the model's pool and returns it
// when done, so repeated calls reuse memory instead of reallocating. set_n_threads only changes
// the default of later calls. A StepEvent and every vector it points to live only during the
// callback: copy what you keep.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace diffuse {

struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Model families: each has its own loop, defaults and chat conventions; several architectures (GGUF
// general.architecture, architectures.h) may share one (LLaDA-MoE is LLaDA's, LLaDA2 SDAR's). LLaDA and Dream attend to the whole
// sequence; SDAR (and TraDo) and Fast-dLLM v2 are block diffusion (causal across blocks).
// DiffusionGemma is uniform-state diffusion: a causal encoder writes the prompt's (and each finished
// canvas's) K/V, a bidirectional decoder denoises a canvas of random tokens over that cache.
// NemotronDiffusion (Nemotron-Labs-Diffusion) is trained for three modes over one causal K/V cache:
// AR, diffusion of blocks over the cached prefix, and self-speculation (loops/causal.h).
// WeDLM (Tencent) decodes diffusion-style under plain causal attention: a sliding window whose
// filled tokens run first at their true positions (loops/wedlm.h).
enum class Family { LLaDA, Dream, SDAR, FastDLLMv2, DiffusionGemma, NemotronDiffusion, WeDLM };
enum class Dialect { Ours, LlamaCpp, DiffuseCpp };

// Hyper-parameters, read from any of the three GGUF dialects.
struct HParams {
    Family   family;        // whose loop, schedules and defaults apply
    const char * arch;      // the architecture, as the engine names it ("llada2"; a diffuse-cpp file: its family's)
    Dialect  dialect;
    int64_t  n_vocab;
    int64_t  n_embd;        // d_model
    int64_t  n_layer;
    int64_t  n_head;
    int64_t  n_head_kv;     // < n_head for GQA (Dream: 28 q / 4 kv heads)
    int64_t  n_ff;
    int64_t  n_ctx_train;
    int64_t  head_dim;      // {arch}.attention.key_length, else n_embd / n_head
    float    rope_theta;
    float    rms_eps;
    int      rope_mode;     // GGML_ROPE_TYPE_NEOX or 0 (NORM, for llama.cpp's permuted LLaDA q/k)
    bool     shift_logits;  // Dream: position i takes the logits of position i-1
    int32_t  mask_token_id;
    int32_t  file_type;     // general.file_type (llama_ftype), -1 when absent
    // Mixture of experts (LLaDA-MoE, GGUF arch "llada-moe"); n_expert = 0 for a dense model.
    int64_t  n_expert;      // routed experts per layer
    int64_t  n_expert_used; // experts each position uses (top k of the router's softmax)
    int64_t  n_ff_exp;      // hidden size of one expert's SwiGLU
    bool     qk_norm;       // RMSNorm of q and k over the head dimension before RoPE (LLaDA-MoE, SDAR)
    int64_t  n_rot;         // {arch}.rope.dimension_count: RoPE rotates the first n_rot of head_dim (LLaDA2: half)
    // YaRN RoPE ({arch}.rope.scaling.*, Ministral3 / Nemotron-Labs-Diffusion): frequencies interpolated by
    // rope_freq_scale = 1 / factor outside the [beta_slow, beta_fast] rotation ramp over rope_orig_ctx
    // positions, cos and sin times rope_attn_factor. Plain RoPE: scale 1, rope_yarn false.
    bool     rope_yarn;
    float    rope_freq_scale, rope_attn_factor, rope_beta_fast, rope_beta_slow;
    int64_t  rope_orig_ctx;
    // Llama-4 query scale (Ministral3): after RoPE, q *= 1 + attn_temp_scale * ln(1 + floor(pos /
    // attn_temp_length)); attn_temp_scale 0: none.
    float    attn_temp_scale;
    int64_t  attn_temp_length;
    // Nemotron-Labs-Diffusion: the block it was trained on (diffusion.block_size, 32), the default
    // block of its diffusion mode; its attention is causal, so block_size (the mask's) stays 0.
    int      trained_block;
    // Its draft LoRA (linear_spec_lora/ converted: blk.N.attn_output.weight.lora_a/b): the o_proj
    // update scale * B A x that self-speculation's draft passes add (only they); rank 0: none.
    int      draft_lora_rank;
    float    draft_lora_scale;
    // The router (LLaDA2: sigmoid scores, a selection bias, group-limited top-k, normalised and scaled
    // weights, shared experts, leading dense layers); LLaDA-MoE: softmax, 1 group, neither.
    bool     router_sigmoid;       // {arch}.expert_gating_func 2 (sigmoid), else 1 (softmax)
    int64_t  n_expert_groups;      // {arch}.expert_group_count: experts in this many equal groups
    int64_t  n_group_used;         // {arch}.expert_group_used_count: top-k only inside the best groups
    bool     expert_weights_norm;  // weights of the k chosen divided by their sum
    float    expert_weights_scale; // then multiplied by this (routed_scaling_factor)
    int64_t  n_expert_shared;      // {arch}.expert_shared_count: shared experts every row also runs (as one SwiGLU)
    int64_t  n_ff_shexp;           // their hidden size, all together
    int64_t  n_layer_dense;        // {arch}.leading_dense_block_count: the first layers are a dense SwiGLU of n_ff
    // Block diffusion: attention is causal across blocks of block_size positions (aligned at
    // position 0) and bidirectional inside one; 0 for models that attend to the whole sequence.
    int      block_size;
    int      sub_block_size;  // diffusion.sub_block_size: decoded in sub-blocks of this size (Fast-dLLM v2: 8); 0: none
    // DiffusionGemma (Gemma 4 blocks): the canvas the decoder denoises, the sliding layers' window
    // (a query sees this many positions, itself included), the final logits' softcap c
    // (c tanh(logits / c)); 0 for the other families. Per-layer head sizes, KV heads and RoPE are
    // the model's (sliding and full layers differ); head_dim / n_head_kv here are the full layers'.
    int      canvas_length;
    int      n_swa;
    float    logit_softcap;
    bool moe() const { return n_expert > 0; }
    bool block_diffusion() const { return block_size > 0; }
};

class Model;

// ---------------------------------------------------------------------------------------------
// Denoising
// ---------------------------------------------------------------------------------------------

// Which masked positions to commit each step. The first three follow LLaDA's generate.py and the
// paper; the Dream ones follow Dream's generation_utils.
enum class Scheduler {
    LowConfidence,  // LLaDA: commit the k masked positions with the highest p(x0)
    Random,         // LLaDA: k positions chosen uniformly at random
    EntropyExit,    // paper: commit max(k, #masked with entropy < threshold); stop when none masked
    Origin,         // Dream: each mask commits with probability 1 - s/t
    MaskgitPlus,    // Dream: top-1 probability
    TopkMargin,     // Dream: p1 - p2
    Entropy,        // Dream: negative entropy
    // Block diffusion (SDAR's generate.py, LLaDA2, Fast-dLLM); confidence = probability of x0.
    LowConfidenceDynamic,  // every position above confidence_threshold if at least k are, else the top k
    LowConfidenceStatic,   // the k most confident
    ConfidenceThreshold,   // Fast-dLLM: every position >= confidence_threshold, at least the top one
    EntropyBounded,        // EB-sampler: lowest entropies while their sum minus the largest <= entropy_budget
    ConfidenceFactor,      // Fast-dLLM's factor rule: the n most confident while the n-th >= 1 - factor / (n + 1)
};

// Full-attention models: which rows a step recomputes with the inter-step cache on.
enum class CachePolicy {
    Active,   // the paper's: masked in the block + changed within keep_active steps; refresh_every
    Prefix,   // Fast-dLLM PrefixCache: a full pass at each block's start, then the block and everything after it
    Dual,     // Fast-dLLM DualCache: a full pass at each block's start, then the block's rows only
};

// When the answer is over before its last block.
enum class EosStop {
    None,      // never: every block is decoded
    AllEos,    // a finished block that is all end-of-text
    HoldsEos,  // a finished block holding end-of-text (dInfer; SDAR's and LLaDA2's loops)
    Prefix,    // as soon as the decided prefix of the answer holds end-of-text (Fast-dLLM v2), mid-block
};

// The decoding modes (GenerateParams::mode).
enum class Decoding { Diffusion, AR, SelfSpec };

// How many positions each step commits.
enum class Schedule {
    LLaDABlocks,    // even counts per block, remainder to the first steps
    DreamEps,       // timesteps linspace(1, eps, steps+1), k = n_mask * (1 - s/t)
};

struct GenerateParams {
    int       gen_length     = 128;   // generated positions appended to the prompt
    int       steps          = 128;   // step budget for the whole run (per block: steps / blocks, at most the block length);
                                      // block-diffusion models: steps per block (SDAR's denoising_steps)
    int       block_length   = 32;    // semi-autoregressive block size; <= 0: gen_length (block
                                      // diffusion: the model's block size)
    int       sub_block_length = 0;   // block diffusion: a block's masks are decoded sub-block after
                                      // sub-block, each pass still over the whole block; 0: the
                                      // model's own (Fast-dLLM v2: 8), else the whole block
    Scheduler scheduler      = Scheduler::LowConfidence;
    float     threshold      = 1.5f;  // entropy_exit tau, nats
    float     confidence_threshold = 0.9f;  // low_confidence_dynamic / confidence_threshold tau, a probability
    float     entropy_budget = 0.35f; // entropy_bounded: sum of entropies minus the largest, nats
    float     factor         = 1.0f;  // confidence_factor: the n-th most confident needs >= 1 - factor / (n + 1)
    bool      carry_first    = false; // shifted logits: a block's first position alone, from the row before
                                      // it, in a step of its own (always on for block diffusion)
    bool      cache          = true;  // inter-step KV cache
    CachePolicy cache_policy = CachePolicy::Active;  // full attention: rows a cached step recomputes
    int       suffix_window  = -1;    // full attention: positions after the block a step sees (DPad);
                                      // -1: all, 0: none
    EosStop   eos_stop       = EosStop::AllEos;
    float     editing_threshold = 1.0f;  // LLaDA2.1 token-to-token editing: a committed answer position of
                                      // the current block takes x0 when x0 differs and is more than this
                                      // likely; 1: off (block diffusion without shifted logits only)
    int       max_post_steps = 0;     // editing: passes over a block after its last mask, while they edit
    int       keep_active    = 2;     // a position stays active this many steps after it changed
                                      // (2: fidelity 0.84 vs 0.83 at 1 on the demo model)
    int       refresh_every  = 0;     // full recompute every N steps (0: only at step 0; 1: exact)
    float     temperature    = 0.0f;
    int       top_k          = 0;     // 0: off
    float     top_p          = 1.0f;  // 1: off
    float     alg_temp       = 0.0f;  // Dream: > 0 samples which positions to commit
    float     cfg_scale      = 0.0f;  // LLaDA classifier-free guidance (0: off)
    float     eps            = 1e-3f; // Dream timestep floor
    uint64_t  seed           = 0;
    int       n_threads      = 0;     // 0: the model's thread count; capped at the logical CPU count
    // DiffusionGemma (uniform-state diffusion): the temperature falls linearly from `temperature`
    // to `temperature_end` over a canvas's steps; the canvas stops early once its argmax has stood
    // `stability` steps and the mean entropy is below `stop_entropy`. steps: per canvas;
    // entropy_budget: the entropy bound of the acceptance rule.
    float     temperature_end = 0.4f;
    int       stability      = 1;
    float     stop_entropy   = 0.005f;
    std::vector<int32_t> eos_ids;     // end-of-text ids (early stop, useful length)
    bool      expert_routing = false; // MoE: fill StepEvent::experts (costs a copy per step)
    // How the answer is decoded (loops/causal.h). Diffusion: the model's own loop. AR: causal
    // prefill, then one token per causal pass over the K/V cache. SelfSpec (Nemotron-Labs-Diffusion's
    // linear_spec_generate): per iteration a bidirectional pass drafts [seed, draft_length - 1
    // masks] over the cache, a causal pass verifies the block and writes its K/V, and the longest
    // prefix where draft == the AR choice is kept plus that pass's next token: AR's output exactly.
    Decoding  mode           = Decoding::Diffusion;
    int       draft_length   = 32;    // self_spec: rows of a draft (the seed and draft_length - 1 masks)
    bool      draft_lora     = true;  // self_spec: draft passes add the model's draft LoRA, when it has one
    // WeDLM (its diffusion mode; `threshold` is its entropy threshold): the window's width, and the
    // penalty per position after the window's first mask added to a mask's entropy.
    int       window_size    = 16;
    float     pos_penalty    = 0.02f;
};

// Per-family defaults (LLaDA: low_confidence in blocks of 32; Dream: its entropy rule, no blocks;
// block diffusion: the model's block, one step per position, low_confidence_dynamic greedy).
GenerateParams default_generate_params(Family family);

// One denoising step, as seen by listeners. Positions are absolute (prompt included).
struct StepEvent {
    int sequence;                             // index of the prompt in a batch or stream (0 for generate)
    int step, block, n_blocks, steps_allowed;
    int prompt_length, block_start, block_end;
    int scheduled;                            // positions the schedule asked for; a rule may commit more (tau)
    const std::vector<int32_t> * tokens;      // (n_total,)
    const std::vector<uint8_t> * mask;        // (n_total,), 1 = still masked
    const std::vector<int32_t> * unmasked;    // committed this step
    const std::vector<float>   * entropy;     // (n_total,), NaN where not evaluated
    const std::vector<float>   * confidence;  // (n_total,), top-1 probability, NaN where not evaluated
    const std::vector<int32_t> * active;      // recomputed positions
    const std::vector<int32_t> * cached;      // positions served from the cache
    double forward_ms, sample_ms, total_ms;   // forward_ms: the pass shared by the whole batch
    // MoE with expert_routing: the experts each active position used, (n_layer, active.size(),
    // n_expert_used) row-major, best first; -1 in the last layer for rows whose logits were not
    // needed (only those go through its FFN). Empty otherwise.
    const std::vector<int32_t> * experts;
    // editing_threshold < 1: committed positions whose token this step replaced (the previous
    // event's tokens hold what they were). Empty otherwise.
    const std::vector<int32_t> * edited;
    // DiffusionGemma: tokens hold the canvas this step denoised (the context before it); unmasked
    // the positions accepted (they take the drawn token), redrawn the others (a uniform random
    // token next); draft the argmax canvas (the canvas's output if it stops here); entropy_cut
    // the largest accepted entropy: a position is accepted when its entropy is at most this (the
    // lowest entropies, as many as keep their sum minus the largest within entropy_budget).
    // nullptr / NaN for the other families.
    const std::vector<int32_t> * redrawn = nullptr;
    const std::vector<int32_t> * draft = nullptr;
    float entropy_cut = 0.0f;
    // mode self_spec: the block [block_start, block_end) this iteration drafted and verified:
    // spec_draft its tokens as drafted (the seed, committed before, then the draft), spec_accepted
    // how many drafts the verify pass kept; the bonus token follows them, at block_start + 1 +
    // spec_accepted (tokens holds it), and spec_draft[spec_accepted + 1], if any, was the first rejected.
    // nullptr / -1 in the other modes.
    const std::vector<int32_t> * spec_draft = nullptr;
    int spec_accepted = -1;
    // WeDLM: window_order the window's positions in the order its causal pass ran them (filled
    // first, at their true RoPE positions, then the masks); committed the leading filled positions
    // whose exact causal K/V the pass wrote for good (the window slides past them). Positions past
    // the answer's end, where the window may reach, are left out. nullptr for the other families.
    const std::vector<int32_t> * window_order = nullptr;
    const std::vector<int32_t> * committed = nullptr;
};

// Return false to cancel (that sequence only, in a batch); an exception thrown here ends the whole
// run and propagates to the caller. Called on the thread that called generate.
using StepCallback = std::function<bool(const StepEvent &)>;

struct GenerateOutput {
    std::vector<int32_t> tokens;         // (gen_length,), final generated positions; block diffusion: up
                                         // to the end of the last block (the run is whole blocks)
    std::vector<int32_t> decided_step;   // (tokens.size(),), step at which each position was committed
    std::vector<double>  step_ms, forward_ms, sample_ms;
    double               prefill_ms = 0;  // block diffusion: the prompt's whole blocks, once (not a step)
    int                  steps = 0;
    int                  steps_allowed = 0;
    int                  forward_passes = 0;  // AR and self_spec: passes run (prefill chunks not counted)
    std::string          stop_reason;    // "done", "eos", "cancelled"; "error" for an item generate_stream refused
    std::string          error;          // why it was refused
};

GenerateOutput generate(const Model & model, const std::vector<int32_t> & prompt,
                        const GenerateParams & params, const StepCallback & on_step);

// Several prompts denoised together: each step is one forward pass over the active rows of every
// unfinished sequence (attention stays within a sequence). Each sequence keeps its own options,
// schedule, cache and early stop; a pass runs with the thread count of its first sequence.
// Outputs in prompt order; a bad prompt or option throws (naming the prompt) before any step.
struct BatchItem {
    std::vector<int32_t> prompt;
    GenerateParams params;
};
std::vector<GenerateOutput> generate_batch(const Model & model, const std::vector<BatchItem> & items,
                                           const StepCallback & on_step);

// A batch that sequences join and leave while it runs (a server's requests). At every step boundary
// the sequences that ended (done, eos, cancelled) are handed to finished(), then admit() gives the
// new ones: they join that step's forward pass, numbered on from the earlier ones (0, 1, 2... over
// the whole stream). An ended sequence's K/V cache goes to a later one, so the memory of a long
// stream is that of its most concurrent step. An item whose prompt or options are refused fails
// alone: finished() gets it at once with stop_reason "error" and the reason in `error`; the others
// run on. An exception thrown by admit or finished ends the stream and propagates. Returns when no sequence runs and admit() gives none, with the number of K/V
// caches the stream held (one per running sequence, two with cfg_scale, at the busiest step).
struct BatchFeed {
    std::function<std::vector<BatchItem>()> admit;
    std::function<void(int sequence, GenerateOutput && out)> finished;
};
int generate_stream(const Model & model, const BatchFeed & feed, const StepCallback & on_step);

// ---------------------------------------------------------------------------------------------
// Model
// ---------------------------------------------------------------------------------------------

struct LoadParams {
    int  n_threads = 0;   // 0: the physical cores this process may use (hyper-threads cost ~12%);
                          // capped at the logical CPU count
    // Copy quantised matrices into ggml's interleaved CPU layout instead of using them from the
    // mapping. A large gain on AVX2-only and ARM CPUs; slower for Q4_K on AVX512-VNNI (measured:
    // 122 vs 267 GFLOP/s single-thread), so off by default: weights stay memory-mapped.
    bool repack = false;
    // Attention through ggml_flash_attn_ext: scores in tiles, never an (n_q, n_kv, n_head) matrix,
    // so compute memory grows O(n) with the context. false: the materialised softmax(QK^T) path.
    bool flash_attn = true;
    // K/V cache in F16 (half the memory of F32; logits differ from F32 by ~1e-3 relative).
    bool kv_f16 = true;
};

class Model {
public:
    static std::unique_ptr<Model> load(const std::string & path, const LoadParams & params);
    virtual ~Model() = default;

    virtual const HParams & hparams() const = 0;
    virtual const std::string & path() const = 0;
    virtual int n_threads() const = 0;
    virtual void set_n_threads(int n) = 0;

    // Logits under the model's attention pattern (bidirectional, or block-causal with the model's
    // block size), before any logit shift: (n_rows, n_vocab) row-major for
    // the positions in `rows` (every position when empty). A diffusion step needs only the masked
    // positions of its block, so the head runs over those rows only.
    // forward_into writes them to `out`, which holds rows.size() (or tokens.size()) * n_vocab floats.
    // block_size of a block-diffusion model: the blocks of a run with another block_length (< 0:
    // the model's own).
    // DiffusionGemma: the canvas's logits (canvas.size(), n_vocab) after the context is encoded
    // causally into a cache the decoder reads; self_cond: the previous step's (processed) logits of
    // the canvas, (canvas.size(), n_vocab) row-major, or nullptr for the first step.
    virtual void forward_canvas(const std::vector<int32_t> & context, const std::vector<int32_t> & canvas,
                                const float * self_cond, float * out) const = 0;
    virtual void forward_into(const std::vector<int32_t> & tokens, const std::vector<int32_t> & rows,
                              float * out, int block_size = -1) const = 0;
    // The AR and self-speculation modes' attention: causal logits of every position, (n, n_vocab);
    // open_block > 0: the last open_block positions also see each other (the draft pass of a
    // block over a causal prefix, Nemotron-Labs-Diffusion's diffusion mode); draft_lora: that block's
    // pass adds the draft LoRA (self-speculation's draft pass). Before any logit shift.
    virtual void forward_causal_into(const std::vector<int32_t> & tokens, int open_block, float * out,
                                     bool draft_lora = false) const = 0;
    std::vector<float> forward(const std::vector<int32_t> & tokens, const std::vector<int32_t> & rows = {}) const {
        std::vector<float> out((rows.empty() ? tokens.size() : rows.size()) * hparams().n_vocab);
        forward_into(tokens, rows, out.data());
        return out;
    }

    // Size of the weights in the file, and of those copied into the repack layout, bytes.
    virtual size_t weights_bytes() const = 0;
    virtual size_t repacked_bytes() const = 0;
    virtual bool flash_attn() const = 0;
    virtual bool kv_f16() const = 0;
};

// Physical cores this process may run on, the default thread count (hyper-threads cost more than
// they give: the paper measured 12% slower with them); the logical CPU count when the topology
// cannot be read.
int physical_cores();

// Quantise rows of float32 data (n_rows, n_cols) to a ggml type; returns the raw blocks.
std::vector<uint8_t> quantize_rows(const float * data, int64_t n_rows, int64_t n_cols, int ggml_type);

}  // namespace diffuse

namespace diffuse {

// ggml's own matrix product on this machine: y = W x with W (m, k) of `ggml_type`, x (k, n) F32.
// Returns the best wall time of `reps` runs, seconds (the ceiling a forward pass is compared to).
// repack: place W in ggml's interleaved CPU layout when it can be (as the model loader does).
double bench_matmul(int ggml_type, int64_t k, int64_t m, int64_t n, int n_threads, int reps, bool repack);

// The output head's product both ways on this machine, W (m, k) of `ggml_type` (random, plain layout),
// x (k, n) F32, n <= 32: best wall times (s) of ggml's mat-mul and of the engine's few-row head
// product, alternated run by run.
std::pair<double, double> bench_head(int ggml_type, int64_t k, int64_t m, int64_t n, int n_threads, int reps);

// y = W x, row-major (n, m): W given as m rows of `ggml_type` blocks (k values each), x as n rows of
// k floats; by the engine's few-row head product (own) or by ggml's mat-mul. For parity tests.
std::vector<float> head_matmul(int ggml_type, const uint8_t * w, size_t w_bytes, int64_t m, int64_t k, const float * x, int64_t n,
                               bool own, int n_threads);

// One block-diffusion step on its own: `width` new rows against `depth` cached rows (prefilled
// first), logits for each new row (a full-attention model's rows attend over all of them). Wall time of each of `reps` passes after a warm-up, ms.
// The new rows are distinct tokens except the last `masked`, which hold the mask token (a decoding
// step's block: committed tokens, then masks). logit_rows: logits of the last `logit_rows` rows
// only (1: the work of llama.cpp's prompt pass, which separates the output head's share); 0: every
// row. experts: if given, an MoE model's routing of the step's rows, (n_layer, width,
// n_expert_used) row-major, best first (-1 for a dense layer's rows).
std::vector<double> bench_block_step(const Model & model, int depth, int width, int n_threads, int reps,
                                     int masked = 0, int logit_rows = 0, std::vector<int32_t> * experts = nullptr);

// Several steps over one prefilled prompt of `depth` rows (the prefill is what costs most at
// depth), in the order given: each case `reps` timed passes after a warm-up, and with `routing`
// an MoE model's choices for its rows as above. Every width must divide depth.
struct BlockStepCase {
    int width;
    int masked = 0;
    int threads = 0;      // 0: the model's
    int logit_rows = 0;   // the last logit_rows rows' logits; 0: every row's
};
struct BlockStepResult {
    std::vector<double> ms;
    std::vector<int32_t> experts;
};
std::vector<BlockStepResult> bench_block_steps(const Model & model, int depth, const std::vector<BlockStepCase> & cases,
                                               int reps, bool routing);

// Self-speculation's passes at `depth` cached rows (spec_bench.cpp): ms per AR decode row, and per
// draft length k (widths) per draft pass (the seed and k - 1 masks, bidirectional) and verify pass
// (k rows, causal); k = 1 has no draft pass (draft_ms empty). `reps` timed passes of each, alternating.
struct SpecPassTimes {
    std::vector<double> decode_ms;
    std::vector<std::vector<double>> draft_ms, verify_ms;   // per width
    std::vector<std::vector<double>> draft_lora_ms;         // per width: the draft with the draft LoRA (empty without one)
};
SpecPassTimes bench_spec_passes(const Model & model, int depth, const std::vector<int> & widths, int n_threads, int reps);

}  // namespace diffuse
