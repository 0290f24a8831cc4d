// Test helpers of the spec codec (spec_codec.h).

#ifndef RESHARD_LIB_ENGINE_SPEC_CODEC_TESTING_H_
#define RESHARD_LIB_ENGINE_SPEC_CODEC_TESTING_H_

#include "lib/engine/conversion.h"

namespace reshard {

// A normalised spec whose every field but rules_file (which normalising empties) differs from
// ConversionSpec's default, so that a round trip that drops a field shows. Not a job
// ValidateSpec passes: its megatron output reads no --vocab-size (ValidSpecWithFieldsSet).
inline ConversionSpec EverySpecFieldSet() {
  ConversionSpec spec;
  spec.kind = ConversionSpec::Kind::kReshard;
  spec.input = "/data/in";
  spec.output = "/data/out";
  spec.dtype = DTypePolicy::kBF16;
  spec.max_shard_size = 123456;
  spec.parts = 4;
  spec.pipeline_parts = 2;
  spec.expert_parts = 2;
  spec.update_latest = true;
  spec.no_extra_files = true;
  spec.tokenizer = "/data/tokenizer";
  spec.rules_json = R"({"rules": [{"pattern": ".*", "replicate": true}]})";
  spec.overwrite = true;
  spec.duplicate_tied = true;
  spec.output_format = "megatron";
  spec.read.tag = "global_step7";
  spec.read.include_optimizer = true;
  spec.hf.family = "qwen2";
  spec.hf.config_file = "/data/config.json";
  spec.hf.vocab_size = 32000;
  spec.threads = 5;
  spec.window_bytes = 1 << 20;
  spec.skip_crc_check = true;
  spec.io = IoMode::kBuffered;
  spec.partition_index = 2;
  spec.partition_count = 3;
  return spec;
}

// EverySpecFieldSet() as a valid job: without hf.vocab_size, which only --format hf reads.
inline ConversionSpec ValidSpecWithFieldsSet() {
  ConversionSpec spec = EverySpecFieldSet();
  spec.hf.vocab_size = 0;
  return spec;
}

}  // namespace reshard

#endif  // RESHARD_LIB_ENGINE_SPEC_CODEC_TESTING_H_
