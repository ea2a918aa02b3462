// WeDLM (Tencent; github.com/Tencent/WeDLM, wedlm/engine/wedlm_decoder.py and sampler.py): diffusion
// under plain causal attention. A sequence's window lies after its committed prefix, whose causal
// K/V the cache holds. Each pass (one step):
// - runs the window's filled tokens first, at their true RoPE positions, then its masks, causally
//   in that order: the K/V rows follow the pass order, so no filled token sees a mask;
// - the filled tokens at the window's head were filled before this pass and see only the prefix and
//   each other: their K/V are exact causal ones, and the window slides past them (committed);
// - each mask row gives its own position's token (argmax, or a draw; no shift) and entropy; the
//   masks whose entropy + pos_penalty x (distance from the first mask) is below threshold are
//   filled, else the lowest alone;
// - before the next pass the window grows by as many masks as its head has filled tokens: a pass
//   runs window_size positions plus the ones it commits.
// generate's loop (loops/causal.cpp) prefills the prompt and runs these passes.
#pragma once

#include "../forward.h"

#include <vector>

namespace diffuse {

class WeDLMWindow {
public:
    // `width` masks from `start`; the window never reaches position `limit` (the cache's size).
    WeDLMWindow(int start, int width, int limit, int32_t mask_id);

    // Grows the window by its head's filled count, then the pass's rows over `cache`: causal in pass
    // order; the logits wanted are the masks' (or the last row's when none is left).
    SequenceRows pass(KVCache * cache);
    // The last pass's positions in its order.
    const std::vector<int32_t> & order() const { return order_; }
    // After the pass: the head's filled positions leave the window (their K/V are final); how many.
    int commit();

    int start() const { return start_; }
    int end() const { return start_ + (int) tokens_.size(); }
    // The masks' positions, ascending (the last pass's mask rows, in order, once committed).
    std::vector<int32_t> masks() const;
    // Which of masks() to fill, as indices, from their entropies (Tencent's select_positions_to_fill).
    std::vector<int> select(const std::vector<float> & entropy, float threshold, float pos_penalty) const;
    void fill(int32_t pos, int32_t token);

private:
    int head() const;   // filled positions at the window's head
    int start_, limit_;
    int32_t mask_id_;
    std::vector<int32_t> tokens_;   // the window's tokens from start_
    std::vector<uint8_t> filled_;
    std::vector<int32_t> order_;
    int n_head_ = 0;                // the head's filled count at the last pass
};

}  // namespace diffuse
