// What every decoding loop's stream shares (generate.cpp's masked diffusion, loops/*.cpp): the
// admission of new items at a step boundary.
#pragma once

#include "../model_impl.h"

#include <list>
#include <vector>

namespace diffuse {

// feed.admit()'s items join `running` (a Seq is built from (index, model, prompt, params) and
// throws diffuse::Error to refuse one); a refused item goes to feed.finished() at once with
// stop_reason "error" and the reason, the others run on. Returns whether admit() gave any item;
// the ones that joined are appended to `joined`.
template <typename Seq>
bool admit_items(const BatchFeed & feed, const ModelImpl & model, std::list<Seq> & running, int & n_admitted,
                 std::vector<Seq *> & joined) {
    const std::vector<BatchItem> items = feed.admit();
    for (const BatchItem & item : items) {
        const int index = n_admitted++;
        try {
            running.emplace_back(index, model, item.prompt, item.params);
        } catch (const Error & e) {
            GenerateOutput out;
            out.stop_reason = "error";
            out.error = e.what();
            feed.finished(index, std::move(out));
            continue;
        }
        joined.push_back(&running.back());
    }
    return !items.empty();
}

}  // namespace diffuse
