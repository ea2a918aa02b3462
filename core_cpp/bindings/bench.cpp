#include "bindings.h"

#include "diffuse.h"

#include "head_product.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>

namespace py = pybind11;

void diffuse_py::register_bench(py::module_ & m) {
    m.def("bench_matmul",
          [](int type, int64_t k, int64_t mm, int64_t n, int threads, int reps, bool repack) {
              py::gil_scoped_release release;
              return diffuse::bench_matmul(type, k, mm, n, threads, reps, repack);
          },
          py::arg("ggml_type"), py::arg("k"), py::arg("m"), py::arg("n"), py::kw_only(), py::arg("threads") = 1,
          py::arg("reps") = 3, py::arg("repack") = true, "Best wall time (s) of ggml's y = W x, W (m, k) of ggml_type, x (k, n) F32.");
    m.def("bench_head",
          [](int type, int64_t k, int64_t mm, int64_t n, int threads, int reps) {
              py::gil_scoped_release release;
              return diffuse::bench_head(type, k, mm, n, threads, reps);
          },
          py::arg("ggml_type"), py::arg("k"), py::arg("m"), py::arg("n"), py::kw_only(), py::arg("threads") = 1,
          py::arg("reps") = 3,
          "(ggml s, own s): best wall times of the output head's product W x, W (m, k) of ggml_type random, "
          "x (k, n) F32, n <= 32, by ggml's mat-mul and by the engine's few-row head product, alternated.");
    m.def("head_matmul",
          [](py::array_t<uint8_t, py::array::c_style | py::array::forcecast> w, int type, int64_t k,
             py::array_t<float, py::array::c_style | py::array::forcecast> x, bool own, int threads) {
              if (w.ndim() != 2 || x.ndim() != 2 || x.shape(1) != k)
                  throw diffuse::Error("head_matmul: w is (m, row bytes) ggml blocks, x is (n, k) float32");
              const int64_t m = w.shape(0), n = x.shape(0);
              std::vector<float> y;
              {
                  py::gil_scoped_release release;
                  y = diffuse::head_matmul(type, w.data(), (size_t) w.size(), m, k, x.data(), n, own, threads);
              }
              py::array_t<float> a({(py::ssize_t) n, (py::ssize_t) m});
              std::memcpy(a.mutable_data(), y.data(), y.size() * sizeof(float));
              return a;
          },
          py::arg("w"), py::arg("ggml_type"), py::arg("k"), py::arg("x"), py::kw_only(), py::arg("own"),
          py::arg("threads") = 1,
          "y (n, m) = W x: W as uint8 (m, row bytes) of ggml_type blocks (quantize_rows' output), x (n, k) "
          "float32; by the engine's few-row head product (own=True) or ggml's mat-mul.");
    m.attr("HEAD_PRODUCT_ISA") = diffuse::head_product_isa();
    m.def("bench_block_step",
          [](const diffuse::Model & model, int depth, int width, int threads, int reps, int masked, int logit_rows,
             bool routing) -> py::object {
              std::vector<double> ms;
              std::vector<int32_t> experts;
              {
                  py::gil_scoped_release release;
                  ms = diffuse::bench_block_step(model, depth, width, threads, reps, masked, logit_rows,
                                                 routing ? &experts : nullptr);
              }
              if (!routing) return py::cast(ms);
              return py::make_tuple(ms, py::cast(experts));
          },
          py::arg("model"), py::arg("depth"), py::arg("width"), py::kw_only(), py::arg("threads") = 0,
          py::arg("reps") = 5, py::arg("masked") = 0, py::arg("logit_rows") = 0,
          py::arg("routing") = false,
          "ms of each of `reps` block-diffusion steps: `width` new rows over `depth` cached rows, the last "
          "`masked` of them the mask token, logits for the last `logit_rows` rows (0: all). routing=True: "
          "(ms, experts), experts a flat list (n_layer, width, n_expert_used) of an MoE model's choices, best "
          "first (-1 for dense layers), empty for a dense model.");
    m.def("bench_block_steps",
          [](const diffuse::Model & model, int depth, const std::vector<std::vector<int>> & cases, int reps,
             bool routing) {
              std::vector<diffuse::BlockStepCase> cs;
              for (const std::vector<int> & c : cases) {
                  if (c.size() != 3 && c.size() != 4)
                      throw diffuse::Error("bench_block_steps: a case is (width, masked, threads[, logit_rows])");
                  cs.push_back({c[0], c[1], c[2], c.size() == 4 ? c[3] : 0});
              }
              std::vector<diffuse::BlockStepResult> r;
              {
                  py::gil_scoped_release release;
                  r = diffuse::bench_block_steps(model, depth, cs, reps, routing);
              }
              py::list out;
              for (auto & x : r) out.append(py::make_tuple(x.ms, x.experts));
              return out;
          },
          py::arg("model"), py::arg("depth"), py::arg("cases"), py::kw_only(), py::arg("reps") = 3,
          py::arg("routing") = true,
          "Block steps over one prefilled prompt of `depth` rows: cases [(width, masked, threads[, logit_rows])], "
          "in order; for each (ms list, experts flat list (n_layer, width, n_expert_used), empty without routing "
          "or experts).");
    m.def("bench_spec_passes",
          [](const diffuse::Model & model, int depth, const std::vector<int> & widths, int threads, int reps) {
              diffuse::SpecPassTimes t;
              {
                  py::gil_scoped_release release;
                  t = diffuse::bench_spec_passes(model, depth, widths, threads, reps);
              }
              py::dict d;
              d["decode_ms"] = t.decode_ms;
              d["draft_ms"] = t.draft_ms;
              d["verify_ms"] = t.verify_ms;
              d["draft_lora_ms"] = t.draft_lora_ms;
              return d;
          },
          py::arg("model"), py::arg("depth"), py::arg("widths"), py::kw_only(), py::arg("threads") = 0,
          py::arg("reps") = 5,
          "Self-speculation's passes at `depth` cached rows, `reps` of each alternating: {decode_ms: [AR decode "
          "row], draft_ms: [per width: ms of the draft pass (empty for width 1)], verify_ms: [per width], "
          "draft_lora_ms: [per width: the draft pass with the draft LoRA (empty without one)]}.");
}
