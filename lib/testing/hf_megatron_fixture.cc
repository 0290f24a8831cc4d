#include "lib/testing/hf_megatron_fixture.h"

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "lib/formats/format_fixture.h"
#include "lib/formats/megatron/megatron_fixture.h"
#include "lib/formats/safetensors/safetensors_fixture.h"
#include "lib/formats/torch/pickle_writer.h"
#include "lib/formats/torch/torch_fixture.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

constexpr int64_t kF32 = 4;

// Rows [begin, end) of the row-major F32 matrix `bytes` of `columns` columns (1 for a vector).
std::string Rows(const std::string& bytes, int64_t columns, int64_t begin, int64_t end) {
  return bytes.substr(begin * columns * kF32, (end - begin) * columns * kF32);
}

// Columns [begin, end) of the row-major F32 matrix `bytes` of `columns` columns.
std::string Columns(const std::string& bytes, int64_t columns, int64_t begin, int64_t end) {
  std::string out;
  const int64_t rows = static_cast<int64_t>(bytes.size()) / (columns * kF32);
  for (int64_t row = 0; row < rows; ++row) {
    out.append(bytes, (row * columns + begin) * kF32, (end - begin) * kF32);
  }
  return out;
}

// The [columns, rows] transpose of the row-major F32 matrix `bytes` of `columns` columns.
std::string Transposed(const std::string& bytes, int64_t columns) {
  const int64_t rows = static_cast<int64_t>(bytes.size()) / (columns * kF32);
  std::string out(bytes.size(), '\0');
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t column = 0; column < columns; ++column) {
      out.replace((column * rows + row) * kF32, kF32, bytes, (row * columns + column) * kF32,
                  kF32);
    }
  }
  return out;
}

// The HF tensors by name.
class HfTensors {
 public:
  explicit HfTensors(const HfLlamaModel& model) {
    for (FixtureTensor& tensor : HfLlamaTensors(model)) {
      bytes_[tensor.name] = std::move(tensor.bytes);
    }
  }
  const std::string& operator[](const std::string& name) const { return bytes_.at(name); }

 private:
  std::map<std::string, std::string> bytes_;
};

// Rank t's fused QKV rows from q, k and v ([rows, columns]; columns 1 for the biases): per group
// g of the rank's, g's r query heads, then k head g, then v head g.
std::string FusedQkv(const HfLlamaModel& model, const std::string& q, const std::string& k,
                     const std::string& v, int64_t columns, int64_t t, int64_t tp) {
  const int64_t r = model.heads / model.groups;
  const int64_t d = model.head_dim;
  const int64_t local = model.groups / tp;
  std::string out;
  for (int64_t g = t * local; g < (t + 1) * local; ++g) {
    out += Rows(q, columns, g * r * d, (g + 1) * r * d);
    out += Rows(k, columns, g * d, (g + 1) * d);
    out += Rows(v, columns, g * d, (g + 1) * d);
  }
  return out;
}

// The argparse.Namespace of the run, its attributes as Megatron-LM's arguments name them.
void WriteArgs(PickleWriter& p, const HfLlamaModel& model, int tp, int pp, int rank) {
  p.Global("argparse", "Namespace");
  p.BeginTuple();
  p.EndTuple();
  p.NewObj();
  p.BeginDict(false);
  const std::vector<std::pair<const char*, int64_t>> ints = {
      {"num_layers", model.layers},
      {"hidden_size", model.hidden},
      {"ffn_hidden_size", model.ffn},
      {"num_attention_heads", model.heads},
      {"kv_channels", model.head_dim},
      {"num_query_groups", model.groups},
      {"max_position_embeddings", model.positions},
      {"seq_length", model.positions},
      {"vocab_size", model.vocab},
      {"padded_vocab_size", model.padded_vocab},
      {"make_vocab_size_divisible_by", 2},
      {"tensor_model_parallel_size", tp},
      {"pipeline_model_parallel_size", pp},
      {"rotary_base", 500000},
      {"rank", rank},
      {"world_size", tp * pp},
      {"data_parallel_size", 1},
      {"iteration", 1},
  };
  for (const auto& [key, value] : ints) {
    p.String(key);
    p.Int(value);
  }
  const std::vector<std::pair<const char*, bool>> bools = {
      {"group_query_attention", model.groups != model.heads},
      {"swiglu", !model.gpt2},
      {"untie_embeddings_and_output_weights", !model.tied},
      {"add_qkv_bias", model.qkv_bias || model.gpt2},
      {"add_bias_linear", model.gpt2},
      {"qk_layernorm", model.qk_norm},
      {"use_rope_scaling", false},
  };
  for (const auto& [key, value] : bools) {
    p.String(key);
    p.Bool(value);
  }
  if (model.gpt2) {
    p.String("openai_gelu");
    p.Bool(true);
  }
  if (model.sliding_window > 0) {
    p.String("sliding_window");
    p.Int(model.sliding_window);
  }
  p.String("position_embedding_type");
  p.String(model.gpt2 ? "learned_absolute" : "rope");
  p.String("normalization");
  p.String(model.gpt2 ? "LayerNorm" : "RMSNorm");
  p.String("norm_epsilon");
  p.Float(model.gpt2 ? 1e-5 : 1e-6);
  p.String("num_experts");
  p.None();
  p.EndDict();
  p.Build();
}

// Writes `tensors` as the entries of the dict being written (keys as given, each name minus
// `prefix`), each in a storage record of its own appended to `storages`.
void WriteTensors(PickleWriter& p, const std::vector<FixtureTensor>& tensors,
                  const std::string& prefix,
                  std::vector<std::pair<std::string, std::string>>& storages) {
  for (const FixtureTensor& tensor : tensors) {
    int64_t numel = 1;
    for (int64_t extent : tensor.shape) numel *= extent;
    std::vector<int64_t> strides(tensor.shape.size(), 1);
    for (int i = static_cast<int>(tensor.shape.size()) - 2; i >= 0; --i) {
      strides[i] = strides[i + 1] * tensor.shape[i + 1];
    }
    const std::string key = std::to_string(storages.size());
    p.String(tensor.name.substr(prefix.size()));
    p.Tensor("FloatStorage", key, numel, tensor.shape, strides);
    storages.emplace_back(key, tensor.bytes);
  }
}

// MegatronLlamaTensors of a GPT-2 model (hf_megatron_fixture.h): HF's Conv1D weights
// transposed to Megatron's [out, in], the fused QKV per head ([nh, 3, d]).
std::vector<FixtureTensor> MegatronGpt2Tensors(const HfLlamaModel& model, const HfTensors& hf,
                                               const std::string& padding, int64_t t,
                                               int64_t tp) {
  const int64_t h = model.hidden, f = model.ffn;
  const int64_t padded_rows = model.vocab + static_cast<int64_t>(padding.size()) / (h * kF32);
  const int64_t local_rows = padded_rows / tp, local_ffn = f / tp, local_h = h / tp;
  std::vector<FixtureTensor> out;
  auto add = [&](const std::string& name, Shape shape, std::string bytes) {
    out.push_back({name, DType::kF32, std::move(shape), std::move(bytes)});
  };
  add("language_model.embedding.word_embeddings.weight", {local_rows, h},
      Rows(hf["transformer.wte.weight"] + padding, h, t * local_rows, (t + 1) * local_rows));
  add("language_model.embedding.position_embeddings.weight", {model.positions, h},
      hf["transformer.wpe.weight"]);
  for (int64_t i = 0; i < model.layers; ++i) {
    const std::string p = absl::StrCat("transformer.h.", i, ".");
    const std::string m = absl::StrCat("language_model.encoder.layers.", i, ".");
    add(m + "input_layernorm.weight", {h}, hf[p + "ln_1.weight"]);
    add(m + "input_layernorm.bias", {h}, hf[p + "ln_1.bias"]);
    // c_attn is [h, 3h]: its transpose is [q; k; v], [3h, h].
    const std::string qkv = Transposed(hf[p + "attn.c_attn.weight"], 3 * h);
    const std::string& qkv_bias = hf[p + "attn.c_attn.bias"];
    add(m + "self_attention.query_key_value.weight", {3 * local_h, h},
        FusedQkv(model, Rows(qkv, h, 0, h), Rows(qkv, h, h, 2 * h), Rows(qkv, h, 2 * h, 3 * h), h,
                 t, tp));
    add(m + "self_attention.query_key_value.bias", {3 * local_h},
        FusedQkv(model, Rows(qkv_bias, 1, 0, h), Rows(qkv_bias, 1, h, 2 * h),
                 Rows(qkv_bias, 1, 2 * h, 3 * h), 1, t, tp));
    add(m + "self_attention.dense.weight", {h, local_h},
        Columns(Transposed(hf[p + "attn.c_proj.weight"], h), h, t * local_h, (t + 1) * local_h));
    add(m + "self_attention.dense.bias", {h}, hf[p + "attn.c_proj.bias"]);
    add(m + "post_attention_layernorm.weight", {h}, hf[p + "ln_2.weight"]);
    add(m + "post_attention_layernorm.bias", {h}, hf[p + "ln_2.bias"]);
    add(m + "mlp.dense_h_to_4h.weight", {local_ffn, h},
        Rows(Transposed(hf[p + "mlp.c_fc.weight"], f), h, t * local_ffn, (t + 1) * local_ffn));
    add(m + "mlp.dense_h_to_4h.bias", {local_ffn},
        Rows(hf[p + "mlp.c_fc.bias"], 1, t * local_ffn, (t + 1) * local_ffn));
    add(m + "mlp.dense_4h_to_h.weight", {h, local_ffn},
        Columns(Transposed(hf[p + "mlp.c_proj.weight"], h), f, t * local_ffn,
                (t + 1) * local_ffn));
    add(m + "mlp.dense_4h_to_h.bias", {h}, hf[p + "mlp.c_proj.bias"]);
  }
  add("language_model.encoder.final_layernorm.weight", {h}, hf["transformer.ln_f.weight"]);
  add("language_model.encoder.final_layernorm.bias", {h}, hf["transformer.ln_f.bias"]);
  if (!model.tied) {
    add("language_model.output_layer.weight", {local_rows, h},
        Rows(hf["lm_head.weight"] + padding, h, t * local_rows, (t + 1) * local_rows));
  }
  return out;
}

}  // namespace

std::vector<FixtureTensor> HfLlamaTensors(const HfLlamaModel& model) {
  const int64_t h = model.hidden, d = model.head_dim, f = model.ffn;
  float next = 0.5f;
  std::vector<FixtureTensor> tensors;
  auto add = [&](const std::string& name, Shape shape) {
    int64_t count = 1;
    for (int64_t extent : shape) count *= extent;
    tensors.push_back({name, DType::kF32, shape, FixtureF32Bytes(count, next)});
    next += 0.25f * static_cast<float>(count);
  };
  if (model.gpt2) {
    // Conv1D weights are [in, out].
    add("transformer.wte.weight", {model.vocab, h});
    add("transformer.wpe.weight", {model.positions, h});
    for (int64_t i = 0; i < model.layers; ++i) {
      const std::string p = absl::StrCat("transformer.h.", i, ".");
      add(p + "ln_1.weight", {h});
      add(p + "ln_1.bias", {h});
      add(p + "attn.c_attn.weight", {h, 3 * h});
      add(p + "attn.c_attn.bias", {3 * h});
      add(p + "attn.c_proj.weight", {h, h});
      add(p + "attn.c_proj.bias", {h});
      add(p + "ln_2.weight", {h});
      add(p + "ln_2.bias", {h});
      add(p + "mlp.c_fc.weight", {h, f});
      add(p + "mlp.c_fc.bias", {f});
      add(p + "mlp.c_proj.weight", {f, h});
      add(p + "mlp.c_proj.bias", {h});
    }
    add("transformer.ln_f.weight", {h});
    add("transformer.ln_f.bias", {h});
    if (!model.tied) add("lm_head.weight", {model.vocab, h});
    return tensors;
  }
  add("model.embed_tokens.weight", {model.vocab, h});
  for (int64_t i = 0; i < model.layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    add(p + "input_layernorm.weight", {h});
    add(p + "self_attn.q_proj.weight", {model.heads * d, h});
    add(p + "self_attn.k_proj.weight", {model.groups * d, h});
    add(p + "self_attn.v_proj.weight", {model.groups * d, h});
    if (model.qkv_bias) {
      add(p + "self_attn.q_proj.bias", {model.heads * d});
      add(p + "self_attn.k_proj.bias", {model.groups * d});
      add(p + "self_attn.v_proj.bias", {model.groups * d});
    }
    add(p + "self_attn.o_proj.weight", {h, model.heads * d});
    if (model.qk_norm) {
      add(p + "self_attn.q_norm.weight", {d});
      add(p + "self_attn.k_norm.weight", {d});
    }
    add(p + "post_attention_layernorm.weight", {h});
    add(p + "mlp.gate_proj.weight", {f, h});
    add(p + "mlp.up_proj.weight", {f, h});
    add(p + "mlp.down_proj.weight", {h, f});
  }
  add("model.norm.weight", {h});
  if (!model.tied) add("lm_head.weight", {model.vocab, h});
  return tensors;
}

std::string HfLlamaConfigJson(const HfLlamaModel& model) {
  const std::string family = model.family();
  if (model.gpt2) {
    return absl::StrFormat(
        R"({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": %d, )"
        R"("n_positions": %d, "n_embd": %d, "n_layer": %d, "n_head": %d, "n_inner": %d, )"
        R"("activation_function": "gelu_new", "layer_norm_epsilon": 1e-05, )"
        R"("tie_word_embeddings": %s, "torch_dtype": "float32"})",
        model.vocab, model.positions, model.hidden, model.layers, model.heads, model.ffn,
        model.tied ? "true" : "false");
  }
  const std::string architecture = family == "qwen3"     ? "Qwen3ForCausalLM"
                                   : family == "qwen2"   ? "Qwen2ForCausalLM"
                                   : family == "mistral" ? "MistralForCausalLM"
                                                         : "LlamaForCausalLM";
  // MistralConfig has a sliding window and no attention_bias.
  const std::string family_key =
      model.sliding_window > 0
          ? absl::StrCat(R"("sliding_window": )", model.sliding_window)
          : absl::StrCat(R"("attention_bias": )", model.qkv_bias ? "true" : "false");
  return absl::StrFormat(
      R"({"architectures": ["%s"], "model_type": "%s", "hidden_size": %d, )"
      R"("intermediate_size": %d, "num_hidden_layers": %d, "num_attention_heads": %d, )"
      R"("num_key_value_heads": %d, "head_dim": %d, "hidden_act": "silu", )"
      R"("max_position_embeddings": %d, "rms_norm_eps": 1e-06, "rope_theta": 500000.0, )"
      R"("vocab_size": %d, "tie_word_embeddings": %s, %s, )"
      R"("torch_dtype": "float32"})",
      architecture, family, model.hidden, model.ffn, model.layers, model.heads, model.groups,
      model.head_dim, model.positions, model.vocab, model.tied ? "true" : "false", family_key);
}

std::string WriteHfLlamaFolder(const std::string& dir, const HfLlamaModel& model) {
  WriteAll(dir + "/model.safetensors", SafetensorsFileOf(HfLlamaTensors(model)));
  WriteAll(dir + "/config.json", HfLlamaConfigJson(model));
  return dir;
}

std::string MegatronLlamaPadding(const HfLlamaModel& model) {
  // Past every weight's values (HfLlamaTensors counts up from 0.5 by 0.25).
  return FixtureF32Bytes((model.padded_vocab - model.vocab) * model.hidden, -1000.0f);
}

std::vector<FixtureTensor> MegatronLlamaTensors(const HfLlamaModel& model,
                                                const std::string& padding, int64_t rank,
                                                int64_t tp) {
  const HfTensors hf(model);
  const int64_t h = model.hidden, t = rank;
  const int64_t padded_rows = model.vocab + static_cast<int64_t>(padding.size()) / (h * kF32);
  const int64_t local_rows = padded_rows / tp;
  const int64_t local_ffn = model.ffn / tp;
  const int64_t local_heads = model.heads / tp;
  const int64_t r = model.heads / model.groups;
  std::vector<FixtureTensor> out;
  auto add = [&](const std::string& name, Shape shape, std::string bytes) {
    out.push_back({name, DType::kF32, std::move(shape), std::move(bytes)});
  };
  if (model.gpt2) return MegatronGpt2Tensors(model, hf, padding, rank, tp);
  add("language_model.embedding.word_embeddings.weight", {local_rows, h},
      Rows(hf["model.embed_tokens.weight"] + padding, h, t * local_rows, (t + 1) * local_rows));
  for (int64_t i = 0; i < model.layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    const std::string m = absl::StrCat("language_model.encoder.layers.", i, ".");
    const int64_t qkv_rows = model.groups / tp * (r + 2) * model.head_dim;
    add(m + "input_layernorm.weight", {h}, hf[p + "input_layernorm.weight"]);
    add(m + "self_attention.query_key_value.weight", {qkv_rows, h},
        FusedQkv(model, hf[p + "self_attn.q_proj.weight"], hf[p + "self_attn.k_proj.weight"],
                 hf[p + "self_attn.v_proj.weight"], h, t, tp));
    if (model.qkv_bias) {
      add(m + "self_attention.query_key_value.bias", {qkv_rows},
          FusedQkv(model, hf[p + "self_attn.q_proj.bias"], hf[p + "self_attn.k_proj.bias"],
                   hf[p + "self_attn.v_proj.bias"], 1, t, tp));
    }
    const int64_t attention = model.heads * model.head_dim;
    add(m + "self_attention.dense.weight", {h, local_heads * model.head_dim},
        Columns(hf[p + "self_attn.o_proj.weight"], attention, t * local_heads * model.head_dim,
                (t + 1) * local_heads * model.head_dim));
    if (model.qk_norm) {
      add(m + "self_attention.q_layernorm.weight", {model.head_dim}, hf[p + "self_attn.q_norm.weight"]);
      add(m + "self_attention.k_layernorm.weight", {model.head_dim}, hf[p + "self_attn.k_norm.weight"]);
    }
    add(m + "post_attention_layernorm.weight", {h}, hf[p + "post_attention_layernorm.weight"]);
    add(m + "mlp.dense_h_to_4h.weight", {2 * local_ffn, h},
        Rows(hf[p + "mlp.gate_proj.weight"], h, t * local_ffn, (t + 1) * local_ffn) +
            Rows(hf[p + "mlp.up_proj.weight"], h, t * local_ffn, (t + 1) * local_ffn));
    add(m + "mlp.dense_4h_to_h.weight", {h, local_ffn},
        Columns(hf[p + "mlp.down_proj.weight"], model.ffn, t * local_ffn, (t + 1) * local_ffn));
  }
  add("language_model.encoder.final_layernorm.weight", {h}, hf["model.norm.weight"]);
  if (!model.tied) {
    add("language_model.output_layer.weight", {local_rows, h},
        Rows(hf["lm_head.weight"] + padding, h, t * local_rows, (t + 1) * local_rows));
  }
  return out;
}

std::string WriteMegatronLlamaSave(const std::string& dir, const HfLlamaModel& model, int tp,
                                   int pp) {
  EXPECT_EQ(model.layers % pp, 0) << "PP " << pp << " does not divide " << model.layers;
  EXPECT_EQ(model.groups % tp, 0) << "TP " << tp << " does not divide " << model.groups;
  EXPECT_EQ(model.padded_vocab % tp, 0) << "TP " << tp << " does not divide the padded vocabulary";
  const std::string padding = MegatronLlamaPadding(model);
  const int64_t per_stage = model.layers / pp;
  const std::string embedding = "language_model.embedding.word_embeddings.weight";
  const std::string position_embedding = "language_model.embedding.position_embeddings.weight";
  const std::string encoder = "language_model.encoder.";
  const std::string output = "language_model.output_layer.weight";
  for (int t = 0; t < tp; ++t) {
    const std::vector<FixtureTensor> tensors = MegatronLlamaTensors(model, padding, t, tp);
    for (int s = 0; s < pp; ++s) {
      const bool first = s == 0, last = s == pp - 1;
      // The stage's tensors: its layers renumbered from 0, and the ends it holds.
      std::vector<FixtureTensor> layers, ends;
      const FixtureTensor* words = nullptr;
      const FixtureTensor* positions = nullptr;
      for (const FixtureTensor& tensor : tensors) {
        if (tensor.name == embedding) {
          words = &tensor;
          continue;
        }
        if (tensor.name == position_embedding) {
          positions = &tensor;
          continue;
        }
        if (tensor.name == output ||
            absl::StartsWith(tensor.name, encoder + "final_layernorm.")) {
          if (last) ends.push_back(tensor);
          continue;
        }
        const std::string rest = tensor.name.substr(encoder.size() + std::string("layers.").size());
        const int64_t layer = std::stoll(rest.substr(0, rest.find('.')));
        if (layer / per_stage != s) continue;
        FixtureTensor local = tensor;
        local.name =
            absl::StrCat(encoder, "layers.", layer % per_stage, rest.substr(rest.find('.')));
        layers.push_back(std::move(local));
      }
      std::vector<std::pair<std::string, std::string>> storages;
      PickleWriter p;
      p.BeginDict(false);
      p.String("args");
      WriteArgs(p, model, tp, pp, s * tp + t);
      p.String("model");
      p.BeginDict(true);
      p.String("language_model");
      p.BeginDict(true);
      if (first) {
        p.String("embedding");
        p.BeginDict(true);
        p.String("word_embeddings");
        p.BeginDict(true);
        WriteTensors(p, {*words}, "language_model.embedding.word_embeddings.", storages);
        p.EndDict();
        if (positions != nullptr) {
          p.String("position_embeddings");
          p.BeginDict(true);
          WriteTensors(p, {*positions}, "language_model.embedding.position_embeddings.",
                       storages);
          p.EndDict();
        }
        p.EndDict();
      }
      p.String("encoder");
      p.BeginDict(true);
      WriteTensors(p, layers, encoder, storages);
      for (const FixtureTensor& end : ends) {
        if (end.name != output) WriteTensors(p, {end}, encoder, storages);
      }
      p.EndDict();
      for (const FixtureTensor& end : ends) {
        if (end.name != output) continue;
        p.String("output_layer");
        p.BeginDict(true);
        WriteTensors(p, {end}, "language_model.output_layer.", storages);
        p.EndDict();
      }
      p.EndDict();  // language_model
      if (last && !first && model.tied) {
        p.String("word_embeddings_for_head");
        p.BeginDict(true);
        WriteTensors(p, {*words}, "language_model.embedding.word_embeddings.", storages);
        p.EndDict();
      }
      p.EndDict();  // model
      WriteMegatronVersionAndIteration(p);
      const std::string folder = pp == 1 ? absl::StrFormat("iter_0000001/mp_rank_%02d", t)
                                         : absl::StrFormat("iter_0000001/mp_rank_%02d_%03d", t, s);
      std::filesystem::create_directories(dir + "/" + folder);
      WriteAll(dir + "/" + folder + "/model_optim_rng.pt",
               BuildTorchSave(p.Finish(), storages).bytes);
    }
  }
  WriteAll(dir + "/latest_checkpointed_iteration.txt", "1");
  return dir;
}

}  // namespace reshard
