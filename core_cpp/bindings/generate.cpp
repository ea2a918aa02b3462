// _core.generate_batch and _core.generate_stream: the decoding loops (Model.generate is a batch of one)
// with the GIL released; the GIL is taken only to hand plain data to and from Python (events, new
// items, outputs). _core.OPTIONS exposes the option table that the engine validates with, so
// Python, the CLI and the Studio build their inputs from it; _core.ARCHITECTURES and FAMILIES the
// architecture table, and _core.plan the plan the loops make of a request.
#include "bindings.h"

#include "diffuse.h"
#include "gguf_dialects.h"
#include "loops/stream.h"
#include "options.h"
#include "schedulers.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>

namespace py = pybind11;
using diffuse::OptionInfo;
using diffuse::OptionKind;

template <typename T>
static py::array_t<T> to_numpy(const std::vector<T> & v) {
    py::array_t<T> a((py::ssize_t) v.size());
    if (!v.empty()) std::memcpy(a.mutable_data(), v.data(), v.size() * sizeof(T));
    return a;
}

static py::dict event_dict(const diffuse::StepEvent & e, const diffuse::HParams & hp) {
    py::dict d;
    d["sequence"] = e.sequence;
    d["step"] = e.step;
    d["block"] = e.block;
    d["n_blocks"] = e.n_blocks;
    d["steps_allowed"] = e.steps_allowed;
    d["prompt_length"] = e.prompt_length;
    d["block_start"] = e.block_start;
    d["block_end"] = e.block_end;
    d["scheduled"] = e.scheduled;
    d["tokens"] = to_numpy(*e.tokens);
    d["mask"] = to_numpy(*e.mask).attr("astype")("bool");
    d["unmasked"] = to_numpy(*e.unmasked);
    d["entropy"] = to_numpy(*e.entropy);
    d["confidence"] = to_numpy(*e.confidence);
    d["active"] = to_numpy(*e.active);
    d["cached"] = to_numpy(*e.cached);
    d["edited"] = to_numpy(*e.edited);
    if (e.draft) {   // uniform-state diffusion (DiffusionGemma)
        d["draft"] = to_numpy(*e.draft);
        d["redrawn"] = to_numpy(*e.redrawn);
        d["entropy_cut"] = e.entropy_cut;
    }
    d["forward_ms"] = e.forward_ms;
    d["sample_ms"] = e.sample_ms;
    d["total_ms"] = e.total_ms;
    if (e.spec_draft) {   // self_spec
        d["spec_draft"] = to_numpy(*e.spec_draft);
        d["spec_accepted"] = e.spec_accepted;
    }
    if (e.window_order) {   // WeDLM
        d["window_order"] = to_numpy(*e.window_order);
        d["committed"] = to_numpy(*e.committed);
    }
    if (!e.experts->empty()) {
        const py::ssize_t n_active = (py::ssize_t) e.active->size();
        d["experts"] = to_numpy(*e.experts).attr("reshape")(hp.n_layer, n_active, hp.n_expert_used);
    }
    return d;
}

static py::dict output_dict(const diffuse::GenerateOutput & out) {
    py::dict d;
    d["tokens"] = to_numpy(out.tokens);
    d["decided_step"] = to_numpy(out.decided_step);
    d["step_ms"] = to_numpy(out.step_ms);
    d["forward_ms"] = to_numpy(out.forward_ms);
    d["sample_ms"] = to_numpy(out.sample_ms);
    d["steps"] = out.steps;
    d["steps_allowed"] = out.steps_allowed;
    d["prefill_ms"] = out.prefill_ms;
    d["forward_passes"] = out.forward_passes;
    d["stop_reason"] = out.stop_reason;
    d["error"] = out.error;
    return d;
}

static const char * kind_name(OptionKind k) {
    switch (k) {
        case OptionKind::Int: return "int";
        case OptionKind::Float: return "float";
        case OptionKind::Bool: return "bool";
        case OptionKind::Choice: return "choice";
        case OptionKind::Seed: return "seed";
    }
    return "?";
}

// An architecture by name (a family's name is its first architecture's).
static const diffuse::ArchInfo & arch_named(const std::string & name) {
    const diffuse::ArchInfo * a = diffuse::arch_by_name(name);
    if (!a) throw diffuse::Error("unknown architecture '" + name + "' (known: " + diffuse::arch_names() + ")");
    return *a;
}

static py::object option_value(const OptionInfo & o, const diffuse::GenerateParams & p) {
    switch (o.kind) {
        case OptionKind::Choice: return py::str(o.get_choice(p));
        case OptionKind::Bool: return py::bool_(o.get(p) != 0);
        case OptionKind::Int: return py::int_((int64_t) o.get(p));
        case OptionKind::Seed: return py::int_(p.seed);
        case OptionKind::Float: {
            // Shortest decimal that rounds to the float the engine holds (1e-3, not 0.0010000000474974513).
            char buf[32];
            std::snprintf(buf, sizeof buf, "%.7g", o.get(p));
            return py::float_(std::strtod(buf, nullptr));
        }
    }
    return py::none();
}

// A Python value for option `o` into p; a wrong type or range is a DiffuseError naming the option.
static void set_option(const OptionInfo & o, diffuse::GenerateParams & p, py::handle v) {
    auto type_error = [&](const char * want) {
        throw diffuse::Error(std::string(o.name) + " must be " + want + " (got " +
                             py::str(py::repr(v)).cast<std::string>() + ")");
    };
    const bool is_bool = py::isinstance<py::bool_>(v) || py::hasattr(v, "dtype") &&
                         py::str(v.attr("dtype").attr("kind")).cast<std::string>() == "b";
    const bool is_int = !is_bool && py::hasattr(v, "__index__");
    const bool is_number = is_int || (!is_bool && py::isinstance<py::float_>(v)) ||
                           (!is_bool && py::hasattr(v, "dtype") &&
                            py::str(v.attr("dtype").attr("kind")).cast<std::string>() == "f");
    switch (o.kind) {
        case OptionKind::Choice:
            if (!py::isinstance<py::str>(v)) type_error("a string");
            o.set_choice(p, v.cast<std::string>());
            return;
        case OptionKind::Bool:
            if (!is_bool) type_error("true or false");
            o.set(p, v.cast<bool>() ? 1.0 : 0.0);
            return;
        case OptionKind::Seed: {
            if (!is_int) type_error("an integer");
            py::int_ i(v.attr("__index__")());
            if (i < py::int_(0) || i > py::int_(UINT64_MAX))
                throw diffuse::Error(std::string(o.name) + " = " + py::str(i).cast<std::string>() +
                                     " is out of range: expected " + diffuse::option_range_text(o));
            p.seed = i.cast<uint64_t>();
            return;
        }
        case OptionKind::Int: {
            if (!is_int) type_error("an integer");
            const double d = py::float_(v.attr("__index__")()).cast<double>();
            diffuse::check_option(o, d);
            o.set(p, d);
            return;
        }
        case OptionKind::Float: {
            if (!is_number) type_error("a number");
            const double d = v.cast<double>();
            diffuse::check_option(o, d);
            o.set(p, d);
            return;
        }
    }
}

static diffuse::GenerateParams params_from(const std::string & arch, const py::dict & options, int threads,
                                           const std::vector<int32_t> & eos_ids) {
    diffuse::GenerateParams p = diffuse::default_generate_params(arch_named(arch).family);
    for (auto item : options) {
        const std::string name = py::str(item.first).cast<std::string>();
        if (item.second.is_none()) continue;   // None: the family default
        set_option(diffuse::generate_option(name), p, item.second);
    }
    p.n_threads = threads;
    p.eos_ids = eos_ids;
    return p;
}

using I32Array = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

static std::vector<int32_t> prompt_ids(const I32Array & prompt) {
    if (prompt.ndim() != 1) throw diffuse::Error("prompt must be a 1-D array of token ids");
    return std::vector<int32_t>(prompt.data(), prompt.data() + prompt.size());
}

// The engine runs with the GIL released; it is taken only to hand each event to on_step.
static diffuse::StepCallback step_callback(const diffuse::Model & model, const py::object & on_step) {
    if (on_step.is_none()) return nullptr;
    return [&on_step, &model](const diffuse::StepEvent & e) {
        py::gil_scoped_acquire gil;
        py::object r = on_step(event_dict(e, model.hparams()));
        return r.is_none() || r.cast<bool>();
    };
}

void diffuse_py::register_generate(py::module_ & m) {
    m.attr("SCHEDULERS") = diffuse::scheduler_names();

    py::list families;
    for (diffuse::Family f : diffuse::all_families()) families.append(diffuse::family_name(f));
    m.attr("FAMILIES") = families;
    py::list archs;
    for (const diffuse::ArchInfo * a : diffuse::all_archs()) {
        py::dict d;
        d["name"] = a->name;
        d["family"] = diffuse::family_name(a->family);
        d["loop"] = diffuse::loop_name(a->loop);
        d["moe"] = a->moe;
        d["shift_logits"] = a->shift_logits;         // unless the file says
        d["block_diffusion"] = a->block_diffusion;
        d["default_mask_id"] = a->default_mask_id;   // -1: the file must record it
        archs.append(d);
    }
    m.attr("ARCHITECTURES") = archs;

    m.def("plan", [](const std::string & arch, const py::dict & options, int64_t n_prompt, int64_t n_ctx, int block_size,
                     int sub_block_size, int canvas_length, int trained_block) {
        const diffuse::ArchInfo & a = arch_named(arch);
        const diffuse::GenerateParams p = params_from(arch, options, 0, {});
        diffuse::HParams hp{};
        hp.family = a.family;
        hp.arch = a.name;
        hp.shift_logits = a.shift_logits;
        hp.n_ctx_train = n_ctx > 0 ? n_ctx : INT32_MAX;
        // A block-diffusion model's block: its own, or where the caller does not know it, the one asked for.
        hp.block_size = !a.block_diffusion ? 0 : block_size > 0 ? block_size : std::max(p.block_length, 0);
        hp.sub_block_size = sub_block_size;
        hp.canvas_length = canvas_length;
        hp.trained_block = trained_block;
        // A size the caller does not know (0) plans nothing the options do not decide themselves.
        const diffuse::Loop loop = diffuse::loop_of(a, p);
        const bool unknown = p.block_length <= 0 &&
                             ((loop == diffuse::Loop::Masked && a.block_diffusion && block_size <= 0) ||
                              (loop == diffuse::Loop::UniformState && canvas_length <= 0) ||
                              (loop == diffuse::Loop::Causal && p.mode == diffuse::Decoding::Diffusion && trained_block <= 0));
        if (loop == diffuse::Loop::UniformState && canvas_length <= 0) hp.canvas_length = p.block_length;
        if (n_prompt < 1) throw diffuse::Error("plan: n_prompt must be at least 1");
        py::dict d;
        d["loop"] = diffuse::loop_name(loop);
        if (unknown) return d;
        const diffuse::Plan g = diffuse::plan_run(a, hp, n_prompt, p);
        d["gen_length"] = g.n_total - (int) n_prompt;   // whole blocks of the answer, as the loop runs them
        d["block_length"] = g.block;
        d["n_blocks"] = g.n_blocks;
        d["sub_block_length"] = g.sub;
        d["steps_per_sub_block"] = g.steps_per_sub;
        d["rounded"] = g.rounded;
        return d;
    }, py::arg("arch"), py::arg("options"), py::kw_only(), py::arg("n_prompt") = 1, py::arg("n_ctx") = 0,
       py::arg("block_size") = 0, py::arg("sub_block_size") = 0, py::arg("canvas_length") = 0, py::arg("trained_block") = 0,
       "The plan the engine's loop makes of a request (the same code generate runs): {loop, gen_length, block_length, "
       "n_blocks, sub_block_length, steps_per_sub_block, rounded: what it changed of the steps asked for, or ''}, or "
       "a DiffuseError with the reason it refuses it. The model's sizes (its n_ctx, block_size, ...; 0: not known) "
       "are its hparams'; when one the plan needs is not known, only 'loop'.");

    py::list options;
    for (const OptionInfo & o : diffuse::generate_options()) {
        py::dict d;
        d["name"] = o.name;
        d["kind"] = kind_name(o.kind);
        d["min"] = o.lo;
        d["max"] = o.hi;
        d["min_open"] = o.lo_open;
        d["max_open"] = o.hi_open;
        d["help"] = o.help;
        d["range"] = diffuse::option_range_text(o);
        d["choices"] = o.kind == OptionKind::Choice ? py::cast(o.choices()) : py::list();
        options.append(d);
    }
    m.attr("OPTIONS") = options;

    m.def("default_options", [](const std::string & arch) {
        const diffuse::GenerateParams p = diffuse::default_generate_params(arch_named(arch).family);
        py::dict d;
        for (const OptionInfo & o : diffuse::generate_options()) d[o.name] = option_value(o, p);
        return d;
    }, py::arg("arch"), "Default generation options of an architecture (its family's).");

    m.def("check_options", [](const std::string & arch, const py::dict & options) {
        const diffuse::GenerateParams p = params_from(arch, options, 0, {});
        py::dict d;
        for (const OptionInfo & o : diffuse::generate_options()) d[o.name] = option_value(o, p);
        return d;
    }, py::arg("arch"), py::arg("options"),
       "The architecture's defaults overridden by `options` (None keeps a default), checked: every option "
       "resolved, or a DiffuseError naming the first bad one and its allowed range.");

    m.def("generate_batch",
          [](const diffuse::Model & model, const std::vector<I32Array> & prompts, const std::vector<py::dict> & options,
             int threads, const std::vector<int32_t> & eos_ids, py::object on_step, bool expert_routing) {
              if (options.size() != prompts.size())
                  throw diffuse::Error("generate_batch: one options dict per prompt");
              std::vector<diffuse::BatchItem> items;
              for (size_t i = 0; i < prompts.size(); ++i) {
                  try {
                      items.push_back({prompt_ids(prompts[i]),
                                       params_from(model.hparams().arch, options[i], threads, eos_ids)});
                      items.back().params.expert_routing = expert_routing;
                  } catch (const diffuse::Error & e) {
                      throw diffuse::Error("prompt " + std::to_string(i) + ": " + e.what());
                  }
              }
              const diffuse::StepCallback cb = step_callback(model, on_step);
              std::vector<diffuse::GenerateOutput> results;
              {
                  py::gil_scoped_release release;
                  results = diffuse::generate_batch(model, items, cb);
              }
              py::list outs;
              for (const diffuse::GenerateOutput & o : results) outs.append(output_dict(o));
              return outs;
          },
          py::arg("model"), py::arg("prompts"), py::kw_only(), py::arg("options"), py::arg("threads") = 0,
          py::arg("eos_ids") = std::vector<int32_t>{}, py::arg("on_step") = py::none(),
          py::arg("expert_routing") = false,
          "Denoise several prompts together, one forward pass per step. Events carry 'sequence'; "
          "on_step returning False cancels that sequence only. expert_routing (MoE models): events "
          "carry 'experts', int32 (n_layer, n_active, n_expert_used).");

    m.def("generate_stream",
          [](const diffuse::Model & model, const py::function & admit, const py::function & finished, int threads,
             const std::vector<int32_t> & eos_ids, py::object on_step, bool expert_routing) {
              const std::string arch = model.hparams().arch;
              const diffuse::BatchFeed feed{
                  [&] {
                      py::gil_scoped_acquire gil;
                      std::vector<diffuse::BatchItem> items;
                      for (py::handle item : admit()) {
                          auto [prompt, options] = item.cast<std::pair<I32Array, py::dict>>();
                          items.push_back({prompt_ids(prompt), params_from(arch, options, threads, eos_ids)});
                          items.back().params.expert_routing = expert_routing;
                      }
                      return items;
                  },
                  [&](int sequence, diffuse::GenerateOutput && out) {
                      py::gil_scoped_acquire gil;
                      finished(sequence, output_dict(out));
                  }};
              const diffuse::StepCallback cb = step_callback(model, on_step);
              py::gil_scoped_release release;
              return diffuse::generate_stream(model, feed, cb);
          },
          py::arg("model"), py::arg("admit"), py::arg("finished"), py::kw_only(), py::arg("threads") = 0,
          py::arg("eos_ids") = std::vector<int32_t>{}, py::arg("on_step") = py::none(),
          py::arg("expert_routing") = false,
          "A batch that sequences join and leave: admit() is called before every step and returns new "
          "(prompt, options) pairs, numbered on across the stream; finished(sequence, output) as soon as "
          "one ends (stop_reason 'error' and the reason in 'error' for one the engine refused). Returns, "
          "when none runs and admit() gives none, the number of K/V caches the stream held.");
}
