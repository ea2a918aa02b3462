#include "bindings.h"

#include "diffuse.h"
#include "gguf_dialects.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <optional>

namespace py = pybind11;
using diffuse::Model;

using I32Array = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;
using F32Array = py::array_t<float, py::array::c_style | py::array::forcecast>;

static py::dict hparams_dict(const diffuse::HParams & hp) {
    py::dict d;
    d["arch"] = hp.arch;                                  // the architecture ("llada2")
    d["family"] = diffuse::family_name(hp.family);        // whose loop and defaults apply ("sdar")
    d["dialect"] = diffuse::dialect_name(hp.dialect);
    d["n_vocab"] = hp.n_vocab;
    d["n_embd"] = hp.n_embd;
    d["n_layer"] = hp.n_layer;
    d["n_head"] = hp.n_head;
    d["n_head_kv"] = hp.n_head_kv;
    d["n_ff"] = hp.n_ff;
    d["n_ctx_train"] = hp.n_ctx_train;
    d["head_dim"] = hp.head_dim;
    d["rope_theta"] = hp.rope_theta;
    d["rms_eps"] = hp.rms_eps;
    d["rope_mode"] = hp.rope_mode == 0 ? "norm" : "neox";
    d["shift_logits"] = hp.shift_logits;
    d["mask_token_id"] = hp.mask_token_id;
    d["file_type"] = hp.file_type;
    d["n_expert"] = hp.n_expert;            // 0: dense
    d["n_expert_used"] = hp.n_expert_used;
    d["n_ff_exp"] = hp.n_ff_exp;
    d["qk_norm"] = hp.qk_norm;
    d["n_rot"] = hp.n_rot;                  // RoPE dims of each head (LLaDA2: half)
    d["router"] = hp.moe() ? (hp.router_sigmoid ? "sigmoid" : "softmax") : "";
    d["n_expert_groups"] = hp.n_expert_groups;
    d["n_group_used"] = hp.n_group_used;
    d["expert_weights_scale"] = hp.expert_weights_scale;
    d["n_expert_shared"] = hp.n_expert_shared;
    d["n_layer_dense"] = hp.n_layer_dense;  // leading dense layers of a MoE model
    d["block_size"] = hp.block_size;        // 0: attends to the whole sequence
    d["sub_block_size"] = hp.sub_block_size;    // 0: none
    d["canvas_length"] = hp.canvas_length;      // DiffusionGemma's canvas; 0 for the others
    d["sliding_window"] = hp.n_swa;             // 0: none
    d["logit_softcap"] = hp.logit_softcap;      // 0: none
    d["rope_yarn"] = hp.rope_yarn;
    d["rope_scaling_factor"] = 1.0 / hp.rope_freq_scale;
    d["attn_temp_scale"] = hp.attn_temp_scale;  // llama-4 query scale; 0: none
    d["trained_block"] = hp.trained_block;      // Nemotron-Labs-Diffusion's block; 0: none
    d["draft_lora_rank"] = hp.draft_lora_rank;  // its draft LoRA's rank; 0: none
    d["draft_lora_scale"] = hp.draft_lora_scale;
    return d;
}

void diffuse_py::register_model(py::module_ & m) {
    m.def("physical_cores", &diffuse::physical_cores,
          "Physical cores this process may run on: the default thread count.");
    py::class_<Model>(m, "Model")
        .def(py::init([](const std::string & path, int threads, bool repack, bool flash_attn, bool kv_f16) {
                 diffuse::LoadParams p;
                 p.n_threads = threads;
                 p.repack = repack;
                 p.flash_attn = flash_attn;
                 p.kv_f16 = kv_f16;
                 py::gil_scoped_release release;
                 return Model::load(path, p);
             }),
             py::arg("path"), py::kw_only(), py::arg("threads") = 0, py::arg("repack") = false,
             py::arg("flash_attn") = true, py::arg("kv_f16") = true)
        .def_property_readonly("hparams", [](const Model & self) { return hparams_dict(self.hparams()); })
        .def_property_readonly("path", &Model::path)
        .def_property_readonly("weights_bytes", &Model::weights_bytes)
        .def_property_readonly("repacked_bytes", &Model::repacked_bytes)
        .def_property_readonly("flash_attn", &Model::flash_attn)
        .def_property_readonly("kv_f16", &Model::kv_f16)
        .def_property("threads", &Model::n_threads, &Model::set_n_threads)
        .def("forward",
             [](const Model & self, I32Array tokens, std::vector<int32_t> rows, int block_size) {
                 if (tokens.ndim() != 1) throw diffuse::Error("forward: expected a 1-D array of token ids");
                 std::vector<int32_t> ids(tokens.data(), tokens.data() + tokens.size());
                 // The engine writes straight into the array: one allocation, one copy.
                 const py::ssize_t n_vocab = self.hparams().n_vocab;
                 py::array_t<float> out({(py::ssize_t) (rows.empty() ? ids.size() : rows.size()), n_vocab});
                 float * dst = out.mutable_data();
                 {
                     py::gil_scoped_release release;
                     self.forward_into(ids, rows, dst, block_size);
                 }
                 return out;
             },
             py::arg("tokens"), py::arg("rows") = std::vector<int32_t>{}, py::arg("block_size") = -1,
             "Logits (n_rows, n_vocab) of the given positions (all when empty), under the model's attention "
             "pattern (bidirectional or block-causal), before any logit shift.")
        .def("forward_canvas",
             [](const Model & self, I32Array context, I32Array canvas, std::optional<F32Array> self_cond) {
                 if (context.ndim() != 1 || canvas.ndim() != 1)
                     throw diffuse::Error("forward: expected 1-D arrays of token ids");
                 const py::ssize_t n_vocab = self.hparams().n_vocab, C = canvas.size();
                 if (self_cond && (self_cond->ndim() != 2 || self_cond->shape(0) != C || self_cond->shape(1) != n_vocab))
                     throw diffuse::Error("forward: self_conditioning must be (" + std::to_string(C) + ", " +
                                          std::to_string(n_vocab) + ") logits, one row per canvas position");
                 std::vector<int32_t> ctx_ids(context.data(), context.data() + context.size());
                 std::vector<int32_t> canvas_ids(canvas.data(), canvas.data() + C);
                 py::array_t<float> out({C, n_vocab});
                 float * dst = out.mutable_data();
                 const float * sc = self_cond ? self_cond->data() : nullptr;
                 {
                     py::gil_scoped_release release;
                     self.forward_canvas(ctx_ids, canvas_ids, sc, dst);
                 }
                 return out;
             },
             py::arg("context"), py::arg("canvas"), py::arg("self_cond") = py::none(),
             "DiffusionGemma: the canvas's logits (n_canvas, n_vocab), softcapped, after the context is "
             "encoded causally; self_cond: the previous step's logits of the canvas or None.")
        .def("forward_causal",
             [](const Model & self, I32Array tokens, int open_block, bool draft_lora) {
                 if (tokens.ndim() != 1) throw diffuse::Error("forward: expected a 1-D array of token ids");
                 std::vector<int32_t> ids(tokens.data(), tokens.data() + tokens.size());
                 py::array_t<float> out({(py::ssize_t) ids.size(), (py::ssize_t) self.hparams().n_vocab});
                 float * dst = out.mutable_data();
                 {
                     py::gil_scoped_release release;
                     self.forward_causal_into(ids, open_block, dst, draft_lora);
                 }
                 return out;
             },
             py::arg("tokens"), py::arg("open_block") = 0, py::arg("draft_lora") = false,
             "Causal logits (n, n_vocab) of every position; open_block > 0: the last open_block positions "
             "also see each other (a block drafted over a causal prefix), with the draft LoRA when "
             "draft_lora. Before any logit shift.");
}
