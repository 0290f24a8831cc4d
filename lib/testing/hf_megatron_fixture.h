// A small decoder of a Hugging Face family (Llama with grouped-query attention, Mistral with its
// sliding window, Qwen2 with its QKV bias, Qwen3 with its q/k norms, or GPT-2) under Hugging
// Face's names, and the same weights as a Megatron-LM save, for the tests of
// `--format hf` and of the import into Megatron (//lib/formats:conformance_test,
// //lib/engine:golden_outputs_test).
//
// The Hugging Face tensors come first (distinct F32 values); every Megatron tensor is made from
// them here with Megatron-LM's layout (checkpoint_version 3), written out independently of
// reshard's transforms (lib/formats/hf):
//   - self_attention.query_key_value: per query group g, the rows of its r = heads / groups query
//     heads, then k head g, then v head g (head_dim rows each); TP rank t holds groups
//     [t * groups / TP, (t + 1) * groups / TP); its bias likewise;
//   - mlp.dense_h_to_4h (SwiGLU): TP rank t holds [gate_t; up_t], the t-th of TP row blocks of
//     gate_proj and up_proj;
//   - self_attention.dense and mlp.dense_4h_to_h: columns split over TP;
//   - word_embeddings and an untied output_layer: the vocabulary followed by padding rows (values
//     of their own, as an untrained part of the matrix has), rows split over TP;
//   - Qwen3's q_layernorm / k_layernorm replicated;
//   - GPT-2 (HF's Conv1D weights are [in, out], Megatron's [out, in]): query_key_value is the
//     transpose of c_attn ([q; k; v]) laid out per head as above with one head per group
//     ([nh, 3, d]); dense_h_to_4h the transpose of c_fc (rows split over TP, no gate), its bias
//     likewise; dense and dense_4h_to_h the transposes of c_proj, columns split over TP, their
//     biases replicated; position_embeddings (wpe) and the LayerNorm weights and biases
//     replicated;
//   - norms replicated; PP: layers split evenly over the stages, numbered locally in each
//     stage's file, the embedding in the first stage, the final norm and output layer in the last
//     (a tied model's last stage holds word_embeddings_for_head when it is not the first).
//
// testonly: nothing here is checked.

#ifndef RESHARD_LIB_TESTING_HF_MEGATRON_FIXTURE_H_
#define RESHARD_LIB_TESTING_HF_MEGATRON_FIXTURE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "lib/formats/format_fixture.h"

namespace reshard {

struct HfLlamaModel {
  int64_t layers = 2;
  int64_t hidden = 8;
  int64_t heads = 4;
  int64_t groups = 2;  // num_key_value_heads: query groups of heads / groups heads
  int64_t head_dim = 2;
  int64_t ffn = 6;
  int64_t vocab = 10;
  int64_t padded_vocab = 12;  // the Megatron save's rows; TP divides it
  bool qkv_bias = false;      // Qwen2
  bool qk_norm = false;       // Qwen3: q_norm and k_norm of head_dim
  int64_t sliding_window = 0;  // Mistral when > 0
  // GPT-2 (then groups = heads and head_dim = hidden / heads; ffn need not be 4 x hidden).
  bool gpt2 = false;
  bool tied = false;
  int64_t positions = 64;  // max_position_embeddings (GPT-2's wpe rows)

  // "gpt2", "qwen3", "qwen2", "mistral" or "llama".
  std::string family() const {
    return gpt2 ? "gpt2" : qk_norm ? "qwen3" : qkv_bias ? "qwen2"
                                  : sliding_window > 0 ? "mistral" : "llama";
  }
};

// The model's tensors under Hugging Face's names, in the order transformers' state dict lists
// them: model.embed_tokens.weight, each layer's, model.norm.weight, lm_head.weight (untied);
// GPT-2: transformer.wte.weight, transformer.wpe.weight, each transformer.h.<i>.*,
// transformer.ln_f.*.
std::vector<FixtureTensor> HfLlamaTensors(const HfLlamaModel& model);

// config.json as transformers' config class of the family writes it for the model (F32).
std::string HfLlamaConfigJson(const HfLlamaModel& model);

// Writes a Hugging Face model folder (model.safetensors and config.json) of the model into the
// existing folder `dir`; returns `dir`.
std::string WriteHfLlamaFolder(const std::string& dir, const HfLlamaModel& model);

// The Megatron-LM tensors TP rank `rank` of `tp` holds, under their legacy names with global
// layer numbers (language_model.encoder.layers.<i>.*). `padding` holds the vocabulary's padding
// rows ((padded rows - vocab) x hidden, F32 bytes) of the embeddings and of an untied output
// layer alike. With tp = 1: the merged model the megatron reader makes of any TP.
std::vector<FixtureTensor> MegatronLlamaTensors(const HfLlamaModel& model,
                                                const std::string& padding, int64_t rank = 0,
                                                int64_t tp = 1);

// The padding rows a Megatron save of the model holds past the vocabulary
// (model.padded_vocab - model.vocab rows): values of their own, distinct from every weight's.
std::string MegatronLlamaPadding(const HfLlamaModel& model);

// Writes a Megatron-LM save of the model at TP x PP into the existing folder `dir`:
// latest_checkpointed_iteration.txt naming iteration 1 and
// iter_0000001/mp_rank_TT[_PPP]/model_optim_rng.pt, each {"args": an argparse.Namespace of the
// run (sizes, groups, SwiGLU, RMSNorm, rope, vocab_size and padded_vocab_size, TP and PP),
// "checkpoint_version": 3.0, "iteration": 1, "model": {"language_model": {...}}} with the
// padding rows of MegatronLlamaPadding. Returns `dir`.
std::string WriteMegatronLlamaSave(const std::string& dir, const HfLlamaModel& model, int tp,
                                   int pp);

}  // namespace reshard

#endif  // RESHARD_LIB_TESTING_HF_MEGATRON_FIXTURE_H_
