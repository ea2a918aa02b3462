// _core.sample_rows: the engine's per-row sampling on given logits, for tests and benchmarks.
#include "bindings.h"

#include "diffuse.h"
#include "sampling.h"

#include <pybind11/numpy.h>

#include <cstring>

namespace py = pybind11;

void diffuse_py::register_sampling(py::module_ & m) {
    m.def("sample_rows",
          [](py::array_t<float, py::array::c_style | py::array::forcecast> logits,
             py::array_t<int32_t, py::array::c_style | py::array::forcecast> keys, float temperature, int top_k,
             float top_p, bool top_p_raw, bool gumbel, uint64_t seed, uint64_t step, int32_t mask_token_id,
             int threads) {
              if (logits.ndim() != 2 || logits.shape(1) < 1)
                  throw diffuse::Error("sample_rows: logits must be (rows, vocab) with vocab >= 1");
              if (keys.ndim() != 1 || keys.shape(0) != logits.shape(0))
                  throw diffuse::Error("sample_rows: keys must have one entry per row");
              const int n_rows = (int) logits.shape(0);
              const int64_t n_vocab = logits.shape(1);
              diffuse::SampleConfig cfg;
              cfg.temperature = temperature;
              cfg.top_k = top_k;
              cfg.top_p = top_p;
              cfg.top_p_raw = top_p_raw;
              cfg.gumbel = gumbel;
              cfg.seed = seed;
              cfg.step = step;
              cfg.mask_token_id = mask_token_id;
              const std::vector<int32_t> k(keys.data(), keys.data() + n_rows);
              std::vector<diffuse::RowStats> out;
              {
                  py::gil_scoped_release release;
                  diffuse::sample_rows(logits.data(), n_rows, n_vocab, k, cfg, threads, out);
              }
              py::array_t<int32_t> x0(n_rows);
              py::dict d;
              const char * names[] = {"p_x0", "top1", "entropy", "conf", "margin", "neg_entropy"};
              float diffuse::RowStats::*fields[] = {&diffuse::RowStats::p_x0, &diffuse::RowStats::top1,
                                                    &diffuse::RowStats::entropy, &diffuse::RowStats::conf,
                                                    &diffuse::RowStats::margin, &diffuse::RowStats::neg_entropy};
              for (int r = 0; r < n_rows; ++r) x0.mutable_data()[r] = out[r].x0;
              d["x0"] = x0;
              for (size_t f = 0; f < 6; ++f) {
                  py::array_t<float> a(n_rows);
                  for (int r = 0; r < n_rows; ++r) a.mutable_data()[r] = out[r].*fields[f];
                  d[names[f]] = a;
              }
              return d;
          },
          py::arg("logits"), py::arg("keys"), py::kw_only(), py::arg("temperature") = 0.0f, py::arg("top_k") = 0,
          py::arg("top_p") = 1.0f, py::arg("top_p_raw") = false, py::arg("gumbel") = true, py::arg("seed") = 0, py::arg("step") = 0,
          py::arg("mask_token_id") = -1, py::arg("threads") = 1,
          "Per-row sampling stats of logits (rows, vocab): a dict of arrays x0, p_x0, top1, entropy, conf, margin, "
          "neg_entropy; keys[r] is row r's position for the random draws.");
}
