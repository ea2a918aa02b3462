#include "wedlm.h"

#include <algorithm>

namespace diffuse {

WeDLMWindow::WeDLMWindow(int start, int width, int limit, int32_t mask_id)
    : start_(start), limit_(limit), mask_id_(mask_id) {
    const int n = std::max(0, std::min(width, limit - start));
    tokens_.assign(n, mask_id);
    filled_.assign(n, 0);
}

int WeDLMWindow::head() const {
    int n = 0;
    while (n < (int) filled_.size() && filled_[n]) ++n;
    return n;
}

SequenceRows WeDLMWindow::pass(KVCache * cache) {
    // Tencent's _refill_window_masks: as many new masks as the head will commit (the context allowing).
    n_head_ = head();
    const int grow = std::min(n_head_, limit_ - end());
    tokens_.resize(tokens_.size() + grow, mask_id_);
    filled_.resize(filled_.size() + grow, 0);

    SequenceRows r;
    r.cache = cache;
    order_.clear();
    int n_filled = 0;
    for (const bool want : {true, false})
        for (size_t i = 0; i < tokens_.size(); ++i)
            if ((bool) filled_[i] == want) {
                order_.push_back(start_ + (int) i);
                r.tokens.push_back(tokens_[i]);
                n_filled += want;
            }
    const int n = (int) order_.size();
    r.positions = order_;
    for (int j = 0; j < n; ++j) r.cache_rows.push_back(start_ + j);
    r.n_kv = start_ + n;
    r.attn_block = 1;
    for (int j = n_filled; j < n; ++j) r.out_rows.push_back(j);
    if (r.out_rows.empty()) r.out_rows.push_back(n - 1);
    return r;
}

int WeDLMWindow::commit() {
    const int c = n_head_;
    tokens_.erase(tokens_.begin(), tokens_.begin() + c);
    filled_.erase(filled_.begin(), filled_.begin() + c);
    start_ += c;
    n_head_ = 0;
    return c;
}

std::vector<int32_t> WeDLMWindow::masks() const {
    std::vector<int32_t> m;
    for (size_t i = 0; i < tokens_.size(); ++i)
        if (!filled_[i]) m.push_back(start_ + (int) i);
    return m;
}

std::vector<int> WeDLMWindow::select(const std::vector<float> & entropy, float threshold, float pos_penalty) const {
    const std::vector<int32_t> m = masks();
    std::vector<int> chosen;
    int best = 0;
    double best_h = 0;
    for (size_t j = 0; j < m.size(); ++j) {
        const double h = (double) entropy[j] + (double) (m[j] - m[0]) * pos_penalty;
        if (h < threshold) chosen.push_back((int) j);
        if (j == 0 || h < best_h) {   // the first of equals, as torch's argmin
            best = (int) j;
            best_h = h;
        }
    }
    if (chosen.empty() && !m.empty()) chosen.push_back(best);
    return chosen;
}

void WeDLMWindow::fill(int32_t pos, int32_t token) {
    const int i = pos - start_;
    tokens_.at(i) = token;
    filled_.at(i) = 1;
}

}  // namespace diffuse
