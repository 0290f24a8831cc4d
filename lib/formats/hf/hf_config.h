// config.json and generation_config.json of a Hugging Face model written from a Megatron
// checkpoint (`--format hf`), made from the checkpoint's args (the argparse.Namespace Megatron
// saves, InputModel::training_state "megatron.args") and completed or overridden by the keys
// of `--config FILE`.
//
// config.json keys, in order, and where each comes from when --config does not give it:
//   architectures, model_type        the family (hf_family.h)
//   hidden_size                      args.hidden_size
//   intermediate_size                args.ffn_hidden_size (mixtral: an expert's,
//                                    args.moe_ffn_hidden_size, else args.ffn_hidden_size)
//   num_hidden_layers                args.num_layers
//   num_attention_heads              args.num_attention_heads
//   num_key_value_heads              args.num_query_groups with args.group_query_attention,
//                                    args.num_key_value_heads without it (Megatron-DeepSpeed),
//                                    else num_attention_heads
//   head_dim                         args.kv_channels, else hidden_size / num_attention_heads
//   hidden_act                       "silu" (SwiGLU)
//   max_position_embeddings          args.max_position_embeddings
//   rms_norm_eps                     args.norm_epsilon, else args.layernorm_epsilon
//   rope_theta                       args.rotary_base, else args.rope_theta (Megatron-DeepSpeed)
//   rope_scaling                     args.use_rope_scaling: Llama 3.1's {"rope_type": "llama3",
//                                    "factor": args.rope_scaling_factor (8.0 when absent),
//                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
//                                    "original_max_position_embeddings": 8192}, as Megatron's
//                                    apply_rope_scaling fixes them; else null
//   vocab_size                       --vocab-size, else args.vocab_size
//   tie_word_embeddings              whether the checkpoint has no separate output layer
//   attention_bias                   the family's QKV bias (not for mistral, mixtral)
//   sliding_window                   mistral, mixtral: args.sliding_window (null when absent)
//   num_local_experts                mixtral: args.num_experts
//   num_experts_per_tok              mixtral: args.moe_router_topk
//   router_aux_loss_coef             mixtral: args.moe_aux_loss_coeff, left out when absent
//   torch_dtype                      the weights' dtype as written (after --dtype)
//   use_cache                        true
// gpt2 (GPT2Config) has its own keys instead, in order:
//   architectures, model_type        "GPT2LMHeadModel", "gpt2"
//   vocab_size                       --vocab-size, else args.vocab_size
//   n_positions                      args.max_position_embeddings
//   n_embd, n_layer, n_head          args.hidden_size, args.num_layers, args.num_attention_heads
//   n_inner                          args.ffn_hidden_size, null when 4 * n_embd (or absent)
//   activation_function              "gelu_fast" with args.bias_gelu_fusion, else "gelu_new"
//                                    with args.openai_gelu, else "gelu" (as transformers'
//                                    convert_megatron_gpt2_checkpoint.py decides)
//   resid_pdrop, embd_pdrop,         0.1, 0.1, 0.1, 0.02 (that script's values)
//   attn_pdrop, initializer_range
//   layer_norm_epsilon               args.layernorm_epsilon (or args.norm_epsilon)
//   scale_attn_weights               true
//   tie_word_embeddings, torch_dtype, use_cache   as above
// A key the args lack and --config does not give is refused, naming the key and the arg.
// bos_token_id, eos_token_id and pad_token_id (config.json and generation_config.json) come from
// --config, else from the tokenizer carried into the output (HfTokenizerSpecialIds) when it
// gives them; otherwise they are left out, and transformers uses its defaults.

#ifndef RESHARD_LIB_FORMATS_HF_HF_CONFIG_H_
#define RESHARD_LIB_FORMATS_HF_HF_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "lib/core/catalog.h"
#include "lib/core/dtype.h"
#include "lib/formats/format.h"
#include "lib/formats/hf/hf_family.h"
#include "nlohmann/json.hpp"

namespace reshard {

// What the config is made from.
struct HfConfigSources {
  // The args' attributes (StructureNode::Attributes of the Namespace); null without args.
  const StructureNode* args = nullptr;
  const HfFamily* family = nullptr;
  // --config's object; null when not given.
  nlohmann::ordered_json overrides;
  int64_t vocab_size = 0;  // --vocab-size; 0: not given
  bool tied = false;       // the checkpoint has no output layer
  DType dtype = DType::kF32;
};

// config.json, and the figures the export splits tensors by, read back from it.
struct HfModelConfig {
  nlohmann::ordered_json json;
  int64_t hidden = 0;
  int64_t intermediate = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab = 0;
  int64_t positions = 0;  // gpt2: n_positions, the rows of the position embeddings
  int64_t experts = 0;    // mixtral: num_local_experts, the experts of every layer
};

// The ids of a tokenizer's beginning-of-sequence, end-of-sequence and padding tokens; nullopt:
// left out.
struct HfSpecialTokens {
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> eos_token_id;
  std::optional<int64_t> pad_token_id;
};

// The special token ids a tokenizer's files give, `files` being (name, path as the storage layer
// reads it) of the files carried into the output. The token (bos_token, eos_token, pad_token: a
// string or an AddedToken {"content": ...}) is named by tokenizer_config.json and
// special_tokens_map.json; its id is looked up in tokenizer.json (its added_tokens and its
// model's vocab object). An id is given only when unambiguous: the files naming the token name
// the same one, and tokenizer.json gives it exactly one id. Left out otherwise, and both without tokenizer.json (a
// sentencepiece tokenizer.model alone) or when tokenizer.json is over kMaxTokenizerJsonBytes.
// DataLoss naming the file and the byte offset when one of these files is not valid JSON.
absl::StatusOr<HfSpecialTokens> HfSpecialTokenIds(
    const std::vector<std::pair<std::string, std::string>>& files);

// tokenizer.json is read whole (and parsed keeping only the special tokens) up to this size.
inline constexpr uint64_t kMaxTokenizerJsonBytes = 48ull << 20;

// The special token ids of the tokenizer carried into the output, `files` being its whole files
// (as for HfSpecialTokenIds) and `members` those that are members of an archive (a `.nemo`'s).
// With a tokenizer.json: HfSpecialTokenIds of `files`. Else, with a SentencePiece
// tokenizer.model (a file or a member): its trainer_spec's bos_id, eos_id and pad_id (1, 2 and
// -1 when absent; a negative id leaves the token out), ParseSentencePieceModel's DataLoss for a
// damaged model naming the file, or the archive and member, and ResourceExhausted when it is
// over kMaxSentencePieceModelBytes. No ids otherwise.
absl::StatusOr<HfSpecialTokens> HfTokenizerSpecialIds(
    const std::vector<std::pair<std::string, std::string>>& files,
    const std::vector<EmbeddedModelFile>& members);

// A tokenizer.model is read whole up to this size.
inline constexpr uint64_t kMaxSentencePieceModelBytes = 16ull << 20;

// InvalidArgument naming the missing keys (and the args they come from) and --config; naming
// a key of the wrong type; when n_embd is not divisible by n_head (gpt2); when num_attention_heads
// is not divisible by num_key_value_heads; when num_experts_per_tok exceeds num_local_experts
// (mixtral); and when --config contradicts the tensors about
// tie_word_embeddings.
absl::StatusOr<HfModelConfig> MakeHfConfig(const HfConfigSources& sources);

// generation_config.json: {"_from_model_config": true, "bos_token_id", "eos_token_id",
// "pad_token_id" (those config.json has)}.
std::string HfGenerationConfigJson(const nlohmann::ordered_json& config);

// --config FILE read and parsed: InvalidArgument naming the file unless a JSON object.
absl::StatusOr<nlohmann::ordered_json> ReadHfConfigOverrides(const std::string& path);

// The arg `key` of the Namespace's attributes `args`; null when absent or None.
const StructureNode* HfArg(const StructureNode* args, absl::string_view key);

// Whether the arg `key` is set: true, a nonzero integer, or any other value but None.
bool HfArgSet(const StructureNode* args, absl::string_view key);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_HF_HF_CONFIG_H_
