// _core.generate(model, prompt_ids, **options, on_step): the denoising loop with the GIL released;
// the GIL is taken only to hand each step's plain-data event to Python.
#include "bindings.h"

#include "diffuse.h"
#include "schedulers.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

namespace py = pybind11;

template <typename T>
static py::array_t<T> to_numpy(const std::vector<T> & v) {
    py::array_t<T> a((py::ssize_t) v.size());
    if (!v.empty()) std::memcpy(a.mutable_data(), v.data(), v.size() * sizeof(T));
    return a;
}

static py::dict event_dict(const diffuse::StepEvent & e) {
    py::dict d;
    d["step"] = e.step;
    d["block"] = e.block;
    d["n_blocks"] = e.n_blocks;
    d["steps_allowed"] = e.steps_allowed;
    d["prompt_length"] = e.prompt_length;
    d["block_start"] = e.block_start;
    d["block_end"] = e.block_end;
    d["tokens"] = to_numpy(*e.tokens);
    d["mask"] = to_numpy(*e.mask).attr("astype")("bool");
    d["unmasked"] = to_numpy(*e.unmasked);
    d["entropy"] = to_numpy(*e.entropy);
    d["confidence"] = to_numpy(*e.confidence);
    d["active"] = to_numpy(*e.active);
    d["cached"] = to_numpy(*e.cached);
    d["forward_ms"] = e.forward_ms;
    d["sample_ms"] = e.sample_ms;
    d["total_ms"] = e.total_ms;
    return d;
}

using I32Array = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

void diffuse_py::register_generate(py::module_ & m) {
    m.attr("SCHEDULERS") = diffuse::scheduler_names();
    m.def("default_options", [](const std::string & arch) {
        if (arch != "llada" && arch != "dream") throw diffuse::Error("unknown architecture '" + arch + "'");
        const diffuse::GenerateParams p =
            diffuse::default_generate_params(arch == "llada" ? diffuse::Arch::LLaDA : diffuse::Arch::Dream);
        py::dict d;
        d["gen_length"] = p.gen_length;
        d["steps"] = p.steps;
        d["block_length"] = p.block_length;
        d["scheduler"] = diffuse::scheduler_info(p.scheduler).name;
        d["threshold"] = p.threshold;
        d["cache"] = p.cache;
        d["keep_active"] = p.keep_active;
        d["refresh_every"] = p.refresh_every;
        d["temperature"] = p.temperature;
        d["top_k"] = p.top_k;
        d["top_p"] = p.top_p;
        d["alg_temp"] = p.alg_temp;
        d["cfg_scale"] = p.cfg_scale;
        d["eps"] = p.eps;
        d["seed"] = p.seed;
        return d;
    }, py::arg("arch"), "Default generation options of a family ('llada' or 'dream').");

    m.def("generate",
          [](diffuse::Model & model, I32Array prompt, int gen_length, int steps, int block_length,
             const std::string & scheduler, float threshold, bool cache, int keep_active, int refresh_every,
             float temperature, int top_k, float top_p, float alg_temp, float cfg_scale, float eps, uint64_t seed,
             int threads, std::vector<int32_t> eos_ids, py::object on_step) {
              if (prompt.ndim() != 1) throw diffuse::Error("prompt must be a 1-D array of token ids");
              diffuse::GenerateParams p;
              p.gen_length = gen_length;
              p.steps = steps;
              p.block_length = block_length;
              p.scheduler = diffuse::scheduler_by_name(scheduler).id;
              p.threshold = threshold;
              p.cache = cache;
              p.keep_active = keep_active;
              p.refresh_every = refresh_every;
              p.temperature = temperature;
              p.top_k = top_k;
              p.top_p = top_p;
              p.alg_temp = alg_temp;
              p.cfg_scale = cfg_scale;
              p.eps = eps;
              p.seed = seed;
              p.n_threads = threads;
              p.eos_ids = std::move(eos_ids);
              std::vector<int32_t> ids(prompt.data(), prompt.data() + prompt.size());

              diffuse::StepCallback cb;
              if (!on_step.is_none()) {
                  cb = [&on_step](const diffuse::StepEvent & e) {
                      py::gil_scoped_acquire gil;
                      py::object r = on_step(event_dict(e));
                      return r.is_none() || r.cast<bool>();
                  };
              }
              diffuse::GenerateOutput out;
              {
                  py::gil_scoped_release release;
                  out = diffuse::generate(model, ids, p, cb);
              }
              py::dict d;
              d["tokens"] = to_numpy(out.tokens);
              d["decided_step"] = to_numpy(out.decided_step);
              d["step_ms"] = to_numpy(out.step_ms);
              d["forward_ms"] = to_numpy(out.forward_ms);
              d["sample_ms"] = to_numpy(out.sample_ms);
              d["steps"] = out.steps;
              d["steps_allowed"] = out.steps_allowed;
              d["stop_reason"] = out.stop_reason;
              return d;
          },
          py::arg("model"), py::arg("prompt"), py::kw_only(), py::arg("gen_length"), py::arg("steps"),
          py::arg("block_length"), py::arg("scheduler"), py::arg("threshold"), py::arg("cache"),
          py::arg("keep_active"), py::arg("refresh_every"), py::arg("temperature"), py::arg("top_k"),
          py::arg("top_p"), py::arg("alg_temp"), py::arg("cfg_scale"), py::arg("eps"), py::arg("seed"),
          py::arg("threads"), py::arg("eos_ids"), py::arg("on_step"),
          "Run the denoising loop. on_step(dict) -> False cancels; its exceptions propagate.");
}
