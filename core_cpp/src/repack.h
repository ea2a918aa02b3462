// ggml's CPU "repack" buffer: quantised weights (Q4_0, Q4_K, Q6_K, Q8_0, ... as this CPU allows)
// stored in an interleaved layout whose batched mat-mul is much faster; llama.cpp uses it by
// default. Data is converted when copied in, so repacked weights live in memory, not in the mapping.
#pragma once

struct ggml_tensor;
struct ggml_backend_buffer_type;

namespace diffuse {

// The repack buffer type, or nullptr when this build/CPU has none.
ggml_backend_buffer_type * cpu_repack_buffer_type();

// Whether ggml would run `weight` (a 2-D matrix multiplied by F32 activations) from the repack buffer.
bool can_repack(ggml_tensor * weight);

}  // namespace diffuse
